"""jgraph's messages go through `logging` (the `jgraph` logger, `jgraph.progress`): the
commands' progress at INFO on stderr, silenced by --quiet, more with --verbose; in a
job of several processes said once (by the first), each process naming itself where
the launcher does not; results stay on stdout."""
import json
import logging

import pytest

import jgraph.progress as logs
from jgraph.cli import main
from jgraph.progress import Progress


@pytest.fixture(autouse=True)
def jgraph_level():
    """Each test's levels are its own."""
    before = logs.LOGGER.level
    yield
    logs.LOGGER.setLevel(before)


def test_progress_is_on_stderr_and_quiet_leaves_only_the_result(tmp_path, capsys):
    assert main(["partition", "cora", "--num-parts", "2", "--out", str(tmp_path / "a"),
                 "--json"]) == 0
    said = capsys.readouterr()
    assert "jgraph partition cora -> " in said.err and "assigning nodes (metis)" in said.err
    assert json.loads(said.out)["num_parts"] == 2
    assert main(["partition", "cora", "--num-parts", "2", "--out", str(tmp_path / "b"),
                 "--json", "--quiet"]) == 0
    said = capsys.readouterr()
    assert said.err == ""
    assert json.loads(said.out)["num_parts"] == 2


def test_verbose_adds_the_details_and_quiet_with_verbose_is_refused(capsys):
    logs.setup(logs.level_of(verbose=False), command=True)
    Progress().detail("exchange capacities: [1, 2]")
    Progress().note("a phase")
    assert capsys.readouterr().err == "  a phase\n"
    logs.setup(logs.level_of(verbose=True), command=True)
    Progress().detail("exchange capacities: [1, 2]")
    assert capsys.readouterr().err == "  exchange capacities: [1, 2]\n"
    with pytest.raises(SystemExit):
        main(["partition", "cora", "--num-parts", "2", "-q", "-v"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_several_processes_say_once_and_each_names_itself(capsys, monkeypatch):
    logs.setup(logging.INFO, command=True)
    monkeypatch.delenv(logs.LAUNCHED, raising=False)
    monkeypatch.setattr(logs, "_processes", lambda: (1, 4))
    logs.LOGGER.info("said for the job")
    logs.get("partition").info("rows written: %d", 7, extra=logs.EVERY_PROCESS)
    assert capsys.readouterr().err == "[process 1/4] rows written: 7\n"
    monkeypatch.setattr(logs, "_processes", lambda: (0, 4))
    logs.LOGGER.warning("said for the job")
    assert capsys.readouterr().err == "[process 0/4] said for the job\n"
    # jgraph.launch prefixes every line with the rank already.
    monkeypatch.setenv(logs.LAUNCHED, "0")
    logs.LOGGER.info("under the launcher")
    assert capsys.readouterr().err == "under the launcher\n"


def test_a_program_that_configures_logging_receives_the_records(monkeypatch):
    # Before jgraph installs its handler: a root handler of the program's own.
    monkeypatch.setattr(logs, "_handler", None)
    root = logging.getLogger()
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append((record.name, record.getMessage()))
    keep = Keep()
    monkeypatch.setattr(root, "handlers", [keep])
    saved = logs.LOGGER.handlers[:], logs.LOGGER.propagate
    try:
        logs.LOGGER.handlers[:] = []
        logs.LOGGER.propagate = True
        logs.setup(logging.INFO)
        assert logs.LOGGER.handlers == []            # the program's logging, untouched
        logs.get("train").info("epoch %d", 3)
    finally:
        logs.LOGGER.handlers[:], logs.LOGGER.propagate = saved
    assert got == [("jgraph.train", "epoch 3")]
