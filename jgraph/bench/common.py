"""What every benchmark does first: load GRAPH, partition it, open it on the mesh; and
what it checks before running a program: that the memory it needs is there."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

import jax

from jgraph.data import DatasetError
from jgraph.data.prepare import HeldOut
from jgraph.jobs.dataset import data_preparation, is_partition_dir, open_data
from jgraph.jobs.experiment import DataConfig
from jgraph.mesh import first_devices
from jgraph.partition import PartitionMeta
from jgraph.partition.store import read_meta
from jgraph.progress import Progress
from jgraph.sharded import DistGraph, make_mesh


@contextlib.contextmanager
def partition_on_mesh(data: DataConfig, *, seed: int, bench: str, progress: Progress,
                      node_data: tuple[str, ...] = (), splits: tuple[str, ...] = (),
                      held_out: HeldOut | None = None
                      ) -> Iterator[tuple[PartitionMeta, DistGraph]]:
    """`data.path` prepared and partitioned as training does it (`jgraph.jobs.dataset.
    open_data`: data's preparation, and link prediction's `held_out` edges) into
    `data.num_parts`, opened on a mesh of the first `data.num_parts` devices; a
    partition directory as it is.

    A context manager yielding (meta, dist_graph); a partition it wrote lives until it
    exits. The graph must be homogeneous with every array of `node_data` and a
    non-empty split of each name in `splits`, else DatasetError names `bench` and what
    it needs.
    """
    num_parts = data.num_parts
    mesh = make_mesh(num_parts, first_devices(num_parts))
    asked = dataclasses.replace(data_preparation(data), held_out=held_out)
    if is_partition_dir(data.path) and read_meta(data.path).num_parts != num_parts:
        raise DatasetError(f"{data.path}: holds {read_meta(data.path).num_parts} partitions, "
                           f"data.num_parts is {num_parts}; they must match")
    with tempfile.TemporaryDirectory(prefix="jgraph-bench-") as tmp:
        dg = open_data(data, asked, mesh, tmp, progress, seed=seed, check_seeds=False)
        meta = dg.meta
        t = meta.node_types[0]
        missing = [n for n in node_data if n not in meta.node_data.get(t, {})]
        if len(meta.node_types) != 1 or missing:
            wanted = f" with node data {list(node_data)}" if node_data else ""
            raise DatasetError(f"{data.path}: jgraph bench {bench} needs a homogeneous "
                               f"graph{wanted}" + (f"; missing {missing}" if missing else ""))
        counts = {s: sum(p.splits.get(t, {}).get(s, 0) for p in meta.parts) for s in splits}
        if not all(counts.values()):
            raise DatasetError(f"{data.path}: jgraph bench {bench} needs a non-empty "
                               f"{'/'.join(splits)} split; the graph has {counts}")
        yield meta, dg


# -- memory ------------------------------------------------------------------------------

# Where a container's memory limit is (cgroup v2, v1), with the usage counted against it.
_CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                   "/sys/fs/cgroup/memory.stat", "inactive_file"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                   "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                   "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"))


def _read_fields(path: str) -> dict[str, int]:
    """'name value' lines (memory.stat; /proc/meminfo, whose values are kB)."""
    out = {}
    with open(path) as f:
        for line in f:
            name, value, *_ = line.replace(":", " ").split()
            out[name] = int(value)
    return out


def available_memory_bytes() -> int:
    """Bytes this process can still allocate without the kernel killing it, now.

    /proc/meminfo's MemAvailable: free memory plus the caches the kernel can drop
    (MemTotal would count memory that this and other processes already hold). Lowered
    to what a container's cgroup limit leaves (its usage less the file cache it can
    drop). Without /proc/meminfo: the free physical pages.
    """
    try:
        available = _read_fields("/proc/meminfo")["MemAvailable"] * 1024
    except (OSError, KeyError, ValueError):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_path, usage_path, stat_path, cache in _CGROUP_LIMITS:
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            if limit == "max" or int(limit) >= 2**60:          # no limit set
                continue
            with open(usage_path) as f:
                usage = int(f.read())
            usage -= _read_fields(stat_path).get(cache, 0)
            available = min(available, int(limit) - usage)
        except (OSError, ValueError):
            continue
    return max(available, 0)


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"


class Shortage(NamedTuple):
    """A program that would not fit: the bytes it needs, those available and where."""

    need: int
    available: int
    where: str

    def fields(self, what: str, hint: str) -> dict:
        """The fields of a benchmark line that skips `what` for lack of memory."""
        return {"skipped": f"{what} needs {format_bytes(self.need)} ({self.need:,} bytes) of "
                           f"{self.where} but only {format_bytes(self.available)} "
                           f"({self.available:,} bytes) is available; {hint}",
                "need_bytes": self.need, "available_bytes": self.available}


def device_bytes(compiled, arguments_allocated: bool) -> int:
    """Bytes one device holds while `compiled` runs, by XLA's count: its temporaries
    (sized for the largest branch of a `lax.switch`, whichever runs), its outputs not
    aliased to donated arguments, and the arguments unless they exist already."""
    m = compiled.memory_analysis()
    return (int(m.temp_size_in_bytes) + int(m.output_size_in_bytes)
            - int(m.alias_size_in_bytes) + int(m.generated_code_size_in_bytes)
            + (0 if arguments_allocated else int(m.argument_size_in_bytes)))


def memory_shortage(compiled, devices: list, *, arguments_allocated: bool,
                    host_extra: int = 0) -> Shortage | None:
    """None if one call of `compiled` on `devices` fits in the memory available now.

    Simulated CPU devices share this host's memory and run together, so each one's
    `device_bytes` count, plus `host_extra` (what the caller holds beside, e.g. to check
    the answers). An accelerator's devices each have their own memory: each must have
    `device_bytes` free. Backends that report no memory figures are not checked.
    """
    try:
        per_device = device_bytes(compiled, arguments_allocated)
    except (AttributeError, TypeError, NotImplementedError, jax.errors.JaxRuntimeError):
        return None                                 # the backend does not say
    if devices[0].platform == "cpu":
        need, available = len(devices) * per_device + host_extra, available_memory_bytes()
        where = f"this host's memory for {len(devices)} simulated device(s)"
    else:
        stats = [d.memory_stats() for d in devices]
        if not all(s and "bytes_limit" in s for s in stats):
            return None
        need = per_device
        available = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
        where = f"each {devices[0].platform} device's memory"
    return Shortage(need, available, where) if need > available else None
