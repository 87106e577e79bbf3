"""The README's code and the examples run as written: the README's Python blocks in
order in one fresh process (they build on each other), and every script in
`examples/` with the small settings its docstring names, from a folder laid out like a
checkout (`experiments/`, `examples/`, and `../shared` beside it)."""
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


def run_python(code_or_path, cwd: Path, args=(), timeout: int = 600):
    cmd = ([sys.executable, str(code_or_path), *args] if isinstance(code_or_path, Path)
           else [sys.executable, "-c", code_or_path])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_every_readme_block_is_python_bash_or_a_plain_listing():
    kinds = {lang for lang, _, _ in code_blocks(ROOT / "README.md")}
    assert kinds <= {"python", "bash", "text", ""}, kinds


# Shell commands of the README that this test does not run, and why.
NOT_RUN = {
    "pip install": "installs the package this test runs from",
    "python -m pytest": "the test suite itself (CI runs it)",
}
# Appended to every `jgraph train` the README shows: its commands, on small settings
# (one epoch: every command still partitions, compiles, trains, evaluates and writes
# its result; a resumed run takes the steps after the checkpoint's).
SMALL_TRAINING = ["--set", "train.epochs=1"]
# Configs whose one epoch takes longer than compiling (run with `epoch_bound_flags`).
EPOCH_BOUND = ("experiments/lp_sage_facebook.yaml",)


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
    `python -m jgraph.launch ... -- jgraph train ...`)."""
    return argv + SMALL_TRAINING if "train" in argv and "jgraph" in argv else argv


def test_the_readme_shell_blocks_are_commands_of_jgraph_or_named_as_not_run():
    for lang, line, code in code_blocks(ROOT / "README.md"):
        if lang == "bash":
            for command in shell_commands(code):
                assert command.split()[0] in ("jgraph", "python"), (line, command)


def readme_shell_blocks() -> list[tuple[int, list[str]]]:
    """(first line, commands) of each README bash block that has commands to run."""
    blocks = [(line, shell_commands(code)) for lang, line, code in code_blocks(ROOT / "README.md")
              if lang == "bash"]
    return [(line, commands) for line, commands in blocks if commands]


# Each block on its own (in its own folder; a block's commands build on each other,
# blocks do not), so that the suite's workers share them.
@pytest.mark.slow      # trains, resumes, launches two processes, builds for H100
@pytest.mark.parametrize("line,commands", readme_shell_blocks(),
                         ids=[f"line{line}" for line, _ in readme_shell_blocks()])
def test_the_readme_shell_blocks_run(tmp_path, line, commands, epoch_bound_flags):
    main = checkout_like(tmp_path)
    jgraph = shutil.which("jgraph") or str(Path(sys.executable).parent / "jgraph")
    for command in commands:
        argv = small(shlex.split(command))
        if argv[0] == "jgraph":
            argv[0] = jgraph
        elif argv[0] == "python":
            argv[0] = sys.executable
        env = {**os.environ, "PATH": f"{Path(jgraph).parent}:{os.environ['PATH']}"}
        if any(config in argv for config in EPOCH_BOUND):
            env["XLA_FLAGS"] = epoch_bound_flags
        out = subprocess.run(argv, cwd=main, capture_output=True, text=True, timeout=600,
                             env=env)
        assert out.returncode == 0, (f"README.md line {line}: {command}", out.stderr[-3000:])


@pytest.mark.slow      # partitions facebook_musae and compiles 8-device programs
def test_the_readme_python_blocks_run_in_order(tmp_path):
    if not SHARED_DATA.exists():
        pytest.skip(f"the README reads ../shared/data ({SHARED_DATA} not found)")
    blocks = [(line, code) for lang, line, code in code_blocks(ROOT / "README.md")
              if lang == "python"]
    assert len(blocks) >= 3
    script = "\n".join(f"# README.md line {line}\n{code}" for line, code in blocks)
    out = run_python(script, checkout_like(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout.splitlines()
    assert any(p.startswith("True ") for p in printed)   # the fetched rows are the features
    assert any(p.startswith("2 ") for p in printed)      # the sampling block's two blocks
    accuracies = [float(x) for x in printed[-1].split()]  # jgraph.train, then jgraph.evaluate
    assert accuracies[0] > 0.5 and accuracies[1] == pytest.approx(accuracies[0], abs=0.002)


# Each example with the small settings the test runs it with (its docstring's figures
# come from its defaults); a new example must be added here.
EXAMPLES = {
    "partition_and_inspect.py": [],
    "distributed_tensors.py": ["--steps", "3"],
    "node_classification.py": ["--epochs", "1"],
    "learnable_embeddings.py": ["--epochs", "1"],
    "rgcn_heterogeneous.py": ["--epochs", "1"],
    "own_graph.py": ["--epochs", "1"],
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
