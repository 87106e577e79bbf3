"""A training run that stops (SIGKILL mid-epoch, SIGTERM mid-epoch, or a truncated newest
checkpoint) and is started again continues exactly: the same per-step losses
(steps.jsonl), epoch rows (metrics.jsonl, timings aside) and final metrics as the run
that never stopped, on the same devices."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jgraph.config import load
from jgraph.jobs.experiment import Experiment
from jgraph.progress import Progress
from jgraph.train.checkpoint import CheckpointError
from jgraph.train.loop import Resume, RunStopped, train_and_evaluate

pytestmark = pytest.mark.slow     # several whole training runs

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = str(ROOT / "experiments" / "sage_cora.yaml")
# Cora on 2 devices, 3 steps per epoch (70 training seeds per device, batch 32), 4 epochs,
# a checkpoint every 2 steps: at steps 2 and 4 (mid-epoch), 6, 8, 10 and 12.
SMALL = ["data.num_parts=2", "train.epochs=4", "train.batch_size=32", "model.hidden=16",
         "train.fanouts=[5,5]", "train.eval_fanouts=[5,5]", "exchange.max_rungs=1",
         "checkpoint.every_steps=2", "checkpoint.keep=3"]
STEPS = 12
TIMINGS = {"epoch_seconds", "seeds_per_s", "compile_seconds"}
# What one process did: a run resumed after a capacity growth starts from the grown
# capacities the checkpoint holds, so it compiles once and grows nothing (the final
# `capacities` are compared).
RUN_ONLY = {"seconds", "seeds_per_s", "resumed_from_step", "checkpoints", "compile_seconds",
            "eval_compile_seconds", "compiles", "compiles_by_step", "capacity_growths",
            "setup_seconds"}


def config(*extra):
    return load(Experiment, EXPERIMENT, SMALL + list(extra))


def quiet():
    return Progress(enabled=False)


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def assert_same_run(workdir, reference_dir, result, reference):
    """Per-step losses and counts, epoch rows and the result equal the reference's."""
    assert read_lines(workdir / "steps.jsonl") == read_lines(reference_dir / "steps.jsonl")
    def rows(d):
        return [{k: v for k, v in r.items() if k not in TIMINGS}
                for r in read_lines(d / "metrics.jsonl")]
    assert rows(workdir) == rows(reference_dir)
    assert {k: v for k, v in result.items() if k not in RUN_ONLY} == \
        {k: v for k, v in reference.items() if k not in RUN_ONLY}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(workdir, result) of the run that never stops."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    result = train_and_evaluate(config(), str(workdir), quiet())
    return workdir, result


def test_the_uninterrupted_run_logs_every_step_and_keeps_the_newest_checkpoints(reference):
    workdir, result = reference
    steps = read_lines(workdir / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert [(s["epoch"], s["batch"]) for s in steps[:4]] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert sum(s["count"] for s in steps[:3]) == 140          # every seed once per epoch
    assert sorted(os.listdir(workdir / "checkpoints"), key=int) == ["8", "10", "12"]
    assert result["steps"] == STEPS and result["resumed_from_step"] is None


KILLED_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jgraph.cli.devices import use_devices
    use_devices(2)
    from jgraph.config import load
    from jgraph.progress import Progress
    from jgraph.jobs.experiment import Experiment
    from jgraph.train.loop import train_and_evaluate

    experiment, workdir, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    saved = os.path.join(workdir, "checkpoints", str(kill_at - 1))

    def on_step(step):
        if step == kill_at:
            # Wait until the checkpoint before is complete on disk (orbax renames its
            # folder into place last), then die without any chance to clean up.
            deadline = time.monotonic() + 120
            while not os.path.isdir(saved) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)

    train_and_evaluate(load(Experiment, experiment, sys.argv[4:]), workdir,
                       Progress(enabled=False), on_step=on_step)
""")


def test_a_run_killed_mid_epoch_resumes_with_the_same_losses_and_metrics(reference,
                                                                         tmp_path):
    ref_dir, ref_result = reference
    # Killed during step 5 (epoch 1, batch 1), after the checkpoint of step 4.
    # The child compiles as this process does (conftest's JGRAPH_TESTS_XLA_FLAGS, level
    # 0 where conftest chooses): the epoch row it writes is compared bit for bit
    # with this process's, and XLA:CPU's levels round some evaluations apart in the last
    # bits on some processors (val_loss 1.9413561 against 1.9413560 on an AMD EPYC with
    # AVX-512).
    env = {**os.environ, "XLA_FLAGS": os.environ["JGRAPH_TESTS_XLA_FLAGS"]}
    proc = subprocess.run([sys.executable, "-c", KILLED_CHILD, EXPERIMENT, str(tmp_path), "5",
                           *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "checkpoints"), key=int) == ["2", "4"]
    assert not (tmp_path / "result.json").exists()
    notes = io.StringIO()
    result = train_and_evaluate(config(), str(tmp_path), Progress(stream=notes))
    assert "resuming from" in notes.getvalue() and "step 4, epoch 1 batch 1" in notes.getvalue()
    assert result["resumed_from_step"] == 4
    assert_same_run(tmp_path, ref_dir, result, ref_result)


@pytest.mark.parametrize("signalled", [5, 7])
def test_sigterm_saves_stops_and_the_resumed_run_matches(reference, tmp_path, signalled):
    ref_dir, ref_result = reference

    def on_step(step):
        if step == signalled:
            os.kill(os.getpid(), signal.SIGTERM)

    # The signal lands during step s; the vote rides on step s+1 and is read at the
    # first flush point after it (a save every 2 steps, an epoch's end every 3), where
    # every device stops: step 6 is epoch 1's last batch (the epoch's end runs after
    # resuming), step 8 is epoch 2's second (mid-epoch).
    stop = {5: 6, 7: 8}[signalled]
    with pytest.raises(RunStopped, match=f"SIGTERM stopped training after step {stop}") as e:
        train_and_evaluate(config(), str(tmp_path), quiet(), on_step=on_step)
    assert e.value.signum == signal.SIGTERM
    assert str(stop) in os.listdir(tmp_path / "checkpoints")
    result = train_and_evaluate(config(), str(tmp_path), quiet(), Resume.REQUIRE)
    assert result["resumed_from_step"] == stop
    assert_same_run(tmp_path, ref_dir, result, ref_result)


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(reference, tmp_path):
    ref_dir, ref_result = reference
    workdir = tmp_path / "run"
    shutil.copytree(ref_dir, workdir)
    # The finished run's newest checkpoint (step 12) damaged: its largest data file cut
    # in half. Started again, the run goes back to step 10 and trains steps 11 and 12.
    state = workdir / "checkpoints" / "12" / "state"
    victim = max((p for p in state.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    notes = io.StringIO()
    result = train_and_evaluate(config(), str(workdir), Progress(stream=notes))
    assert f"checkpoint {workdir / 'checkpoints' / '12'} is unreadable" in notes.getvalue()
    assert result["resumed_from_step"] == 10
    assert (workdir / "checkpoints-corrupt" / "12").is_dir()
    assert_same_run(workdir, ref_dir, result, ref_result)


def test_resuming_with_another_learning_rate_is_refused_naming_the_field(reference, tmp_path):
    ref_dir, _ = reference
    workdir = tmp_path / "run"
    shutil.copytree(ref_dir, workdir)
    with pytest.raises(CheckpointError, match="config.train.lr: 0.01 there, 0.02 now"):
        train_and_evaluate(config("train.lr=0.02"), str(workdir), quiet())


def test_resume_require_without_a_checkpoint_is_an_error_and_fresh_starts_over(reference,
                                                                                tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        train_and_evaluate(config(), str(tmp_path / "empty"), quiet(), Resume.REQUIRE)
    ref_dir, ref_result = reference
    workdir = tmp_path / "run"
    shutil.copytree(ref_dir, workdir)
    result = train_and_evaluate(config(), str(workdir), quiet(), Resume.FRESH)
    assert result["resumed_from_step"] is None
    assert_same_run(workdir, ref_dir, result, ref_result)
