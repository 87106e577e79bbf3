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
# doubling of the devices (1.384 -> 1.399 MB from 2 to 8 H100s; a buffer per round of
# its schedule, which has about P rounds). strict: the test fails once that is fixed.
STRATEGIES = [pytest.param(s.value, marks=pytest.mark.xfail(
                  strict=True, reason="scheduled: a buffer per schedule round (~P rounds)"))
              if s is Strategy.SCHEDULED else s.value
              for s in Strategy if s is not Strategy.AUTO]

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
                                 f"exchange.strategy={strategy}") for devices in (2, 4, 8)}
    # The most devices need no more than the fewest (XLA's buffer assignment of the
    # ring's P - 1 shifts moves the figures in between by about 1%, either way).
    assert temps[8] <= temps[2] * (1 + ROUNDING), temps


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
