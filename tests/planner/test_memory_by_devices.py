"""Per-device memory follows the per-device work, never the device count (DESIGN.md,
principle 6): the same per-device graph and batch, built for 2, 4 and 8 H100s from
counts (`jgraph compile --abstract`), needs the same temporary buffers: the training
step with every exchange strategy; sampled evaluation, full-graph inference and link
prediction's training step with the default one. (Before the exchange was sized by what
arrives, all_to_all's and ragged_all_to_all's buffers held P x the request.) These are
also the GPU builds of each strategy's step, with the collectives it should hold."""
from pathlib import Path

import pytest

from jgraph.config import load
from jgraph.exchange import Strategy
from jgraph.exchange.relay import ROUTE_MAX
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.programs import Program
from jgraph.planner.compile import compile_abstract
from jgraph.target import Target

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SYNTHETIC = str(EXPERIMENTS / "sage_synthetic.yaml")
LINK = str(EXPERIMENTS / "lp_sage_facebook.yaml")
STRATEGIES = [s.value for s in Strategy if s is not Strategy.AUTO]
# Every strategy at 2 and 8 devices (all_to_all's gathers go straight at 2 and relay at
# 8); the GPU's default (ragged_all_to_all) at 4 too.
DEVICE_COUNTS = {Strategy.RAGGED.value: (2, 4, 8)}

pytestmark = [pytest.mark.gpu_compile, pytest.mark.slow]

# 3M nodes and 30M in-edges per device: large enough that the sampler deduplicates by
# sorting at every device count (a dense [num_nodes] table would follow the graph).
PER_DEVICE_NODES, PER_DEVICE_EDGES = 3_000_000, 30_000_000
# Capacities are multiples of 8 ids: P x (n / P rounded up to 8) moves by a few rows.
ROUNDING = 0.01
# What each further peer may add: the scalars, counts and tuple headers of its transfer
# (the ring's shift, the scheduled strategy's round), each in a 256-byte-aligned slot of
# XLA:GPU's buffer assignment. O(P) integers, like a [P] count vector, not O(P) rows.
# Measured: 2.7 KB a peer for the ring on JAX 0.11, 2.5 KB a round for the scheduled
# strategy on JAX 0.10 (where each round's ppermute gets a chunk buffer of its own; the
# chunks of all rounds together hold about an eighth of the request whatever P). A
# per-peer buffer of rows would not pass: one shift of the ring holds 208 ids and their
# 16-float rows, 13 KB.
PER_PEER_BYTES = 4096


# Two sampled hops for the training step; one for the other programs (quicker to build).
TWO_HOPS = ("model.num_layers=2", "train.fanouts=[5,5]", "train.eval_fanouts=[5,5]")
ONE_HOP = ("model.num_layers=1", "train.fanouts=[3]", "train.eval_fanouts=[3]")


def compiled(devices: int, config_file: str, program: Program, *overrides: str) -> dict:
    """The `jgraph compile --abstract` report of `program` of `config_file` on
    `devices` devices of PER_DEVICE_NODES nodes and PER_DEVICE_EDGES edges each,
    batches of 64, half of each request remote: the same per-device work at every
    device count. (The estimate's
    default share, a random partition's (P - 1) / P, grows with P, and the exchange's
    receive buffers with it, up to the whole request.)"""
    spec = (f"synthetic:nodes={devices * PER_DEVICE_NODES},"
            f"edges={devices * PER_DEVICE_EDGES},feat=16,classes=5")
    config = load(Experiment, config_file, [
        f"data.path={spec}", "data.symmetrize=false", "train.batch_size=64",
        "train.eval_batch_size=64", "exchange.cut=0.5", *overrides])
    report = compile_abstract(config, Target.H100, devices, program=program)
    assert report["ok"], report.get("error")
    assert report["nodes_per_device"] == round(PER_DEVICE_NODES * 1.05)
    return report


def temp_bytes(devices: int, config_file: str, program: Program, *overrides: str) -> int:
    """Per-device temporaries of `program` (`compiled`)."""
    return compiled(devices, config_file, program, *overrides)["temp_bytes"]


# The collectives each strategy's training step compiles to on GPU, besides the
# all-reduces of its statistics and gradients (ragged_all_to_all's all_to_all moves each
# device's [P] counts and offsets; the relay all-gathers them: `RELAY_COLLECTIVES`).
STRATEGY_COLLECTIVES = {"all_to_all": {"all-to-all"},
                        "ragged_all_to_all": {"ragged-all-to-all", "all-to-all"},
                        "all_gather": {"all-gather", "reduce-scatter"},
                        "ppermute": {"collective-permute"},
                        "scheduled": {"collective-permute"}}
RELAY_COLLECTIVES = {"all-to-all", "all-gather"}


def collectives(strategy: str, devices: int) -> set[str]:
    """What `STRATEGY_COLLECTIVES` says, and the relay's where all_to_all relays."""
    relays = strategy == "all_to_all" and 2 < devices <= ROUTE_MAX
    return STRATEGY_COLLECTIVES[strategy] | (RELAY_COLLECTIVES if relays else set())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_temp_bytes_do_not_grow_with_the_device_count(strategy):
    """Every strategy's training step builds for H100s, with its own collectives and a
    draw kernel per sampled hop (one more at most in the rounds loop of each transfer
    of the remote hop: never one per capacity rung)."""
    reports = {devices: compiled(devices, SYNTHETIC, Program.TRAIN, *TWO_HOPS,
                                 f"exchange.strategy={strategy}")
               for devices in DEVICE_COUNTS.get(strategy, (2, 8))}
    for devices, report in reports.items():
        assert set(report["collectives"]) - {"all-reduce"} == collectives(strategy, devices)
        transfers = devices - 1 if strategy in ("ppermute", "scheduled") else 1
        assert 2 <= report["pallas_kernels"] <= 2 + transfers, report["pallas_kernels"]
    temps = {devices: report["temp_bytes"] for devices, report in reports.items()}
    # More devices need no more than the fewest, but for O(P) integers (the relay's
    # buffers included: 1.394 MB at 8 devices, against 1.385 MB going straight at 2).
    for devices, temp in temps.items():
        assert temp <= temps[2] * (1 + ROUNDING) + (devices - 2) * PER_PEER_BYTES, temps


@pytest.mark.parametrize("config_file,program", [
    (SYNTHETIC, Program.EVAL), (SYNTHETIC, Program.FULL_GRAPH), (SYNTHETIC, Program.SMOOTH),
    (LINK, Program.TRAIN)])
def test_evaluation_inference_and_link_prediction_do_not_grow_with_the_device_count(
        config_file, program):
    """The default (ragged) exchange; Correct & Smooth's propagations too."""
    temps = {devices: temp_bytes(devices, config_file, program, *ONE_HOP)
             for devices in (2, 8)}
    assert temps[8] <= temps[2] * (1 + ROUNDING), temps
