"""Compile targets: build a program for hardware this machine does not have.

XLA compiles for an NVIDIA GPU without one ("deviceless compilation"): given a target
description (`GpuTargetConfigProto`: compute capability, SM count, memory), the whole
XLA:GPU pipeline runs, Pallas kernels included (Triton -> PTX -> ptxas), and the
compiled program reports its per-device memory. jgraph uses it so that a CPU-only
machine (CI, a laptop) builds exactly the program an H100 runs, and so that a job can be
sized before anyone rents the GPUs (`jgraph compile`).

What it needs: the CUDA compiler plugin matching the installed jax (the `gpu-compile`
extra), and JAX started on the CPU platform (`JAX_PLATFORMS=cpu`; XLA cannot describe a
CUDA topology from the CUDA backend without GPUs).

`target_mesh(target, n)` is a mesh of n devices of that target (CPU: simulated host
devices); `abstract_like(tree, specs, mesh)` places argument shapes on it;
`Analysis.of(compiled)` reads what a compiled program holds.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import importlib.resources
import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jgraph.cost import Peaks
from jgraph.mesh import AXIS, first_devices

GPU_DEVICES_PER_HOST = 8     # DGX / HGX hosts


class Target(str, enum.Enum):
    """What to compile for: this machine's CPU devices, or an NVIDIA H100 / H200 (SXM,
    sm_90, 132 SMs; 80 GB and 141 GB)."""

    CPU = "cpu"
    H100 = "h100"
    H200 = "h200"

    @property
    def is_gpu(self) -> bool:
        return self is not Target.CPU

    @property
    def memory_bytes(self) -> int | None:
        """Device memory of one device of the target (None: the host's)."""
        if not self.is_gpu:
            return None
        m = re.search(r"device_memory_size:\s*(\d+)", target_config(self))
        return int(m[1])


    @property
    def peaks(self) -> Peaks | None:
        """Published peak rates of one device (None for the CPU: this machine's)."""
        return PEAKS.get(self)


# NVIDIA's H100 SXM and H200 SXM datasheets (dense, no sparsity); hosts of 8 GPUs on
# NVLink 4 (900 GB/s both ways); between hosts one 400 Gb/s InfiniBand NDR adapter per
# GPU, as in DGX H100 / HGX clusters (an assumption: name another with `Peaks`).
_HOPPER_FLOPS = {"bf16": 989e12, "tf32": 495e12, "f32": 67e12}
_NDR = "400 Gb/s InfiniBand NDR per GPU (50 GB/s)"
PEAKS = {
    Target.H100: Peaks(_HOPPER_FLOPS, memory=3.35e12, intra_host=450e9, inter_host=50e9,
                       per_host=GPU_DEVICES_PER_HOST, network=_NDR),
    Target.H200: Peaks(_HOPPER_FLOPS, memory=4.8e12, intra_host=450e9, inter_host=50e9,
                       per_host=GPU_DEVICES_PER_HOST, network=_NDR),
}


class TargetError(RuntimeError):
    """A target cannot be compiled for here; the message says what to install or set."""


def target_config(target: Target) -> str:
    """The `GpuTargetConfigProto` (text format) of a GPU target, shipped with jgraph."""
    return (importlib.resources.files("jgraph") / "targets" / f"{target.value}.txtpb").read_text()


def target_mesh(target: Target, devices: int) -> Mesh:
    """A 1-D mesh (axis `AXIS`) of `devices` devices of `target`.

    GPU targets are described, not present: hosts of 8 GPUs each (as DGX/HGX nodes), so
    a 64-device mesh is 8 hosts. The program compiled for this mesh is the one those
    GPUs run. CPU: the first `devices` local devices (simulated on CPU-only machines).
    """
    if devices < 1:
        raise ValueError(f"a mesh needs at least one device, got {devices}")
    if not target.is_gpu:
        return Mesh(np.array(first_devices(devices)), (AXIS,))
    check_gpu_compiler()
    from jax.experimental import topologies
    hosts = -(-devices // GPU_DEVICES_PER_HOST)
    per_host = devices if hosts == 1 else GPU_DEVICES_PER_HOST
    if hosts * per_host != devices:
        raise ValueError(f"{devices} {target.value} devices do not fill hosts of "
                         f"{GPU_DEVICES_PER_HOST}; give a multiple of {GPU_DEVICES_PER_HOST} "
                         f"above {GPU_DEVICES_PER_HOST}")
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", topology=f"1x{hosts}x{per_host}",
            target_config=target_config(target))
    except Exception as err:   # XLA raises several kinds; say what to do about each
        raise TargetError(f"cannot describe {devices} {target.value} device(s): {err}. "
                          f"Start JAX on the CPU (JAX_PLATFORMS=cpu) to compile for a GPU "
                          f"target") from err
    return topologies.make_mesh(topology, (devices,), (AXIS,))


def check_gpu_compiler() -> None:
    """Raise `TargetError` unless the CUDA compiler plugin is installed."""
    try:
        import jax_plugins.xla_cuda12
    except ImportError:
        try:
            import jax_plugins.xla_cuda13  # noqa: F401
        except ImportError:
            raise TargetError(
                "compiling for a GPU target needs the CUDA compiler plugin matching "
                f"jax {jax.__version__}: pip install 'jgraph[gpu-compile]' (or "
                f"jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__} "
                "nvidia-cuda-nvcc-cu12)") from None


def abstract_like(tree, specs, mesh: Mesh):
    """`tree` (arrays or shape structs) as `ShapeDtypeStruct`s placed on `mesh` by the
    matching `PartitionSpec`s of `specs` (a prefix tree of `tree`)."""
    def place(spec, sub):
        sharding = NamedSharding(mesh, spec)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                            sub)
    return jax.tree.map(place, specs, tree,
                        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


# Collective ops by their HLO name; GPU schedules most as asynchronous start/done pairs.
COLLECTIVES = ("all-to-all", "ragged-all-to-all", "all-gather", "all-reduce",
               "reduce-scatter", "collective-permute", "collective-broadcast")
# An instruction's op name follows its result type, never a `%` (that is an instruction's
# own name, like %all-to-all.3).
_OP = re.compile(r"(?<![%\w.-])(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True))
                 + r")(?:-start)?\(")
# A Pallas kernel on GPU is a custom call to Triton (or to Mosaic GPU).
_KERNEL = re.compile(r'custom_call_target="(__gpu\$xla\.gpu\.triton|mosaic_gpu[^"]*)"')


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What a compiled program holds, per device.

      argument_bytes, output_bytes, temp_bytes: its buffers (arguments and outputs may
        alias when they are donated: `alias_bytes`).
      pallas_kernels: Pallas kernel calls in the optimised program (0 on CPU, where the
        kernels run as XLA code in interpret mode).
      collectives: {HLO collective name: count}.
      hlo_bytes: size of the optimised program's text, a measure of how much XLA built.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    pallas_kernels: int
    collectives: dict
    hlo_bytes: int

    @classmethod
    def of(cls, compiled) -> Analysis:
        text = compiled.as_text()
        mem = compiled.memory_analysis()
        ops = collections.Counter(m[1] for m in _OP.finditer(text))
        return cls(argument_bytes=int(mem.argument_size_in_bytes),
                   output_bytes=int(mem.output_size_in_bytes),
                   temp_bytes=int(mem.temp_size_in_bytes),
                   alias_bytes=int(mem.alias_size_in_bytes),
                   pallas_kernels=len(_KERNEL.findall(text)),
                   collectives=dict(sorted(ops.items())), hlo_bytes=len(text))

    @property
    def peak_bytes(self) -> int:
        """Arguments, outputs not aliased to them, and temporaries: what must fit."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
