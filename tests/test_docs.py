"""The README's code and the examples run as written: the README's Python blocks in
order in one fresh process (they build on each other), and every script in
`examples/` with the small settings its docstring names, from a folder laid out like a
checkout (`experiments/`, `examples/`, and `../shared` beside it)."""
import os
import re
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
    assert printed[-2].startswith("True ")       # the fetched rows are the features
    assert printed[-1].startswith("2 ")          # the sampling block's two blocks
