"""What a compiled step costs, and the least time it can take on given hardware.

`Costs.of(compiled)` reads a compiled program (for any target, GPU programs built
without a GPU included): XLA's cost analysis of the optimised program (floating-point
operations and bytes accessed, per device) and the bytes its collectives deliver to
each device, by kind. `roofline(costs, peaks, ...)` turns them into a lower bound of
the step's time: no step can be faster than its flops at the peak rate or its
collective traffic over the links, whichever is slower. It is a bound, not a
prediction: kernels do not reach peak, and the terms overlap only in part.

How the program is read: XLA's `HloCostAnalysis` counts a conditional as its costliest
branch and a loop's body once; collectives are counted the same way from the program's
text (an exchange's capacity rungs are `lax.switch` branches: the largest one counts,
and a transfer's later rounds, when a batch needs them, are not counted). A collective
delivers its result: an all_gather's [P x n] rows, an all_to_all's P blocks, a
ragged_all_to_all's receive buffer (the device's own share included).
"""
from __future__ import annotations

import dataclasses
import functools
import re

import jax

# An HLO computation opens with its name and signature and ends with a lone "}".
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_CALLS = re.compile(r"\b(?:calls|body|condition|true_computation|false_computation)="
                    r"%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_ARRAY = re.compile(r"\b(pred|[su](?:4|8|16|32|64)|f8e\w+|bf16|f16|f32|f64|c64|c128)"
                    r"\[([\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16, "f16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128}
COLLECTIVES = ("all-to-all", "ragged-all-to-all", "all-gather", "all-reduce",
               "reduce-scatter", "collective-permute", "collective-broadcast")
# "= <result type> <op>(" with the op a collective, synchronous or the start of an
# asynchronous pair (whose result is a tuple of its operands and its result).
_COLLECTIVE = re.compile(r"=\s*(.*?)\s(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True))
                         + r")(-start)?\(")


def _array_bytes(dtype: str, dims: str) -> int:
    bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype) or 8)
    count = 1
    for d in filter(None, dims.split(",")):
        count *= int(d)
    return count * max(bits, 8) // 8


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """{collective kind: bytes it delivers to each device in one run of the program}
    from an HLO module's text: conditionals count their costliest branch, loop bodies
    once (see the module doc)."""
    bodies: dict[str, list[str]] = {}
    entry, name = None, None
    for line in hlo_text.splitlines():
        opened = None if line[:1].isspace() else _COMPUTATION.match(line)
        if opened:
            name = opened[2]
            bodies[name] = []
            if opened[1]:
                entry = name
        elif line.strip() == "}":
            name = None
        elif name is not None:
            bodies[name].append(line)

    @functools.cache
    def cost(computation: str) -> tuple[tuple[str, int], ...]:
        total: dict[str, int] = {}

        def add(more):
            for kind, b in more:
                total[kind] = total.get(kind, 0) + b
        for line in bodies.get(computation, ()):
            op = _COLLECTIVE.search(line)
            if op:
                sizes = [_array_bytes(*a) for a in _ARRAY.findall(op[1])]
                # An async start's tuple holds its operands too: the result is the largest.
                add([(op[2], (max(sizes) if op[3] else sum(sizes)) if sizes else 0)])
            branches = _BRANCHES.search(line)
            if branches:
                options = [cost(b.strip().lstrip("%")) for b in branches[1].split(",")]
                add(max(options, key=lambda o: sum(b for _, b in o)))
            for called in _CALLS.findall(line):
                add(cost(called))
        return tuple(sorted(total.items()))

    return dict(cost(entry)) if entry is not None else {}


@dataclasses.dataclass(frozen=True)
class Costs:
    """Per device, one run of a compiled program.

      flops: floating-point operations; bytes_accessed: bytes read and written by its
        operations (XLA's cost analysis of the optimised program; None where this JAX
        cannot analyse it).
      collective_bytes: {HLO collective kind: bytes delivered to the device}.
    """

    flops: float | None
    bytes_accessed: float | None
    collective_bytes: dict

    @classmethod
    def of(cls, compiled) -> Costs:
        analysis = _cost_analysis(compiled)
        return cls(flops=analysis.get("flops"), bytes_accessed=analysis.get("bytes accessed"),
                   collective_bytes=collective_bytes(compiled.as_text()))

    @property
    def network_bytes(self) -> int:
        return sum(self.collective_bytes.values())


def _cost_analysis(compiled) -> dict:
    """XLA's `HloCostAnalysis` of the optimised program. A program compiled for a GPU
    on a machine without one has no client to ask, so the analysis of its module runs
    on the CPU client (the figures are the module's, whichever client counts them)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else None
    if analysis:
        return dict(analysis)
    try:
        from jax._src.lib import xla_client
        module = compiled.runtime_executable().hlo_modules()[0]
        client = jax.devices("cpu")[0].client
        return dict(xla_client._xla.hlo_module_cost_analysis(client, module))
    except Exception:    # private API: where it moved, the figures are unknown, not wrong
        return {}


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Published peak rates of one device of a target, per second.

      flops: {compute dtype: dense floating-point operations} ("bf16", "tf32", "f32").
      memory: memory bandwidth in bytes.
      intra_host: bytes each way to devices of the same host (NVLink).
      inter_host: bytes each way to devices of other hosts (the network adapter each
        device has: an assumption about the cluster, stated in `network`).
      per_host: devices in one host.
      network: the inter-host link assumed, in words.
    """

    flops: dict
    memory: float
    intra_host: float
    inter_host: float
    per_host: int
    network: str


def roofline(costs: Costs, peaks: Peaks, devices: int, compute: str,
             steps_per_epoch: int) -> dict:
    """A lower bound of one step's and one epoch's time: the larger of the step's flops
    at the peak of `compute` ("bf16", or "tf32" for float32 matmuls) and its collective
    bytes over the links (the share from other hosts, (P - per_host) / (P - 1) of the
    peers when the job spans several hosts, at the inter-host rate; the rest over
    NVLink); `bound_by` names the larger.

    The memory term, bytes accessed at the memory's bandwidth, is reported beside it
    but left out of the bound: XLA's analysis counts the whole operand of some fused
    gathers and in-place updates (a partition's edge list, read a few rows at a time),
    so it can exceed the real traffic. Figures the analysis did not give count as 0."""
    peers = max(devices - 1, 1)
    remote = max(devices - peaks.per_host, 0) / peers
    network = costs.network_bytes
    terms = {
        "compute": (costs.flops or 0.0) / peaks.flops[compute],
        "network": max(network * (1 - remote) / peaks.intra_host,
                       network * remote / peaks.inter_host),
    }
    step = max(terms.values())
    return {"lower_bound": True, "compute_dtype": compute,
            **{f"{k}_seconds": v for k, v in terms.items()},
            "memory_seconds_estimate": (costs.bytes_accessed or 0.0) / peaks.memory,
            "step_seconds_lower_bound": step, "steps_per_epoch": steps_per_epoch,
            "epoch_seconds_lower_bound": step * steps_per_epoch,
            "bound_by": max(terms, key=terms.get), "inter_host_link": peaks.network}
