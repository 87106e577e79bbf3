"""The package's own promises: devices for tests, kernels mapping, no import side effects."""
import subprocess
import sys

import jax


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
