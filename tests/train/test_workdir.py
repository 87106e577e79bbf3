"""`jgraph.train.workdir.RunWorkdir`: a run that fails before it trains takes away what it
wrote into a workdir it made or found empty; one in a workdir holding earlier files, or
one that trained, keeps its files but for the empty directories it made; the lock file
goes whenever a run ends."""
import os

import pytest

from jgraph.train.workdir import LOCK_FILE, RunWorkdir, WorkdirError, WorkdirLock


def attempt(workdir, fail: bool, trained: bool = False) -> None:
    """A run's files written into `workdir`: a partition, an empty checkpoints/, a log."""
    try:
        with RunWorkdir(str(workdir)) as held:
            (workdir / "partition").mkdir()
            (workdir / "partition" / "meta.json").write_text("{}")
            (workdir / "checkpoints").mkdir()
            if trained:
                held.training()
            (workdir / "steps.jsonl").write_text("{}\n")
            if fail:
                raise ValueError("a config error")
    except ValueError:
        pass


def test_a_run_failing_before_it_trains_removes_the_workdir_it_made(tmp_path):
    attempt(tmp_path / "run", fail=True)
    assert not (tmp_path / "run").exists()


def test_a_run_failing_before_it_trains_empties_a_workdir_it_found_empty(tmp_path):
    (tmp_path / "run").mkdir()
    attempt(tmp_path / "run", fail=True)
    assert os.listdir(tmp_path / "run") == []


def test_earlier_files_stay_and_only_the_empty_directories_made_go(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    attempt(workdir, fail=True)
    assert sorted(os.listdir(workdir)) == ["notes.txt", "partition", "steps.jsonl"]


def test_a_run_that_trained_keeps_its_logs_when_it_fails(tmp_path):
    attempt(tmp_path / "run", fail=True, trained=True)
    assert sorted(os.listdir(tmp_path / "run")) == ["partition", "steps.jsonl"]


def test_a_finished_run_keeps_everything_but_its_lock_file(tmp_path):
    attempt(tmp_path / "run", fail=False)
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoints", "partition", "steps.jsonl"]


def test_a_run_refused_by_the_lock_touches_nothing(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    with WorkdirLock(str(workdir)):
        with pytest.raises(WorkdirError, match="in use by jgraph process"), \
                RunWorkdir(str(workdir)):
            pass
        assert os.listdir(workdir) == [LOCK_FILE]
    assert os.listdir(workdir) == []
