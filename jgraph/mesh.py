"""The device mesh: one partition per device along one named axis.

This is the one place that names the mesh axis and builds `PartitionSpec`s. Every
sharded array in jgraph is *row-sharded*: its leading dimension is `P * rows_per_part`
and device k of the mesh holds rows `[k * rows_per_part, (k+1) * rows_per_part)`, the
padded block of partition k. Inside `shard_map` a device sees its own block only.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "parts"
"""Name of the mesh axis that partitions lie along."""

ROWS = PartitionSpec(AXIS)
"""Spec of a row-sharded array: leading dimension split over the partitions."""

REPLICATED = PartitionSpec()
"""Spec of an array every device holds whole."""


class MeshError(ValueError):
    """The partitions and the devices do not fit together; the message says how to fix it."""


def make_mesh(num_parts: int | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over `devices` (default: all of them) with axis `AXIS`.

    `num_parts`, when given, must equal the number of devices: jgraph places exactly one
    partition on each device.
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_parts is not None and num_parts != len(devices):
        raise MeshError(device_mismatch_message(num_parts, len(devices)))
    return Mesh(np.array(devices), (AXIS,))


def first_devices(count: int) -> list[jax.Device]:
    """The first `count` devices, for a mesh smaller than the machine (benchmarks)."""
    devices = jax.devices()
    if count > len(devices):
        raise MeshError(f"{count} devices asked for, but JAX has {len(devices)} "
                        f"{jax.default_backend()} device(s); on CPU simulate them with "
                        f"--devices {count} or "
                        f"XLA_FLAGS=--xla_force_host_platform_device_count={count}")
    return devices[:count]


def device_mismatch_message(num_parts: int, num_devices: int, source: str = "the graph") -> str:
    platform = jax.default_backend()
    simulate = (f"run on {num_parts} devices (on CPU, simulate them: --devices {num_parts}, "
                f"or XLA_FLAGS=--xla_force_host_platform_device_count={num_parts})")
    return (f"{source} has {num_parts} partition(s) but the mesh has {num_devices} "
            f"{platform} device(s); jgraph places one partition on each device. Either "
            f"repartition with `jgraph partition ... --num-parts {num_devices}`, or {simulate}")


def check_parts(num_parts: int, mesh: Mesh, source: str = "the graph") -> None:
    """Raise `MeshError` unless `mesh` has exactly one device per partition."""
    if mesh.axis_names != (AXIS,):
        raise MeshError(f"jgraph needs a 1-D mesh with axis {AXIS!r}, got axes "
                        f"{mesh.axis_names}; build it with jgraph.sharded.make_mesh")
    if num_parts != mesh.size:
        raise MeshError(device_mismatch_message(num_parts, mesh.size, source))


def rows_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, ROWS)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, REPLICATED)


def varying_axes(x) -> frozenset:
    """The manual mesh axes x varies over inside `shard_map` (empty outside one). JAX
    0.10 keeps them in the abstract value's `mat.varying`, later versions in `vma`."""
    aval = jax.typeof(x)
    for attr in ("mat", "vma"):
        value = getattr(aval, attr, None)
        if value is not None:
            return frozenset(getattr(value, "varying", value) or ())
    return frozenset()


def vary_like(tree, like):
    """tree's leaves marked varying over the manual mesh axes `like` varies over (under
    `shard_map`), where they do not already: a replicated value cast once, so that its
    gradient is summed over devices once, where it was cast."""
    axes = varying_axes(like)

    def cast(x):
        missing = tuple(sorted(axes - varying_axes(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)


def local_parts(mesh: Mesh) -> list[int]:
    """The partitions whose devices belong to this process, in mesh order."""
    mine = {d.id for d in mesh.local_devices}
    return [k for k, d in enumerate(mesh.devices.flat) if d.id in mine]


# -- host-side agreement between the processes of a job (each a no-op in one process) --

def host_sync(name: str) -> None:
    """Wait until every process of the job reaches the barrier `name`."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def _gathered(value) -> np.ndarray:
    """Every process's `value` (a host scalar), one row per process."""
    if jax.process_count() == 1:
        return np.array([value])
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.array([value])))


def all_processes(ok: bool) -> bool:
    """True only if `ok` on every process (every process must call it)."""
    return bool(np.all(_gathered(bool(ok))))


def max_over_processes(value: int) -> int:
    """The largest of every process's `value` (every process must call it)."""
    return int(np.max(_gathered(np.int32(value))))


def shard_rows(mesh: Mesh, rows_per_part: int, row_shape: tuple[int, ...], dtype,
               load: Callable[[int], np.ndarray], fill=0) -> jax.Array:
    """A row-sharded array built from per-partition blocks.

    `load(k)` returns partition k's rows (at most `rows_per_part` of them); they are
    padded with `fill` to `rows_per_part`. It is called only for the partitions of this
    process's devices, so each host reads only its own partitions.
    """
    num_parts = mesh.size
    shape = (num_parts * rows_per_part, *row_shape)
    cache: dict[int, np.ndarray] = {}

    def block(index) -> np.ndarray:
        start = index[0].start or 0
        k = start // rows_per_part
        if k not in cache:
            rows = np.asarray(load(k), dtype=dtype)
            if rows.shape[1:] != tuple(row_shape) or rows.shape[0] > rows_per_part:
                raise MeshError(f"partition {k}: block of shape {list(rows.shape)} does not "
                                f"fit [{rows_per_part}, {', '.join(map(str, row_shape))}]")
            padded = np.full((rows_per_part, *row_shape), fill, dtype=dtype)
            padded[:rows.shape[0]] = rows
            cache[k] = padded
        return cache[k]

    return jax.make_array_from_callback(shape, rows_sharding(mesh), block)


def struct_on(mesh: Mesh, spec, shape, dtype) -> jax.ShapeDtypeStruct:
    """An array's shape and dtype, placed on `mesh` by `spec` (`ROWS`, `REPLICATED`):
    what a program is built from without the array."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def replicate(mesh: Mesh, value: np.ndarray) -> jax.Array:
    """A host array placed whole on every device of `mesh`."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, replicated(mesh), lambda index: value[index])
