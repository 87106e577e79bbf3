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
# compiles). Users' runs keep XLA's defaults; a level in XLA_FLAGS is kept for both.
#
# The first process of a session (pytest, or pytest-xdist's controller) chooses, and
# exports its choice to the processes it starts, pytest-xdist's workers among them:
# JGRAPH_TESTS_XLA_FLAGS for the test processes' own backends (a started process whose
# results a test compares bit for bit with its own uses these too: the levels round some
# programs apart in the last bits on some processors, a validation loss 1.9413561
# against 1.9413560 on an AMD EPYC with AVX-512), XLA_FLAGS for every other started
# process.
LEVEL = "--xla_backend_optimization_level"
ELEMENTAL = (" --xla_cpu_use_fusion_emitters=false"
             if Version(version("jaxlib")) < Version("0.11") else "")
IN_PROCESS, CACHES = "JGRAPH_TESTS_XLA_FLAGS", "JGRAPH_TESTS_JAX_CACHES"
# One persistent compilation cache for the test processes and one for the processes they
# start: the many runs of one config (a reference, then killed, resumed, relaunched runs)
# compile each program once. JAX keys its cache by the program and by XLA_FLAGS as the
# environment holds them when it compiles, which for a test process are the started
# processes' (below), not its backend's: two caches keep the levels apart.


def _cache_dir() -> str:
    folder = tempfile.mkdtemp(prefix="jgraph-tests-jax-cache-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


os.environ.setdefault("JAX_PLATFORMS", "cpu")
if IN_PROCESS not in os.environ:        # the session's first process
    flags = os.environ.get("XLA_FLAGS", "")
    chosen = LEVEL in flags
    os.environ[IN_PROCESS] = flags if chosen else f"{flags} {LEVEL}=0{ELEMENTAL}".strip()
    os.environ["XLA_FLAGS"] = flags if chosen else f"{flags} {LEVEL}=1{ELEMENTAL}".strip()
    given = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    folders = ([os.path.join(given, "tests"), os.path.join(given, "started")] if given
               else [_cache_dir(), _cache_dir()])
    os.environ[CACHES] = os.pathsep.join(folders)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
_started_flags = os.environ["XLA_FLAGS"]
_tests_cache, _started_cache = os.environ[CACHES].split(os.pathsep)
os.environ["XLA_FLAGS"], os.environ["JAX_COMPILATION_CACHE_DIR"] = (
    os.environ[IN_PROCESS], _tests_cache)
from jgraph.cli.devices import use_devices  # noqa: E402 (after XLA_FLAGS is set)

use_devices(8)      # starts JAX's backend (which reads XLA_FLAGS once); also sets the
                    # XLA:CPU flag the exchange's collectives need
import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", _tests_cache)
# For the processes the tests start: their level, with the flags use_devices added.
_added = [f for f in os.environ["XLA_FLAGS"].split()
          if f not in os.environ[IN_PROCESS].split() + _started_flags.split()]
os.environ["XLA_FLAGS"] = " ".join([_started_flags, *_added]).strip()
os.environ["JAX_COMPILATION_CACHE_DIR"] = _started_cache


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
