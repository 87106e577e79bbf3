"""A graph of shapes (`AbstractGraph`) is a partitioned graph without its values: each
kind's own `build` over it gives the programs `jgraph train` builds over a partitioned
graph of the same per-partition counts, argument for argument (shapes, dtypes,
shardings), and a build that would read values it does not have is refused or takes
what counts give."""
import dataclasses

import jax
import numpy as np
import pytest

from jgraph.config import ConfigError, load
from jgraph.jobs import kind_of
from jgraph.jobs.dataset import open_graph
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.programs import Program
from jgraph.jobs.run import target_type
from jgraph.mesh import first_devices
from jgraph.progress import Progress
from jgraph.sampling.loader import split_counts
from jgraph.sharded import make_mesh
from jgraph.sharded.abstract import AbstractGraph, Counts, Described, Shapes
from jgraph.target import abstract_like

GRAPH = "synthetic:nodes=3000,edges=24000,feat=12,classes=4"
DEVICES = 4
SMALL = ("model.hidden=16", "model.num_layers=2", "train.fanouts=[4,3]",
         "train.eval_fanouts=[4,3]", "train.batch_size=48", "train.eval_batch_size=64")
CONFIGS = {
    "sampled": ("experiments/sage_synthetic.yaml", ()),
    "full": ("experiments/full_sage_synthetic.yaml", ()),
    "control_variate": ("experiments/cv_sage_cora.yaml", ("train.history_refresh=null",)),
    "link": ("experiments/lp_sage_facebook.yaml", ("link.val_fraction=0.1",
                                                    "link.test_fraction=0.1")),
}


def config_of(name: str) -> Experiment:
    path, extra = CONFIGS[name]
    return load(Experiment, path, [f"data.path={GRAPH}", f"data.num_parts={DEVICES}",
                                   "exchange.cache=0", *SMALL, *extra])


def shapes_like(dg, config: Experiment) -> Shapes:
    """The per-partition counts of a partitioned graph: what an abstract graph of the
    same partitioning is made of."""
    meta = dg.meta
    kind = kind_of(config)
    splits, positives, classes = {}, None, 1
    if kind.node_splits:
        target = target_type(config, dg)
        splits = {s: split_counts(dg, s, target) for s in meta.splits[target]}
        classes = int(dg.ndata(config.data.label).to_numpy().max()) + 1
    else:
        positives = np.array([p.edge_splits["train"] for p in meta.parts], np.int64)
    feat = meta.node_data[meta.node_types[0]][config.data.feature].shape[0]
    return Shapes(dg.book.part_sizes().astype(np.int64),
                  np.array([p.num_edges for p in meta.parts], np.int64), splits, positives,
                  feat, classes, dg.graph.max_in_degree)


def structs(tree):
    return jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding.spec), tree)


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """{kind name: (config, the partitioned graph on the mesh)}."""
    mesh = make_mesh(DEVICES, first_devices(DEVICES))
    out = {}
    for name in CONFIGS:
        config = config_of(name)
        out[name] = config, open_graph(config, mesh, str(tmp_path_factory.mktemp(name)),
                                       Progress(enabled=False))
    return out


@pytest.mark.slow     # four kinds partitioned, built twice, traced: some 40 s
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_kinds_build_over_shapes_gives_the_programs_of_its_build_over_partitions(
        opened, name):
    config, dg = opened[name]
    kind = kind_of(config)
    real = kind.programs(kind.build(config, dg, "cpu"))
    shaped = AbstractGraph(shapes_like(dg, config), dg.mesh, GRAPH)
    abstract = kind.programs(kind.build(config, shaped, "cpu"))
    assert structs(abstract.graph) == structs(abstract_like(real.graph, real.graph.specs(),
                                                             dg.mesh))
    for program in Program:
        if program is Program.SMOOTH and not kind.classifies:
            for programs in (real, abstract):       # link prediction has no classes
                with pytest.raises(ConfigError, match="this run has none"):
                    programs.lowering(program, dg.mesh)
            continue
        want = real.lowering(program, dg.mesh)
        got = abstract.lowering(program, dg.mesh)
        assert structs(got.args) == structs(want.args), program
        assert got.calls == want.calls, program
    assert abstract.job.loader.batch_size == real.job.loader.batch_size
    assert abstract.evaluation.loader.batch_size == real.evaluation.loader.batch_size


def test_counts_are_split_as_balance_allows_and_sum_to_the_totals():
    counts = Counts(nodes=1000, edges=9001, feat=8, classes=3,
                    splits={"train": 101, "val": 0}, positives=0, parts=4)
    shapes = Shapes.of(counts)
    assert shapes.nodes.tolist() == [263, 246, 246, 245]        # 250 x 1.05, the rest even
    assert shapes.edges.sum() == 9001 and shapes.edges[0] == int(np.ceil(9001 / 4 * 1.05))
    assert shapes.splits["train"].sum() == 101 and shapes.splits["val"].tolist() == [0] * 4
    assert shapes.positives is None


def test_a_graph_of_shapes_refuses_what_would_read_its_values():
    counts = Counts(nodes=1000, edges=9000, feat=8, classes=3,
                    splits={"train": 100, "val": 100, "test": 100}, positives=0, parts=2)
    graph = AbstractGraph(Shapes.of(counts), make_mesh(2, first_devices(2)), "synthetic:nodes=1000")
    assert graph.abstract and graph.ndata("feat").array.shape == (2 * 525, 8)
    assert isinstance(graph.parts, Described)
    with pytest.raises(TypeError, match="partition 1 has no arrays to read"):
        graph.parts.part(1)
    with pytest.raises(TypeError, match="no degrees"):
        graph.degrees()
    # The hot-node cache is chosen by degrees: refused by name, not dropped.
    config = dataclasses.replace(config_of("sampled"), exchange=dataclasses.replace(
        config_of("sampled").exchange, cache=0.1))
    with pytest.raises(ConfigError, match="exchange.cache=0.1"):
        kind_of(config).build(config, graph, "cpu")
