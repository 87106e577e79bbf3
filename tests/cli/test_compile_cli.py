"""`jgraph compile`: a run's training step built for a target without its hardware, as a
user meets it (its JSON line, its errors), its roofline worked by hand from the H100's
datasheet (and a program's whose flops and bytes are counted by hand), and jgraph's
commands starting quietly on a machine without CUDA although the CUDA compiler plugin
is installed. (In-process: JAX already has the 8 devices tests/conftest.py set up.)"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from jgraph.cli import main
from jgraph.config import load
from jgraph.cost import Costs, roofline
from jgraph.jobs import build_run, kind_of
from jgraph.jobs.abstract import abstract_graph, counts_of
from jgraph.jobs.dataset import open_graph
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.programs import Program
from jgraph.mesh import AXIS, first_devices, make_mesh
from jgraph.progress import Progress
from jgraph.target import Target, target_mesh

pytestmark = pytest.mark.slow     # builds programs, some for a GPU

ROOT = Path(__file__).resolve().parents[2]
SAGE = str(ROOT / "experiments" / "sage_cora.yaml")
SYNTHETIC = str(ROOT / "experiments" / "sage_synthetic.yaml")
LINK = str(ROOT / "experiments" / "lp_sage_facebook.yaml")
FIELDS = ("ok", "target", "devices", "compile_seconds", "argument_bytes", "temp_bytes",
          "output_bytes", "pallas_kernels", "collectives")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# One layer of 3 neighbours: the least a step from counts can be.
ONE_LAYER = ("model.num_layers=1", "train.fanouts=[3]", "train.eval_fanouts=[3]")


def compile_counts(capsys, target, devices, graph, *flags, config=SYNTHETIC):
    """`jgraph compile CONFIG --abstract` of a one-layer model on `graph`'s counts:
    (exit code, stdout, stderr)."""
    return run(capsys, "compile", config, "--target", target, "--devices", devices,
               "--abstract", "--set", f"data.path={graph}", *ONE_LAYER, *flags)


def xla_memory(programs, program: Program, devices: int) -> dict:
    """The per-device bytes XLA's memory analysis gives for `program` of `programs`,
    compiled here from Python for `devices` CPU devices as `jgraph compile` lowers it."""
    lowering = programs.lowering(program, target_mesh(Target.CPU, devices))
    mem = lowering.fn.trace(*lowering.args).lower().compile().memory_analysis()
    return {"argument_bytes": mem.argument_size_in_bytes,
            "output_bytes": mem.output_size_in_bytes,
            "temp_bytes": mem.temp_size_in_bytes, "alias_bytes": mem.alias_size_in_bytes}


def assert_the_bytes_are_xlas(report: dict, want: dict) -> None:
    """The report's bytes are XLA's for the same program (`xla_memory`), and its peak is
    what must fit: the arguments, the outputs not aliased to them, the temporaries."""
    assert {key: report[key] for key in want} == want
    assert want["temp_bytes"] > 0
    assert report["peak_bytes"] == (want["argument_bytes"] + want["output_bytes"]
                                    - want["alias_bytes"] + want["temp_bytes"])


def test_compile_for_cpu_prints_one_json_line_with_what_the_program_needs(capsys):
    began = time.perf_counter()
    code, out, err = run(capsys, "compile", SAGE, "--target", "cpu", "--devices", "2",
                         "--json")
    wall = time.perf_counter() - began
    assert code == 0, err
    report = json.loads(out)
    assert all(field in report for field in FIELDS)
    assert report["ok"] and report["target"] == "cpu" and report["devices"] == 2
    assert report["pallas_kernels"] == 0            # CPU draws with XLA code
    assert report["collectives"].get("all-to-all", 0) > 0
    # The build's parts (trace, lower, XLA) add up to it, within the command's time.
    parts = [report[f"{part}_seconds"] for part in ("trace", "lower", "xla")]
    assert min(parts) > 0 and report["compile_seconds"] == pytest.approx(sum(parts))
    assert report["compile_seconds"] < wall
    assert report["fits"] is None                   # no device memory to compare with
    # The same training step built from Python, as `jgraph compile` builds it.
    config = load(Experiment, SAGE, ["data.num_parts=2"])
    with tempfile.TemporaryDirectory() as workdir:
        dg = open_graph(config, make_mesh(2, first_devices(2)), workdir,
                        Progress(enabled=False))
        built = build_run(config, dg, platform="cpu")
        want = xla_memory(built.kind.programs(built), Program.TRAIN, 2)
    assert_the_bytes_are_xlas(report, want)


@pytest.mark.gpu_compile
def test_abstract_compile_for_h100_builds_shapes_from_counts(capsys):
    """Counts only: 20k nodes over 2 devices, the largest partition at the 1.05 balance
    tolerance; the step holds the Triton draw kernel and fits in an H100's memory."""
    code, out, err = run(capsys, "compile", SYNTHETIC, "--target", "h100", "--devices", "2",
                         "--abstract", "--set",
                         "data.path=synthetic:nodes=20k,edges=200k,feat=16,classes=5",
                         "model.num_layers=2", "train.fanouts=[5,5]", "train.eval_fanouts=[5,5]",
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["abstract"] and report["strategy"] == "ragged_all_to_all"
    assert report["nodes_per_device"] == math.ceil(10_000 * 1.05)
    assert report["edges_per_device"] == math.ceil(100_000 * 1.05)
    # One per hop: built as a calibrated run (one capacity per request length), each
    # hop draws its own and its remote nodes in the one rounds loop of the exchange.
    assert report["pallas_kernels"] == 2
    assert "ragged-all-to-all" in report["collectives"]
    assert report["device_memory_bytes"] > 80 * 10**9 and report["fits"]
    assert report["flops"] > 0 and report["collective_bytes"]["ragged-all-to-all"] > 0
    # The roofline worked from the report's counts and the H100 datasheet (H100_*): the
    # 2 devices share a host, so every collective byte crosses NVLink. An epoch is
    # ceil(1050 / 1024) = 2 steps: 10% of the 20k nodes train, the largest partition
    # holding ceil(1000 x 1.05) = 1050 of them, 1024 a step.
    compute = report["flops"] / H100_TF32
    network = sum(report["collective_bytes"].values()) / H100_NVLINK
    step = max(compute, network)
    roofline = report["roofline"]
    assert roofline["lower_bound"] and roofline["compute_dtype"] == "tf32"
    assert roofline["compute_seconds"] == pytest.approx(compute)
    assert roofline["network_seconds"] == pytest.approx(network)
    assert roofline["memory_seconds_estimate"] == pytest.approx(
        report["bytes_accessed"] / H100_MEMORY)
    assert roofline["steps_per_epoch"] == 2
    assert roofline["step_seconds_lower_bound"] == pytest.approx(step)
    assert roofline["epoch_seconds_lower_bound"] == pytest.approx(2 * step)
    assert roofline["bound_by"] == ("compute" if compute > network else "network")


# NVIDIA's H100 SXM datasheet, typed here rather than read from jgraph: dense TF32
# matmuls (989 TFLOP/s with sparsity, half without), NVLink 4 (900 GB/s both ways: 450
# each way), HBM3.
H100_TF32, H100_NVLINK, H100_MEMORY = 495e12, 450e9, 3.35e12


@pytest.mark.gpu_compile
def test_the_roofline_of_a_program_counted_by_hand_for_2_h100s():
    """Each of 2 H100s multiplies its [64, 64] float32 rows by a [64, 32] weight, 2 x 64
    x 64 x 32 = 262,144 flops, and all_gathers the products: a [128, 32] float32 result,
    16,384 bytes delivered to each device. Over NVLink (one host) those take 36.4 ns,
    the flops at TF32's peak 0.53 ns: the network bounds the step. Its memory traffic
    is at least its two inputs read and its output written once (16,384 + 8,192 +
    16,384 bytes)."""
    mesh = target_mesh(Target.H100, 2)
    rows, weight = PartitionSpec(AXIS), PartitionSpec()

    def step(x, w):
        return lax.all_gather(x @ w, AXIS, tiled=True)

    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(rows, weight),
                               out_specs=PartitionSpec(), check_vma=False))
    args = (jax.ShapeDtypeStruct((2 * 64, 64), jnp.float32,
                                 sharding=NamedSharding(mesh, rows)),
            jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, weight)))
    costs = Costs.of(fn.lower(*args).compile())
    flops, delivered, least_traffic = 2 * 64 * 64 * 32, 128 * 32 * 4, (64 * 64 + 64 * 32
                                                                       + 128 * 32) * 4
    assert costs.flops == flops and costs.collective_bytes == {"all-gather": delivered}
    got = roofline(costs, Target.H100.peaks, 2, "tf32", steps_per_epoch=5)
    assert got["compute_seconds"] == pytest.approx(flops / H100_TF32)
    assert got["network_seconds"] == pytest.approx(delivered / H100_NVLINK)
    assert got["memory_seconds_estimate"] >= least_traffic / H100_MEMORY
    assert got["bound_by"] == "network"
    assert got["step_seconds_lower_bound"] == pytest.approx(delivered / H100_NVLINK)
    assert got["epoch_seconds_lower_bound"] == pytest.approx(5 * delivered / H100_NVLINK)


def test_a_graph_past_2_31_edges_compiles_with_int32_offsets_per_device(capsys):
    """papers100M stored symmetric (3.2B edges): the counts are host integers, each
    of 2 devices holds 1.68B in-edges, which its int32 offsets address."""
    code, out, err = compile_counts(capsys, "cpu", "2",
                                    "synthetic:nodes=111M,edges=3.2B,feat=8,classes=3", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["edges"] == 3_200_000_000 > 2**31
    assert 2**31 > report["edges_per_device"] == math.ceil(1_600_000_000 * 1.05)


def test_compile_for_several_device_counts_prints_a_line_each(capsys):
    code, out, err = compile_counts(capsys, "cpu", "1,2",
                                    "synthetic:nodes=5k,edges=20k,feat=8,classes=3", "--json")
    assert code == 0, err
    reports = [json.loads(line) for line in out.splitlines()]
    assert [r["devices"] for r in reports] == [1, 2] and all(r["ok"] for r in reports)
    assert reports[1]["nodes_per_device"] < reports[0]["nodes_per_device"]
    assert "roofline" not in reports[0]           # the CPU has no published peaks


@pytest.mark.parametrize("config,program", [
    (SYNTHETIC, "eval"), (SYNTHETIC, "full_graph"), (LINK, "eval")])
def test_compile_builds_the_program_asked_for_from_counts(capsys, config, program):
    """Sampled evaluation and full-graph inference of node classification, and a link
    prediction config's (its task says which step: embeddings for ranking), from counts
    alone. (tests/planner/test_memory_by_devices.py builds link prediction's
    training step.)"""
    code, out, err = compile_counts(capsys, "cpu", "2",
                                    "synthetic:nodes=5k,edges=20k,feat=8,classes=3",
                                    "--program", program, "--json", config=config)
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["program"] == program
    assert report["collectives"].get("all-to-all", 0) > 0   # the exchange is in it
    # The same program built from the same counts in Python.
    experiment = load(Experiment, config,
                      ["data.path=synthetic:nodes=5k,edges=20k,feat=8,classes=3", *ONE_LAYER])
    kind = kind_of(experiment)
    graph = abstract_graph(experiment, counts_of(experiment, 2), target_mesh(Target.CPU, 2))
    programs = kind.programs(kind.build(experiment, graph, "cpu"))
    assert_the_bytes_are_xlas(report, xla_memory(programs, Program(program), 2))


def test_compile_in_human_form_prints_one_field_per_line(capsys):
    code, out, _ = compile_counts(capsys, "cpu", "1",
                                  "synthetic:nodes=5k,edges=20k,feat=8,classes=3")
    assert code == 0
    assert "ok: True" in out.splitlines() and "target: cpu" in out.splitlines()


@pytest.mark.parametrize("argv,message", [
    (["--devices", "0"], "--devices must be >= 1"),
    (["--devices", "8,x"], "separated by commas"),
    # papers100M stored symmetric: 3.2B edges fit int32 offsets on 2 devices, not on 1.
    (["--devices", "1", "--abstract", "--set", *ONE_LAYER,
      "data.path=synthetic:nodes=111M,edges=3.2B,feat=8,classes=3"],
     "a partition with 3200000000 edges does not fit int32 edge offsets"),
    (["--devices", "2", "--abstract"], "data.path must be synthetic"),
    (["--devices", "2", "--abstract", "--set", "train.fanouts=[-1,5,5]",
      "data.path=synthetic:nodes=5k,edges=20k,feat=8,classes=3"], "train.fanouts has -1"),
    (["--devices", "2", "--abstract", "--program", "eval", "--set",
      "train.eval_fanouts=[-1,5,5]", "data.path=synthetic:nodes=5k,edges=20k,feat=8,classes=3"],
     "train.eval_fanouts has -1"),
])
def test_compile_errors_exit_2_naming_what_to_change(capsys, argv, message):
    config = SAGE if "--abstract" in argv and "--set" not in argv else SYNTHETIC
    code, out, err = run(capsys, "compile", config, "--target", "cpu", *argv)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


@pytest.mark.gpu_compile
def test_a_cpu_run_starts_without_the_cuda_plugins_messages(tmp_path):
    """The gpu-compile extra installs the CUDA plugin; on a machine without CUDA it
    prints C++ log lines at import and a traceback when JAX looks for a GPU. jgraph's
    entry points keep both out of a CPU user's output (JAX_PLATFORMS unset, as a user
    has it)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = ("import sys; from jgraph.cli.devices import use_devices; use_devices(2); "
            "import jax; print(jax.device_count()); print('kept', file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert done.stderr.strip() == "kept", done.stderr


def test_abstract_compile_with_learnable_inputs_holds_the_embedding_table_and_its_slots(
        capsys):
    """model.learnable_inputs: the program holds the table a run would learn, with
    Adam's m, v and step per row, in place of the features: per device n rows of
    3 x 32 floats and an int instead of 16 floats, and the layer's weights (self and
    neighbour, [input, 5 classes], with Adam's two moments) 16 inputs wider."""
    reports = {}
    for flags in ((), ("model.learnable_inputs=true", "model.embedding_dim=32")):
        code, out, err = compile_counts(capsys, "cpu", "2",
                                        "synthetic:nodes=20k,edges=200k,feat=16,classes=5",
                                        *flags, "--json")
        assert code == 0, err
        reports[bool(flags)] = json.loads(out)
    n = reports[True]["nodes_per_device"]
    table = n * (3 * 32 * 4 + 4) - n * 16 * 4
    layer = (32 - 16) * 5 * 2 * 4 * 3
    assert reports[True]["argument_bytes"] - reports[False]["argument_bytes"] == table + layer
