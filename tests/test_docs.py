"""The documentation's code and the examples run as written: the shell commands of the
README and of every guide in docs/ (each bash block in a folder of its own, its commands
one after another), each page's Python blocks in order in one fresh process (they
build on each other), and every script in `examples/` with the small settings its
docstring names, from a folder laid out like a checkout (`experiments/`, `examples/`,
and `../shared` beside it); each block prints what the page shows it printing (see
"What the blocks print"). docs/settings.md is what its generator writes now."""
import doctest
import importlib.util
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("JGRAPH_SHARED_DATA", ROOT.parent / "shared" / "data"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
# The pages whose code blocks run: the README, then the guides.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, first line, code) of each fenced block of a Markdown file."""
    text = path.read_text()
    return [(m[1], text.count("\n", 0, m.start()) + 1, m[2]) for m in FENCE.finditer(text)]


def checkout_like(tmp_path: Path) -> Path:
    """tmp/main holding links to the repository's experiments/ and examples/, with
    tmp/shared linking ../shared: relative paths in the docs resolve as in a checkout,
    and what the code writes stays in tmp."""
    main = tmp_path / "main"
    main.mkdir()
    for name in ("experiments", "examples"):
        (main / name).symlink_to(ROOT / name)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(SHARED_DATA)
    return main


def skip_without_shared_data(what: str, code: str) -> None:
    if "../shared/" in code and not SHARED_DATA.exists():
        pytest.skip(f"{what} reads ../shared/data ({SHARED_DATA} not found)")


def run_python(code_or_path, cwd: Path, args=(), timeout: int = 600):
    cmd = ([sys.executable, str(code_or_path), *args] if isinstance(code_or_path, Path)
           else [sys.executable, "-c", code_or_path])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# -- What the blocks print ------------------------------------------------------------------
#
# A block whose commands or code print (to stdout: progress goes to stderr) is followed,
# with nothing but blank lines between, by a ```text block of what it prints: what a
# reader will see. The test compares the two, lines' trailing spaces aside:
# - with doctest's ELLIPSIS: `...` in the shown output stands for any text, within a line
#   or across lines. The pages write it for what differs between runs or machines:
#   timings, memory, absolute paths, other libraries' chatter.
# - with the numbers masked on both sides (`shape`, as for the examples) where the test
#   runs other settings than the block shows (`jgraph train` on SMALL_TRAINING) or the
#   figures are learned in floating point, whose last digits can differ between CPUs
#   (LEARNED): the page shows the figures of the block as written, run on one machine,
#   and the comparison checks all else; PRINTS checks what those figures must meet.
# Every other figure is compared exactly. A block that prints and shows nothing fails.


def shown_outputs(path: Path) -> dict[int, str]:
    """{first line of a bash or Python block: the text block right after it}."""
    text = path.read_text()
    fences = list(FENCE.finditer(text))
    return {text.count("\n", 0, block.start()) + 1: after[2]
            for block, after in itertools.pairwise(fences)
            if block[1] in ("bash", "python") and after[1] == "text"
            and not text[block.end():after.start()].strip()}


def tidy(text: str) -> str:
    """Lines without trailing spaces, no blank lines at either end, a final newline."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "".join(line + "\n" for line in lines)


def assert_prints_as_shown(where: str, shown: str | None, printed: str, masked: bool):
    """`printed` is what the page shows (`shown`: None where it shows nothing)."""
    if shown is None:
        assert not printed.strip(), (f"{where} prints, and the page shows nothing: add what "
                                     f"it prints as a ```text block right after it",
                                     printed[-3000:])
        return
    want, got = tidy(shown), tidy(printed)
    if masked:
        want, got = shape(want), shape(got)
    checker = doctest.OutputChecker()
    assert checker.check_output(want, got, doctest.ELLIPSIS), (
        f"{where} prints other than the page shows"
        f"{' (numbers masked)' if masked else ''}:\n"
        + checker.output_difference(doctest.Example("", want), got, doctest.ELLIPSIS))


def test_there_are_guides_and_every_block_is_python_bash_or_a_text_listing():
    assert len(PAGES) > 10
    for page in PAGES:
        kinds = {lang for lang, _, _ in code_blocks(page)}
        assert kinds <= {"python", "bash", "text"}, (page_name(page), kinds)


# Shell commands of the docs that this test does not run, and why.
NOT_RUN = {
    "pip install": "installs the package this test runs from",
    "python -m pytest": "the test suite itself (CI runs it)",
}
# Appended to every `jgraph train` the docs show: its commands, on small settings
# (one epoch: every command still partitions, compiles, trains, evaluates and writes
# its result; a resumed run takes the steps after the checkpoint's).
SMALL_TRAINING = ["--set", "train.epochs=1"]
MORE_EPOCHS = ["--set", "train.epochs=2"]
# Appended too to the `jgraph train` of these configs, whose one epoch on their own
# sizes costs more than the rest of the command: narrower layers, fewer neighbours a
# hop and fewer fixed negatives to rank against. The command runs the same code (the
# same model, sampler, decoder, split and full-graph inference) on the same graph.
SMALLER = {
    "experiments/lp_sage_facebook.yaml": ["model.hidden=32", "train.fanouts=[4,2]",
                                          "train.eval_fanouts=[4,2]",
                                          "link.eval_negatives=100"],
    "experiments/lp_rgcn_acm.yaml": ["model.hidden=16", "model.embedding_dim=16",
                                     "train.fanouts=[4,4]", "train.eval_fanouts=[4,4]",
                                     "link.eval_negatives=100"],
}


# These blocks (each trains cora or the shop for one epoch of a few steps, on a few
# thousand nodes: their time is their compiles) run at XLA:CPU's optimisation level 0,
# not the level 1 tests/conftest.py gives the processes the suite starts: the same HLO
# and arithmetic, compiled without LLVM's passes. CPU seconds, level 1 -> 0: launch 57.1
# -> 46.9, control-variates 40.3 -> 35.9, own-graph 40.7 -> 30.2. Not here, though alone
# faster at level 0 (README 28.7 -> 26.0, outputs 38.5 -> 32.8): the persistent cache is
# keyed by XLA_FLAGS too, and at level 1 they compile the programs that tests after them
# train again at level 1 (docs/checkpoints.md:7's commands, whose resumed runs were not
# faster at level 0: 44.9 -> 51.2, and examples/node_classification.py; outputs.md's
# Python blocks, the same config): pytest -n 0, README.md:31 with checkpoints.md:7 71.5
# -> 61.8, outputs.md:10 with outputs.md's Python blocks 66.0 -> 51.7.
COMPILE_BOUND = {"docs/launch.md:7", "docs/control-variates.md:22", "docs/own-graph.md:58"}
LEVEL = "--xla_backend_optimization_level"


def shell_commands(code: str) -> list[str]:
    """The commands of a bash block: continued lines joined, comments dropped, `a && b`
    split, and those of NOT_RUN left out."""
    text = code.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("#"):
            continue
        for part in filter(None, (p.strip() for p in line.split("&&"))):
            if not any(part.startswith(prefix) for prefix in NOT_RUN):
                commands.append(part)
    return commands


def small(argv: list[str]) -> list[str]:
    """`argv` on small settings: `jgraph train` for 1 epoch (the inner command too, of
    `python -m jgraph.launch ... -- jgraph train ...`), of SMALLER's sizes. A command
    that names its epochs (checkpoints.md's "then trains on, up to 80 epochs") trains
    MORE_EPOCHS instead: more than the block's other commands, so that it still trains
    on from their checkpoint."""
    if not ("train" in argv and "jgraph" in argv):
        return argv
    smaller = [value for config in SMALLER if config in argv for value in SMALLER[config]]
    named = any(a.startswith("train.epochs=") for a in argv)
    return argv + (MORE_EPOCHS if named else SMALL_TRAINING) + smaller


def test_a_command_naming_its_epochs_trains_on_past_the_others():
    # checkpoints.md resumes a 1-epoch run, then "trains on, up to 80 epochs": run
    # small, the last command must still ask for more epochs than the first took.
    first = small(shlex.split("jgraph train experiments/sage_cora.yaml"))
    more = small(shlex.split("jgraph train experiments/sage_cora.yaml --set "
                             "train.epochs=80"))
    epochs = lambda argv: int([a for a in argv if a.startswith("train.epochs=")][-1]
                              .split("=")[1])
    assert epochs(first) == 1 and epochs(more) > epochs(first)


def test_the_shell_blocks_are_commands_of_jgraph_or_named_as_not_run():
    for page in PAGES:
        for lang, line, code in code_blocks(page):
            if lang == "bash":
                for command in shell_commands(code):
                    assert command.split()[0] in ("jgraph", "python"), (page_name(page), line,
                                                                        command)


def test_the_blocks_compiled_quickly_are_shell_blocks():
    assert {f"{page}:{line}" for page, line, _ in shell_blocks()} >= COMPILE_BOUND


def shell_blocks() -> list[tuple[str, int, list[str]]]:
    """(page, first line, commands) of each bash block that has commands to run."""
    blocks = [(page_name(page), line, shell_commands(code))
              for page in PAGES for lang, line, code in code_blocks(page) if lang == "bash"]
    return [(page, line, commands) for page, line, commands in blocks if commands]


# Each block on its own (in its own folder; a block's commands build on each other,
# blocks do not), so that the suite's workers share them.
@pytest.mark.slow      # trains, resumes, launches two processes, builds for H100
@pytest.mark.parametrize("page,line,commands", shell_blocks(),
                         ids=[f"{page}:{line}" for page, line, _ in shell_blocks()])
def test_the_shell_blocks_run(tmp_path, page, line, commands):
    skip_without_shared_data(f"{page} line {line}", " ".join(commands))
    main = checkout_like(tmp_path)
    jgraph = shutil.which("jgraph") or str(Path(sys.executable).parent / "jgraph")
    printed, shortened = [], False          # shortened: run on SMALL_TRAINING
    env = {**os.environ, "PATH": f"{Path(jgraph).parent}:{os.environ['PATH']}"}
    if f"{page}:{line}" in COMPILE_BOUND:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(f"{LEVEL}=1", f"{LEVEL}=0")
    for command in commands:
        argv = small(shlex.split(command))
        if argv[0] == "jgraph":
            argv[0] = jgraph
        elif argv[0] == "python":
            argv[0] = sys.executable
        out = subprocess.run(argv, cwd=main, capture_output=True, text=True, timeout=600,
                             env=env)
        assert out.returncode == 0, (f"{page} line {line}: {command}", out.stderr[-3000:])
        printed.append(out.stdout)
        shortened |= argv[1:] != shlex.split(command)[1:]
    assert_prints_as_shown(f"{page} line {line}", shown_outputs(ROOT / page).get(line),
                           "".join(printed), masked=shortened)


def printed_accuracies_then_smoothed(printed: list[str]) -> None:
    accuracies = [float(x) for x in printed[-2].split()]   # jgraph.train, then jgraph.evaluate
    assert accuracies[0] > 0.5 and accuracies[1] == pytest.approx(accuracies[0], abs=0.002)
    # jgraph.smooth: its base is the model (full-graph inference: every neighbour, as
    # the run's evaluation), then the smoothed accuracy and alphas from the grid.
    base, smoothed, correct, smooth = (float(x) for x in printed[-1].split())
    assert base == pytest.approx(accuracies[0], abs=0.002) and 0.5 < smoothed <= 1
    assert correct in (0.0, 0.5, 0.8, 1.0) and smooth in (0.0, 0.5, 0.8, 1.0)


def printed_four_classes(printed: list[str]) -> None:
    classes = [int(x) for x in printed[-1].strip("[]").split()]   # run.predict: cora's 7
    assert len(classes) == 4 and all(0 <= c < 7 for c in classes) and classes[1] == classes[2]


# What a page's learned figures must meet (the comparison with the page masks them).
PRINTS = {
    "docs/training.md": printed_accuracies_then_smoothed,
    "docs/outputs.md": printed_four_classes,
}
# The Python blocks whose printed figures are learned (their numbers masked when compared
# with the page), by pieces of their code: {page: (piece, ...)}.
LEARNED = {
    "docs/training.md": ("jgraph.evaluate(", "jgraph.smooth("),
    "docs/outputs.md": ("run.predict(",),
}
# Printed after each Python block of a page, to tell the blocks' output apart.
END_OF_BLOCK = "<<<end of a docs block>>>"


def python_pages() -> list[str]:
    return [page_name(page) for page in PAGES
            if any(lang == "python" for lang, _, _ in code_blocks(page))]


def test_the_pages_whose_output_is_checked_have_python_blocks():
    assert set(PRINTS) <= set(python_pages())
    for page, pieces in LEARNED.items():
        for piece in pieces:
            assert any(lang == "python" and piece in code
                       for lang, _, code in code_blocks(ROOT / page)), (page, piece)


def test_every_shown_output_follows_a_block_the_suite_runs():
    """A text block right after a code block is its output: the block must run (a bash
    block of no command to run, `pip install` alone, would leave it unchecked)."""
    for page in PAGES:
        blocks = {line: (lang, code) for lang, line, code in code_blocks(page)}
        for line in shown_outputs(page):
            lang, code = blocks[line]
            assert lang == "python" or shell_commands(code), (page_name(page), line)


@pytest.mark.slow      # partitions facebook_musae, compiles 8-device programs, trains
@pytest.mark.parametrize("page", python_pages())
def test_a_pages_python_blocks_run_in_order_in_one_process(tmp_path, page):
    blocks = [(line, code) for lang, line, code in code_blocks(ROOT / page)
              if lang == "python"]
    script = "\n".join(f"# {page} line {line}\n{code}\nprint({END_OF_BLOCK!r}, flush=True)"
                       for line, code in blocks)
    skip_without_shared_data(page, script)
    out = run_python(script, checkout_like(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout.split(END_OF_BLOCK + "\n")
    assert len(printed) == len(blocks) + 1 and not printed[-1], out.stdout[-3000:]
    shown, learned = shown_outputs(ROOT / page), LEARNED.get(page)
    for (line, code), text in zip(blocks, printed):
        assert_prints_as_shown(f"{page} line {line}", shown.get(line), text,
                               masked=any(piece in code for piece in learned or ()))
    PRINTS.get(page, lambda printed: None)("".join(printed).splitlines())


# Each example with the small settings the test runs it with (its docstring's figures
# come from its defaults); a new example must be added here.
EXAMPLES = {
    "partition_and_inspect.py": [],
    "distributed_tensors.py": ["--steps", "3"],
    "node_classification.py": ["--epochs", "1"],
    "learnable_embeddings.py": ["--epochs", "1"],
    "rgcn_heterogeneous.py": ["--epochs", "1"],
    "own_graph.py": ["--epochs", "1"],
    "own_tables.py": [],
    "own_model.py": ["--epochs", "1"],
    "multi_process.py": ["--epochs", "1"],
    "link_prediction.py": ["--epochs", "1"],
}
NEEDS_SHARED_DATA = {"rgcn_heterogeneous.py"}


def expected_output(path: Path) -> list[str]:
    """The lines after "Prints (...):" in an example's docstring."""
    doc = path.read_text().split('"""')[1]
    block = doc.split("Prints (", 1)[1].split(":\n", 1)[1]
    return [line.strip() for line in block.strip("\n").splitlines() if line.strip()]


def shape(line: str) -> str:
    """A printed line with its numbers masked: small settings change the figures only."""
    return re.sub(r"\d+(\.\d+)?", "#", line)


def test_every_example_is_run_by_this_test_and_documents_its_output():
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(EXAMPLES)
    for name in EXAMPLES:
        assert expected_output(ROOT / "examples" / name), name


@pytest.mark.slow      # each example trains, some twice
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_runs_and_prints_the_lines_its_docstring_shows(tmp_path, name):
    if name in NEEDS_SHARED_DATA and not SHARED_DATA.exists():
        pytest.skip(f"{name} reads ../shared/data ({SHARED_DATA} not found)")
    out = run_python(ROOT / "examples" / name, checkout_like(tmp_path), EXAMPLES[name])
    assert out.returncode == 0, out.stderr[-3000:]
    printed = [shape(line) for line in out.stdout.splitlines()]
    for line in expected_output(ROOT / "examples" / name):
        assert shape(line) in printed, (line, out.stdout)


# -- docs/settings.md, generated from the config classes ------------------------------------

def settings_generator():
    """docs/make_settings.py, the script that writes docs/settings.md, as a module."""
    path = ROOT / "docs" / "make_settings.py"
    spec = importlib.util.spec_from_file_location("make_settings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_page_is_what_its_generator_writes_now():
    generator = settings_generator()
    page = ROOT / "docs" / "settings.md"
    assert page.read_text() == generator.render(), (
        f"docs/settings.md is not what the config classes give now: run "
        f"`{generator.GENERATOR}` from the repository's root")


def test_the_batch_size_is_said_to_be_per_device_with_the_global_batch_it_makes():
    # Sized as if global, a run on 8 devices takes 8 times the batch meant.
    note = settings_generator().field_notes()["train.batch_size"]
    assert "per device" in note and "the global batch is batch_size x devices" in note
    training = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert ("`train.batch_size` is per device" in training
            and "the global batch is `train.batch_size` x devices" in training)


def test_every_setting_has_a_note_and_the_supplement_only_fills_gaps():
    """A setting the docstrings leave out gets its note from the generator's SUPPLEMENT;
    once its class's docstring describes it, the supplement's entry must go."""
    generator = settings_generator()
    notes = generator.field_notes()
    assert all(notes.values()), [key for key, note in notes.items() if not note]
    described = {f"{section}.{name}" if section else name
                 for section, cls in generator.sections()
                 for name in generator.docstring_notes(cls)[1]}
    supplement = set(generator.SUPPLEMENT)
    assert supplement <= set(notes) - described, supplement & described
