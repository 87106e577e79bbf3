"""The GPU program, built on this CPU-only machine for an H100 (XLA's deviceless
compilation, `jgraph.target`), as a GPU user's first run would build it:

  * the Pallas draw kernel on its own compiles to a Triton call (never JAX 0.10's
    default Mosaic GPU, which cannot lay out its iota);
  * GraphSAGE's and R-GCN's training and evaluation steps from the shipped configs,
    on 1 and 8 devices with the GPU's default exchange (ragged_all_to_all; every other
    strategy's step is built in test_memory_by_devices.py), and layer-wise full-graph
    inference;
  * link prediction's training step and its evaluation programs (every node's
    embedding, sampled or layer-wise);
  * each program holds what it should: the kernel's custom call on GPU and none on CPU,
    the collectives of its strategy, and no collective on one device.

Needs the CUDA compiler plugin (the `gpu-compile` extra, which the README's test command
installs); `pytest -m "not gpu_compile"` leaves these out.
"""
import dataclasses
import platform

import pytest
from jgraph.kernels.sample import draw_positions, draw_positions_pallas

from jgraph.config import load
from jgraph.jobs import build_run
from jgraph.jobs.dataset import open_graph
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.programs import Program
from jgraph.mesh import first_devices
from jgraph.planner.compile import build, compile_step
from jgraph.progress import Progress
from jgraph.sharded import make_mesh
from jgraph.target import Target, abstract_like, target_mesh

pytestmark = [pytest.mark.gpu_compile, pytest.mark.slow]   # each builds a whole GPU program

if platform.system() != "Linux":
    pytest.skip("the CUDA compiler plugin is published for Linux only",
                allow_module_level=True)

H100 = Target.H100
TRITON = "__gpu$xla.gpu.triton"
# The GPU's default exchange: ragged_all_to_all, after an all_to_all of each device's
# [P] counts and offsets (what each owner receives from each sender, and where).
RAGGED = {"ragged-all-to-all", "all-to-all"}


@pytest.fixture(scope="module")
def make_run(tmp_path_factory, shared_data):
    """(config file, devices, platform, overrides) -> a Run built as `jgraph train`
    builds it (partitioned into a temporary workdir), cached per arguments."""
    runs = {}

    def make(config_file, devices, platform_name="gpu", *overrides):
        key = (config_file, devices, platform_name, overrides)
        if key not in runs:
            config = load(Experiment, config_file, (f"data.num_parts={devices}",) + overrides)
            if config.data.path.endswith(".npz"):
                config = dataclasses.replace(config, data=dataclasses.replace(
                    config.data, path=str(shared_data(config.data.path.split("/")[-1]))))
            mesh = make_mesh(devices, first_devices(devices))
            workdir = tmp_path_factory.mktemp("gpu-compile")
            dg = open_graph(config, mesh, str(workdir), Progress(enabled=False))
            runs[key] = build_run(config, dg, platform=platform_name)
        return runs[key]
    return make


def collectives(analysis_or_report) -> set:
    got = (analysis_or_report["collectives"] if isinstance(analysis_or_report, dict)
           else analysis_or_report.collectives)
    return set(got) - {"all-reduce"}


# -- the kernel on its own -------------------------------------------------------------


@pytest.mark.parametrize("fanout,replace", [(10, False), (10, True)])
def test_the_draw_kernel_compiles_for_h100_to_a_triton_call(fanout, replace):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec, use_abstract_mesh
    mesh = target_mesh(H100, 1)
    m = 4096
    args = abstract_like((jax.ShapeDtypeStruct((m,), jnp.int32),
                          jax.ShapeDtypeStruct((m,), jnp.int32),
                          jax.ShapeDtypeStruct((m,), jnp.uint32)), PartitionSpec(), mesh)
    for fn in (lambda lo, deg, key: draw_positions_pallas(lo, deg, key, fanout, replace),
               lambda lo, deg, key: draw_positions(lo, deg, key, fanout, replace, "auto")):
        # Lowering the Triton kernel asks which GPU it is for. jgraph's programs call it
        # inside shard_map over the target mesh, which says; a bare jit must say it
        # itself (JAX >= 0.11 raises "No supported GPU devices found" otherwise).
        with use_abstract_mesh(mesh.abstract_mesh):
            compiled, _ = build(jax.jit(fn), args)
        text = compiled.as_text()
        assert text.count(TRITON) >= 1, "no Triton kernel in the GPU program"
        assert "mosaic_gpu" not in text


def draw_kernels(devices: int, hops: int = 2, local_seeds: bool = True) -> tuple[int, int]:
    """(fewest, most) draw kernels in a step of `hops` sampled hops with the default
    (ragged) exchange: one per hop, and at most one more in the rounds loop of each hop
    whose frontier goes through the exchange (every hop but a node loader's first),
    compiled where a batch could need more than the calibrated capacity. Never one per
    capacity rung. (Every strategy's count: test_memory_by_devices.py.)"""
    remote = 0 if devices == 1 else hops - (1 if local_seeds else 0)
    return hops, hops + remote


def holds_draw_kernels(count: int, *args, **kwargs) -> bool:
    fewest, most = draw_kernels(*args, **kwargs)
    return fewest <= count <= most


def block_bytes(run) -> int:
    """Bytes of one device's block of the run's feature tables."""
    return sum(f.array.nbytes for f in run.job.inputs.features.values()) // run.dg.mesh.size


def layer_bytes(run) -> int:
    """Bytes of one hidden layer's float32 rows of every node a device owns."""
    return run.dg.graph.nodes_per_part * run.config.model.hidden * 4


# -- the training step ------------------------------------------------------------------


@pytest.mark.parametrize("devices", [1, 8])
def test_graphsage_training_step_compiles_for_h100_with_the_kernel(make_run, devices):
    """The shipped cora config with its defaults: on GPU the exchange is ragged."""
    run = make_run("experiments/sage_cora.yaml", devices)
    report = compile_step(run, H100)
    assert report["ok"], report.get("error")
    assert holds_draw_kernels(report["pallas_kernels"], devices)
    # Its arguments hold the device's block of the feature table.
    assert report["fits"] and report["argument_bytes"] >= block_bytes(run)
    if devices == 1:
        assert collectives(report) == set()
    else:
        assert report["strategy"] == "ragged_all_to_all"
        assert collectives(report) == RAGGED


@pytest.mark.parametrize("devices", [1, 8])
def test_rgcn_training_step_compiles_for_h100(make_run, devices):
    """R-GCN on AIFB as shipped: per-relation fanouts (a kernel per relation), one-hot
    inputs as sharded embeddings whose gradients go back to their owners."""
    report = compile_step(make_run("experiments/rgcn_aifb.yaml", devices), H100)
    assert report["ok"], report.get("error")
    assert holds_draw_kernels(report["pallas_kernels"], devices)
    assert collectives(report) == (set() if devices == 1 else
                                   RAGGED)


@pytest.mark.parametrize("devices", [1, 8])
def test_link_prediction_training_step_compiles_for_h100(make_run, devices):
    """lp_sage_facebook.yaml as shipped: positives and uniform negatives whose
    endpoints are sampled through the exchange, the batch's edges excluded, sparse
    feature rows."""
    report = compile_step(make_run("experiments/lp_sage_facebook.yaml", devices), H100)
    assert report["ok"], report.get("error")
    # Every endpoint is sampled through the exchange: no hop is local.
    assert holds_draw_kernels(report["pallas_kernels"], devices, local_seeds=False)
    assert collectives(report) == (set() if devices == 1 else
                                   RAGGED)


# -- evaluation: sampled and full-graph --------------------------------------------------


def test_link_prediction_evaluation_programs_compile_for_h100(make_run):
    """Link prediction embeds every node, by sampled blocks or layer by layer."""
    run = make_run("experiments/lp_sage_facebook.yaml", 8)
    report = compile_step(run, H100, program=Program.EVAL)
    assert report["ok"] and report["program"] == "eval", report.get("error")
    # The config's eval fanouts are drawn.
    assert holds_draw_kernels(report["pallas_kernels"], 8)
    assert collectives(report) == RAGGED
    report = compile_step(run, H100, program=Program.FULL_GRAPH)
    assert report["ok"], report.get("error")
    assert "ragged-all-to-all" in report["collectives"]


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("config_file", ["experiments/sage_cora.yaml",
                                         "experiments/rgcn_aifb.yaml"])
def test_sampled_evaluation_step_compiles_for_h100(make_run, config_file, devices):
    """With the configs' evaluation fanouts: every neighbour (-1), taken without a draw."""
    report = compile_step(make_run(config_file, devices), H100, program=Program.EVAL)
    assert report["ok"], report.get("error")
    assert report["pallas_kernels"] == 0      # every neighbour (-1 fanouts): no draw
    assert collectives(report) == (set() if devices == 1 else
                                   RAGGED)


def test_full_graph_inference_compiles_for_h100(make_run):
    """Layer-wise inference walks edge windows in a loop, each through the exchange."""
    run = make_run("experiments/sage_cora.yaml", 8)
    report = compile_step(run, H100, program=Program.FULL_GRAPH)
    assert report["ok"], report.get("error")
    assert "ragged-all-to-all" in report["collectives"]
    assert report["pallas_kernels"] == 0          # no sampling: every edge is read
    # Its temporaries hold a layer's rows of every node the device owns.
    assert report["temp_bytes"] >= layer_bytes(run)


# -- full-batch training ------------------------------------------------------------------


@pytest.mark.parametrize("config_file", ["experiments/full_sage_cora.yaml",
                                         "experiments/full_gat_cora.yaml",
                                         "experiments/full_rgcn_aifb.yaml"])
def test_full_batch_training_steps_compile_for_h100(make_run, config_file):
    """The shipped full-batch configs on 8 devices: the windows' rows come through the
    exchange (GAT's again in the backward pass), their gradients go back to the owners
    the same way; nothing is drawn."""
    run = make_run(config_file, 8)
    report = compile_step(run, H100)
    assert report["ok"], report.get("error")
    assert report["pallas_kernels"] == 0
    assert "ragged-all-to-all" in report["collectives"]
    # The backward pass keeps a layer's rows of every node the device owns.
    assert report["fits"] and report["temp_bytes"] >= layer_bytes(run)
