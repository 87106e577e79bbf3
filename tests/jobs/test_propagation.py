"""Propagation on the mesh (jgraph/jobs/propagation.py) equals a dense numpy reference
built from the same partition's in-edges: both normalisations, clamped rows, a
homogeneous graph (cora) and a heterogeneous one (two node types, relations alike), on
1 and 4 devices."""
import functools

import jax
import numpy as np
import pytest

from jgraph.data import Graph, load_dataset
from jgraph.jobs.propagation import Norm, correct_and_smooth, label_propagation, propagate
from jgraph.jobs.windows import edge_window
from jgraph.mesh import REPLICATED, ROWS, first_devices, make_mesh
from jgraph.partition import partition_graph
from jgraph.sharded import DistGraph, DistTensor


def two_types() -> Graph:
    """papers and authors: writes / written-by, cites; no features."""
    rng = np.random.default_rng(3)
    n = {"paper": 90, "author": 40}
    edges = {("author", "writes", "paper"): np.stack([rng.integers(0, 40, 200),
                                                      rng.integers(0, 90, 200)]),
             ("paper", "written-by", "author"): np.stack([rng.integers(0, 90, 200),
                                                          rng.integers(0, 40, 200)]),
             ("paper", "cites", "paper"): np.stack([rng.integers(0, 90, 150),
                                                    rng.integers(0, 90, 150)])}
    return Graph(name="two", num_nodes=n, edges=edges, node_data={}, splits={})


@functools.cache
def opened(name: str, parts: int, root: str) -> DistGraph:
    graph = load_dataset("cora") if name == "cora" else two_types()
    partition_graph(graph, parts, "random", f"{root}/{name}{parts}")
    return DistGraph(f"{root}/{name}{parts}", make_mesh(parts, first_devices(parts)))


def adjacency(dg: DistGraph) -> np.ndarray:
    """A[dst, src]: the count of in-edges src -> dst, in the partition's global ids."""
    n = dg.meta.num_nodes
    a = np.zeros((n, n))
    for k in range(dg.num_parts):
        part = dg.parts.part(k)
        indptr = np.asarray(part.indptr)
        dst = dg.book.offsets[k] + np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        np.add.at(a, (dst, np.asarray(part.indices)), 1.0)
    return a


def reference(a, y0, steps, alpha, norm, clamp=None):
    degree = a.sum(axis=1)
    inv = np.where(degree > 0, 1 / np.maximum(degree, 1), 0)
    s = (np.sqrt(inv)[:, None] * a * np.sqrt(inv)[None] if norm is Norm.SYMMETRIC
         else inv[:, None] * a)
    y = y0.copy()
    for _ in range(steps):
        y = (1 - alpha) * y0 + alpha * s @ y
        if clamp is not None:
            y[clamp] = y0[clamp]
    return y


def on_mesh(dg: DistGraph, y0: np.ndarray, steps, alpha, norm, clamp=None):
    layout = dg.layout()
    rows = DistTensor.from_numpy(dg.mesh, layout, y0.astype(np.float32)).array
    known = DistTensor.from_numpy(dg.mesh, layout, np.isin(np.arange(y0.shape[0]),
                                                           clamp if clamp is not None else [])
                                  ).array
    exchange = dg.exchange()
    window = edge_window(dg.graph.edges_per_part, y0.shape[1], smallest=8)

    def body(graph, y0, known):
        after = lambda y: jax.numpy.where(known[:, None], y0, y)
        return propagate(y0, graph, exchange, steps=steps, alpha=alpha, norm=norm,
                         window=window, after=after if clamp is not None else None)

    y, lost = jax.jit(jax.shard_map(body, mesh=dg.mesh,
                                    in_specs=(dg.graph.specs(), ROWS, ROWS),
                                    out_specs=(ROWS, REPLICATED)))(dg.graph, rows, known)
    assert int(lost) == 0
    return DistTensor(y, layout, "y", dg.mesh).to_numpy()


SLOW = pytest.mark.slow      # some 4 s each: the fast tier keeps one case on 4 devices


@pytest.mark.parametrize("name,norm,parts", [
    ("cora", Norm.SYMMETRIC, 4),
    pytest.param("cora", Norm.ROW, 4, marks=SLOW),
    pytest.param("two_types", Norm.SYMMETRIC, 4, marks=SLOW),
    pytest.param("two_types", Norm.ROW, 4, marks=SLOW),
    pytest.param("cora", Norm.SYMMETRIC, 1, marks=SLOW),
    pytest.param("two_types", Norm.ROW, 1, marks=SLOW)])
def test_propagation_on_the_mesh_equals_the_dense_reference(tmp_path_factory, name, norm,
                                                           parts):
    dg = opened(name, parts, str(tmp_path_factory.getbasetemp()))
    n = dg.meta.num_nodes
    rng = np.random.default_rng(parts)
    y0 = rng.random((n, 3))
    clamp = np.sort(rng.choice(n, n // 10, replace=False))
    a = adjacency(dg)
    want = reference(a, y0, 5, 0.8, norm, clamp)
    got = on_mesh(dg, y0, 5, 0.8, norm, clamp)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Without clamping too; and the steps do something (the reference is not y0).
    np.testing.assert_allclose(on_mesh(dg, y0, 3, 0.5, norm),
                               reference(a, y0, 3, 0.5, norm), rtol=1e-5, atol=1e-6)
    assert np.abs(want - y0).max() > 0.1


# -- label propagation ---------------------------------------------------------------------


def labelled(dg: DistGraph, name: str, rng):
    """(layout, global ids, labels, train mask) of the labelled type's rows: cora's own
    labels and Planetoid split, or the two-type graph's papers with 3 classes drawn
    from `rng` and a fifth of them for training."""
    layout = dg.layout("paper" if name == "two_types" else dg.node_types[0])
    rows = layout.global_ids()
    if name == "cora":
        return layout, rows, dg.ndata("label").to_numpy(), dg.split_mask("train").to_numpy()
    labels = rng.integers(0, 3, rows.size)
    return layout, rows, labels, rng.random(rows.size) < 0.2


def label_reference(a, labels, train, classes, steps, alpha, norm, rows):
    """Dense label propagation over every node; `rows`: the labelled type's global ids
    (labels and train indexed by them)."""
    y0 = np.zeros((a.shape[0], classes))
    y0[rows[train], labels[train]] = 1.0
    y = reference(a, y0, steps, alpha, norm, clamp=rows[train])[rows]
    prior = np.bincount(labels[train], minlength=classes) / train.sum()
    return np.where(np.any(y > 0, axis=1, keepdims=True), y, prior[None])


@pytest.mark.parametrize("name,parts", [
    ("cora", 4), pytest.param("cora", 1, marks=SLOW), pytest.param("two_types", 4, marks=SLOW)])
def test_label_propagation_equals_the_dense_reference(tmp_path_factory, name, parts):
    """Cora's Planetoid split (140 labels) propagated 20 steps: the reference's scores,
    and an accuracy far above the majority class's; on two node types, the papers'
    labels propagate through the authors."""
    dg = opened(name, parts, str(tmp_path_factory.getbasetemp()))
    rng = np.random.default_rng(0)
    layout, rows, labels, train = labelled(dg, name, rng)
    classes = int(labels.max()) + 1
    scores = label_propagation(
        dg, DistTensor.from_numpy(dg.mesh, layout, labels.astype(np.int32)),
        DistTensor.from_numpy(dg.mesh, layout, train), classes, steps=20, alpha=0.9)
    want = label_reference(adjacency(dg), labels, train, classes, 20, 0.9, Norm.SYMMETRIC,
                           rows)
    np.testing.assert_allclose(scores.to_numpy(), want, rtol=1e-4, atol=1e-6)
    if name == "cora":
        test = dg.split_mask("test").to_numpy()
        accuracy = np.mean(want.argmax(1)[test] == labels[test])
        majority = np.mean(labels[test] == np.bincount(labels[train]).argmax())
        assert accuracy > majority + 0.4, (accuracy, majority)


def test_a_node_no_label_reaches_predicts_the_class_prior(tmp_path):
    """Two components: labels only in the first; every node of the second, which no
    label reaches, scores the training labels' frequencies, so it predicts their
    majority class (2), not class 0."""
    a_edges = np.array([[0, 1], [1, 2], [2, 3], [3, 0]]).T       # labelled ring
    b_edges = np.array([[4, 5], [5, 6], [6, 4]]).T               # unreached ring
    src, dst = np.concatenate([a_edges, b_edges], axis=1)
    both = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])
    labels = np.array([2, 2, 1, 0, 0, 1, 2], np.int64)
    graph = Graph(name="apart", num_nodes={"_N": 7}, edges={("_N", "_E", "_N"): both},
                  node_data={"_N": {"label": labels, "orig": np.arange(7)}},
                  splits={"_N": {"train": np.array([0, 1, 2])}})
    partition_graph(graph, 2, "random", tmp_path / "parts")
    dg = DistGraph(tmp_path / "parts", make_mesh(2, first_devices(2)))
    got = label_propagation(dg, dg.ndata("label"), dg.split_mask("train"), 3, steps=10,
                            alpha=0.9).to_numpy()
    far = np.isin(dg.ndata("orig").to_numpy(), [4, 5, 6])      # rows: as partitioned
    assert far.sum() == 3
    np.testing.assert_allclose(got[far], np.tile([0.0, 1 / 3, 2 / 3], (3, 1)), rtol=1e-6)
    assert (got[far].argmax(1) == 2).all() and (got[~far].sum(1) > 0).all()


# -- Correct & Smooth ----------------------------------------------------------------------


def cs_reference(a, soft, labels, train, rows, *, steps1, alpha1, steps2, alpha2,
                 autoscale, scale=1.0):
    """PyG's CorrectAndSmooth (correct, then smooth) over the dense adjacency of every
    node; soft, labels, train: the labelled type's rows, at global ids `rows`."""
    n, classes = a.shape[0], soft.shape[1]
    truth = np.eye(classes)[labels]
    error = np.zeros((n, classes))
    error[rows[train]] = truth[train] - soft[train]
    degree = a.sum(axis=1)
    inv = np.where(degree > 0, 1 / np.maximum(degree, 1), 0)
    s = np.sqrt(inv)[:, None] * a * np.sqrt(inv)[None]

    def prop(y0, steps, alpha, after):
        y = y0.copy()
        for _ in range(steps):
            y = after((1 - alpha) * y0 + alpha * s @ y)
        return y

    if autoscale:
        spread = prop(error, steps1, alpha1, lambda y: np.clip(y, -1, 1))[rows]
        sigma = np.abs(error[rows[train]]).sum() / train.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = sigma / np.abs(spread).sum(axis=1, keepdims=True)
        factor[np.isinf(factor) | (factor > 1000)] = 1.0
        corrected = soft + factor * spread
        corrected = np.where(np.isnan(corrected), soft, corrected)
    else:
        def fix(y):
            y[rows[train]] = error[rows[train]]
            return y
        corrected = soft + scale * prop(error, steps1, alpha1, fix)[rows]
    start = np.zeros((n, classes))
    start[rows] = np.where(train[:, None], truth, corrected)
    return prop(start, steps2, alpha2, lambda y: np.clip(y, 0, 1))[rows]


@pytest.mark.parametrize("name,parts,autoscale", [
    ("cora", 4, True), pytest.param("cora", 1, False, marks=SLOW),
    pytest.param("two_types", 4, True, marks=SLOW)])
def test_correct_and_smooth_equals_pygs_formulas_and_lifts_a_weak_base(
        tmp_path_factory, name, parts, autoscale):
    """A weak base predictor (softmax of small random logits) corrected and smoothed on
    the mesh equals the dense reference of PyG's formulas, autoscaled or with a fixed
    scale; on cora, autoscaled, it gains what the graph's labels carry (test accuracy
    from chance to label propagation's level)."""
    dg = opened(name, parts, str(tmp_path_factory.getbasetemp()))
    rng = np.random.default_rng(1)
    layout, rows, labels, train = labelled(dg, name, rng)
    classes = int(labels.max()) + 1
    logits = 0.5 * rng.normal(size=(rows.size, classes))
    soft = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    on = lambda x: DistTensor.from_numpy(dg.mesh, layout, x)
    settings = dict(steps1=10, alpha1=0.8, steps2=10, alpha2=0.7, autoscale=autoscale,
                    scale=0.9)
    got = correct_and_smooth(dg, on(soft.astype(np.float32)), on(labels.astype(np.int32)),
                             on(train), correct_steps=10, correct_alpha=0.8,
                             smooth_steps=10, smooth_alpha=0.7, autoscale=autoscale,
                             scale=0.9).to_numpy()
    want = cs_reference(adjacency(dg), soft, labels, train, rows, **settings)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if name == "cora" and autoscale:
        # The default (autoscaled) correction carries the labels as far as label
        # propagation does (its test accuracy here: 0.71): measured 0.146 -> 0.706.
        test = dg.split_mask("test").to_numpy()
        base = np.mean(soft.argmax(1)[test] == labels[test])
        lifted = np.mean(want.argmax(1)[test] == labels[test])
        assert base < 0.25 and lifted > 0.65, (base, lifted)
