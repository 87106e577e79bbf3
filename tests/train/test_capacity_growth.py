"""A training step whose sample needs more than the calibrated capacities is refused
on the device and run again by the host with more room: the run logs every step once,
with the same losses as a run at the worst-case capacities, and counts the compiles."""
import dataclasses
import json
from pathlib import Path

import pytest

from jgraph.config import load
from jgraph.progress import Progress
from jgraph.train import loop
from jgraph.train.experiment import Experiment

pytestmark = pytest.mark.slow     # runs that recompile

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# One device, five steps per epoch: a growth must rewind mid-epoch.
SMALL = ["data.num_parts=1", "train.epochs=2", "train.batch_size=32", "exchange.max_rungs=1"]


def steps(workdir):
    return [json.loads(line) for line in (workdir / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def worst_case(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("worst")
    config = load(Experiment, EXPERIMENT, SMALL + ["train.calibrate_capacities=false"])
    return workdir, loop.train_and_evaluate(config, str(workdir), Progress(enabled=False))


def test_steps_refused_for_their_capacities_are_run_again_with_the_same_losses(
        worst_case, tmp_path, monkeypatch):
    ref_dir, ref = worst_case
    assert ref["capacities"] == [] and ref["capacity_growths"] == []

    def tiny(run, progress):          # far below what cora's frontiers need
        job = run.job
        return dataclasses.replace(job, sampler=dataclasses.replace(
            job.sampler, capacities=(40, 48)))
    monkeypatch.setattr(loop, "calibrated_job", tiny)
    config = load(Experiment, EXPERIMENT, SMALL)
    result = loop.train_and_evaluate(config, str(tmp_path), Progress(enabled=False))
    growths = result["capacity_growths"]
    assert growths and growths[0]["step"] == 1
    assert result["compiles"] == 1 + len(growths)
    assert result["capacities"] == growths[-1]["capacities"]
    got, want = steps(tmp_path), steps(ref_dir)
    assert [r["step"] for r in got] == list(range(1, len(want) + 1))
    for a, b in zip(got, want):
        assert (a["count"], a["correct"]) == (b["count"], b["correct"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert result["test_acc"] == ref["test_acc"]

