"""Test session setup: 8 simulated CPU devices, configured before JAX initialises."""
import atexit
import os
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

# Entry-point configuration (never done by the library itself): JAX on the CPU with 8
# devices, so sharded code runs on a simulated 8-device mesh.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session and the processes its tests start:
# the many runs of one config (a reference, then killed, resumed, relaunched runs)
# compile each program once. Keyed by the program itself, so nothing changes but time.
def _cache_dir() -> str:
    folder = tempfile.mkdtemp(prefix="jgraph-tests-jax-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


_own_cache = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _own_cache:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir()
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# This process's programs are small and run briefly: compiling them is most of their
# time, so they are compiled quickly.
# - LLVM's optimisation passes are skipped (the same HLO, the same arithmetic: XLA:CPU
#   does not reassociate floats at any level). That took the CPU time of
#   tests/jobs/test_step.py and test_inference.py from 129 s to 91 s (112 s at level 1).
# - On XLA 0.10, the elemental emitter writes the kernels, not the fusion emitters' MLIR
#   pipelines: the 200k-node graph's 8-device training step compiles in 1.6 s, not 3.1 s
#   (at level 0); tests/cli/test_link_cli.py, train/test_capacity_growth.py and
#   jobs/test_full_mode.py took 120 s, not 175 s, on two workers. XLA 0.11 and later
#   have only the fusion emitters, and abort on the flag.
# The commands the suite starts (the README's, the examples, multi-process jobs) train
# whole epochs, where level 0 code runs 9x slower (a facebook link epoch: 76 s, against
# 9.0 s at level 1 and 8.7 s at XLA's default): they get level 1. Most of them train on
# small graphs and still spend most of their time compiling, so they keep the elemental
# emitter (examples/own_model.py: 26 s, against 32 s with the fusion emitters, 47 s at
# level 0); so does facebook's link training, on the sizes tests/test_docs.py gives it
# (its shipped sizes' epoch, 48 s against 28 s with the fusion emitters, outweighed its
# compiles). Users' runs keep XLA's defaults.
LEVEL = "--xla_backend_optimization_level"
ELEMENTAL = (" --xla_cpu_use_fusion_emitters=false"
             if Version(version("jaxlib")) < Version("0.11") else "")
QUICK = f"{LEVEL}=0{ELEMENTAL}"
_chosen = LEVEL in os.environ.get("XLA_FLAGS", "")
if not _chosen:
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {QUICK}".strip()
# What this process's backend compiles with, for a started process whose results are
# compared with this one's bit for bit (under pytest-xdist a worker inherits the flags
# the first process set for started processes: level 1).
os.environ["JGRAPH_TESTS_XLA_FLAGS"] = os.environ["XLA_FLAGS"]
from jgraph.cli.devices import use_devices  # noqa: E402 (after XLA_FLAGS is set)

use_devices(8)      # starts JAX's backend (which reads XLA_FLAGS once); also sets the
                    # XLA:CPU flag the exchange's collectives need
if not _chosen:     # for the processes the tests start
    os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(QUICK, f"{LEVEL}=1{ELEMENTAL}")
    # JAX keys its persistent cache by XLA_FLAGS as the environment holds them when it
    # compiles: from here on this process's programs (level 0) would be keyed as level 1,
    # and a started process could load one of them, or this process one of theirs. The
    # levels round some programs apart in the last bits on some processors (an AMD EPYC
    # with AVX-512: a validation loss, 1.9413561 against 1.9413560), so the started
    # processes share a cache of their own. (Under pytest-xdist the workers inherit
    # level 1 and the started processes' cache from the first process: one level, one
    # cache.)
    if _own_cache:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir()


SHARED_DATA = Path(os.environ.get("JGRAPH_SHARED_DATA",
                                  Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data():
    """A function: name -> path of a dataset in ../shared/data, or skip with the reason."""
    def path(name: str) -> Path:
        p = SHARED_DATA / name
        if not p.exists():
            pytest.skip(f"dataset {name} not found at {p} (set JGRAPH_SHARED_DATA)")
        return p
    return path


@pytest.fixture(scope="session")
def chance_ranking():
    """A function: (metric, k) -> what a model that learned nothing scores when it ranks
    each positive among k negatives: its scores are as good as random, so the positive's
    rank is uniform on 1..k+1. "mrr": (1 / (k + 1)) * sum of 1 / r for r = 1..k+1;
    "hits@h": h / (k + 1). Ties count half (OGB's rule, as `jgraph.jobs.link.ogb_ranks`),
    so a model that scores every edge alike does worse still: rank 1 + k / 2, an MRR of
    2 / (k + 2)."""
    def chance(metric: str, k: int) -> float:
        if metric == "mrr":
            return sum(1 / r for r in range(1, k + 2)) / (k + 1)
        return min(int(metric.removeprefix("hits@")), k + 1) / (k + 1)
    return chance


# -- the GPU program: say which gpu_compile tests ran and how they ended ------------------

_GPU_COMPILE: dict[str, str] = {}


def pytest_runtest_logreport(report):
    """Remember the outcome of each gpu_compile test (its call, or a failed setup)."""
    if "gpu_compile" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _GPU_COMPILE[report.nodeid] = "skipped" if report.skipped else report.outcome


def pytest_terminal_summary(terminalreporter):
    """After every run, the list of GPU-compile tests (the H100 program built on this
    machine without a GPU) with their outcomes, so a CI log shows they ran."""
    if not _GPU_COMPILE:
        return
    counts = {}
    for outcome in _GPU_COMPILE.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    terminalreporter.section("GPU program built for H100 without a GPU (gpu_compile)")
    for nodeid, outcome in _GPU_COMPILE.items():
        terminalreporter.write_line(f"{outcome.upper():8} {nodeid}")
    terminalreporter.write_line(", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
