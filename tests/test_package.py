"""The package's own promises: devices for tests, kernels mapping, no import side effects."""
import subprocess
import sys
from pathlib import Path

import jax
import pytest


def test_conftest_gives_eight_cpu_devices():
    assert jax.device_count() == 8
    assert {d.platform for d in jax.devices()} == {"cpu"}


def test_kernels_ship_as_jgraph_kernels_not_top_level(tmp_path):
    code = ("import importlib.util, jgraph.kernels;"
            "print(importlib.util.find_spec('kernels') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "True"


def test_importing_jgraph_does_not_initialise_jax(tmp_path):
    code = ("import sys, jgraph, jgraph.data, jgraph.partition, jgraph.cli;"
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_builtin_cora_ships_with_the_package():
    from jgraph.data import load_dataset
    g = load_dataset("cora")
    assert g.total_nodes == 2708 and g.num_edges == 10556


@pytest.mark.slow       # some 7 s: the fast tier stays under 4 minutes
def test_the_wheel_ships_every_package_and_its_data(tmp_path):
    """What `pip install .` gives a user, built from the tree as it is: every package
    folder under jgraph/ (found, not listed), kernels/ as jgraph.kernels, the built-in
    graph and the compile targets. An editable install hides a package left out."""
    import glob
    import os
    import shutil
    import zipfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "parts", "build", "dist", "*.egg-info", "__pycache__",
        ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "out"), str(src)], check=True, capture_output=True)
    (wheel,) = glob.glob(str(tmp_path / "out" / "*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {os.path.dirname(n) for n in names if n.endswith("__init__.py")}
    wanted = {os.path.relpath(os.path.dirname(p), src)
              for p in glob.glob(str(src / "jgraph" / "**" / "__init__.py"), recursive=True)}
    assert wanted - shipped == set()
    assert "jgraph/kernels" in shipped and "kernels" not in shipped
    assert "jgraph/kernels/sample.py" in names
    assert "jgraph/data/builtin/cora.npz" in names
    assert any(n.startswith("jgraph/targets/") and n.endswith(".txtpb") for n in names)


def test_tests_mirror_the_package():
    """Every package of jgraph (and `kernels`, shipped as jgraph.kernels) has its folder
    of tests, and every folder of tests is a package's or a module's (`jgraph.launch`)."""
    root = Path(__file__).resolve().parents[1]
    packages = {p.parent.name for p in (root / "jgraph").glob("*/__init__.py")} | {"kernels"}
    modules = {p.stem for p in (root / "jgraph").glob("*.py")}
    folders = {p.name for p in (root / "tests").iterdir()
               if p.is_dir() and not p.name.startswith((".", "__"))}
    assert packages <= folders, sorted(packages - folders)
    assert folders <= packages | modules, sorted(folders - packages - modules)
