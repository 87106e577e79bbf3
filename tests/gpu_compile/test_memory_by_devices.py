"""Per-device memory follows the per-device work, never the device count (DESIGN.md,
principle 6): the same per-device graph and batch, built for 2, 4 and 8 H100s from
counts (`jgraph compile --abstract`), needs the same temporary buffers: the training
step with every exchange strategy; sampled evaluation, full-graph inference and link
prediction's training step with the default one. (Before the exchange was sized by what
arrives, all_to_all's and ragged_all_to_all's buffers held P x the request.)"""
from pathlib import Path

import pytest

from jgraph.config import load
from jgraph.exchange import Strategy
from jgraph.target import Target
from jgraph.train.abstract import compile_abstract
from jgraph.train.compile import Program
from jgraph.train.experiment import Experiment

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SYNTHETIC = str(EXPERIMENTS / "sage_synthetic.yaml")
LINK = str(EXPERIMENTS / "lp_sage_facebook.yaml")
# Known defect, kept visible: the scheduled strategy's training step grows by ~1% per
# doubling of the devices (1.384 -> 1.392 -> 1.399 MB for 2, 4, 8 H100s). XLA's buffer
# assignment gives each round's ppermute (a branch of a P - 1 way switch) buffers of its
# own: one chunk of ids and of answers each (a chunk is ~1/8 of the mean pair's load,
# so together about an eighth of the request whatever P, but each rounded up to 8 ids),
# and a few scalars and tuples. strict: the test fails once that is fixed.
STRATEGIES = [pytest.param(s.value, marks=pytest.mark.xfail(
                  strict=True, reason="scheduled: buffers of its own for each round's "
                                      "ppermute (P - 1 rounds)"))
              if s is Strategy.SCHEDULED else s.value
              for s in Strategy if s is not Strategy.AUTO]
# Every strategy at 2 and 8 devices; the GPU's default (ragged_all_to_all) at 4 too.
DEVICE_COUNTS = {Strategy.RAGGED.value: (2, 4, 8)}

pytestmark = [pytest.mark.gpu_compile, pytest.mark.slow]

# 3M nodes and 30M in-edges per device: large enough that the sampler deduplicates by
# sorting at every device count (a dense [num_nodes] table would follow the graph).
PER_DEVICE_NODES, PER_DEVICE_EDGES = 3_000_000, 30_000_000
# Capacities are multiples of 8 ids: P x (n / P rounded up to 8) moves by a few rows.
ROUNDING = 0.01


# Two sampled hops for the training step; one for the other programs (quicker to build).
TWO_HOPS = ("model.num_layers=2", "train.fanouts=[5,5]", "train.eval_fanouts=[5,5]")
ONE_HOP = ("model.num_layers=1", "train.fanouts=[3]", "train.eval_fanouts=[3]")


def temp_bytes(devices: int, config_file: str, program: Program, *overrides: str) -> int:
    """Per-device temporaries of `program` of `config_file` on `devices` devices of
    PER_DEVICE_NODES nodes and PER_DEVICE_EDGES edges each, batches of 64."""
    spec = (f"synthetic:nodes={devices * PER_DEVICE_NODES},"
            f"edges={devices * PER_DEVICE_EDGES},feat=16,classes=5")
    config = load(Experiment, config_file, [
        f"data.path={spec}", "data.symmetrize=false", "train.batch_size=64",
        "train.eval_batch_size=64", *overrides])
    report = compile_abstract(config, Target.H100, devices, program=program)
    assert report["ok"], report.get("error")
    assert report["nodes_per_device"] == round(PER_DEVICE_NODES * 1.05)
    return report["temp_bytes"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_temp_bytes_do_not_grow_with_the_device_count(strategy):
    temps = {devices: temp_bytes(devices, SYNTHETIC, Program.TRAIN, *TWO_HOPS,
                                 f"exchange.strategy={strategy}")
             for devices in DEVICE_COUNTS.get(strategy, (2, 8))}
    # More devices need no more than the fewest (XLA's buffer assignment of the ring's
    # P - 1 shifts moves the figures by about 1%, either way).
    for temp in temps.values():
        assert temp <= temps[2] * (1 + ROUNDING), temps


@pytest.mark.parametrize("config_file,program", [
    (SYNTHETIC, Program.EVAL), (SYNTHETIC, Program.FULL_GRAPH), (LINK, Program.TRAIN)])
def test_evaluation_inference_and_link_prediction_do_not_grow_with_the_device_count(
        config_file, program):
    """The default (ragged) exchange, with the same share of each request remote at
    every device count (the estimate's default, a random partition's (P - 1) / P,
    grows with P, and sampled evaluation's receive buffers with it)."""
    temps = {devices: temp_bytes(devices, config_file, program, *ONE_HOP, "exchange.cut=0.5")
             for devices in (2, 8)}
    assert temps[8] <= temps[2] * (1 + ROUNDING), temps
