"""A training step whose sample needs more than the calibrated capacities is refused
on the device and run again by the host with more room: the run logs every step once,
with the same losses as a run at the worst-case capacities, and counts the compiles.
The exchange's calibrated capacities likewise: set far too low on purpose, gathers take
more rounds and embedding gradients that do not fit refuse the step, the capacities
grow, and the losses equal those of an exchange sized for the worst case."""
import dataclasses
import json
from pathlib import Path

import pytest

from jgraph.config import load
from jgraph.exchange.sizing import Key, Route
from jgraph.jobs import kind
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train import loop

pytestmark = pytest.mark.slow     # runs that recompile

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# One device, one epoch of five steps: a growth must rewind mid-epoch.
SMALL = ["data.num_parts=1", "train.epochs=1", "train.batch_size=32", "exchange.max_rungs=1"]


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
    monkeypatch.setattr(kind, "calibrated_sampler", tiny)    # what JobKind.sized calls
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



# Four devices, one epoch of two steps: every exchange moves ids between devices.
SHARDED = ["data.num_parts=4", "train.epochs=1", "train.batch_size=16"]


def inputs_of(inputs: str) -> list[str]:
    return SHARDED + (["model.learnable_inputs=true"] if inputs == "embeddings" else [])


@pytest.fixture(scope="module")
def bound(tmp_path_factory, request):
    """{inputs: (workdir, result)} of runs with `exchange.sizing=bound`, where nothing
    ever grows, made when first asked for."""
    runs = {}

    def get(inputs):
        if inputs not in runs:
            workdir = tmp_path_factory.mktemp(f"bound-{inputs}")
            runs[inputs] = workdir, loop.train_and_evaluate(
                load(Experiment, EXPERIMENT, inputs_of(inputs) + ["exchange.sizing=bound"]),
                str(workdir), Progress(enabled=False))
        return runs[inputs]
    return get


@pytest.mark.parametrize("inputs,strategy", [("features", "auto"), ("embeddings", "auto"),
                                             ("embeddings", "scheduled")])
def test_exchange_capacities_calibrated_low_give_the_losses_of_worst_case_ones(
        inputs, strategy, bound, tmp_path, monkeypatch):
    """With every measured exchange capacity cut to 8 ids, the run grows them (gathers
    at the first flush; embedding gradients, which travel in one round, by refusing the
    step) and logs the losses of `exchange.sizing=bound`, where nothing ever grows.
    Under the scheduled strategy the gathers' chunks of 8 stay (they loop), and the
    embedding gradients' capacities, keyed apart from them, grow."""
    ref_dir, ref = bound(inputs)
    assert ref["exchange_capacities"] == {} and ref["capacity_growths"] == []
    measured = kind.calibrated_exchange

    def low(job, graph, embeddings=None, progress=None):
        job = measured(job, graph, embeddings, progress)
        assert job.exchange.capacities, "nothing was measured"
        return dataclasses.replace(job, exchange=job.exchange.calibrated(
            dict.fromkeys(job.exchange.capacities, 8)))
    monkeypatch.setattr(kind, "calibrated_exchange", low)
    got_dir = tmp_path / "low"
    result = loop.train_and_evaluate(
        load(Experiment, EXPERIMENT, inputs_of(inputs) + [f"exchange.strategy={strategy}"]),
        str(got_dir), Progress(enabled=False))
    growths = result["capacity_growths"]
    assert growths, "capacities of 8 ids sufficed: the test measures nothing"
    assert result["compiles"] == 1 + len(growths)
    assert result["exchange_capacities"] == growths[-1]["exchange_capacities"]
    capacities = {Key.parse(k): v for k, v in result["exchange_capacities"].items()}
    assert max(capacities.values()) > 8
    if strategy == "scheduled":
        assert all(v == 8 for k, v in capacities.items() if k.route is Route.OWN)
        assert any(v > 8 for k, v in capacities.items() if k.route is Route.STRAIGHT)
    got, want = steps(got_dir), steps(ref_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert (a["count"], a["correct"]) == (b["count"], b["correct"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert result["test_acc"] == ref["test_acc"]
