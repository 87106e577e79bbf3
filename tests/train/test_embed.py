"""`jgraph embed`: a saved model's outputs for every node, in original node ids.

A GraphSAGE run on cora (4 METIS parts on 4 simulated devices, one epoch) writes:
  * its hidden layer's rows and its logits, equal to the same model on one device over
    the whole graph (the dense reference of test_inference.py) to 1e-5, each original
    id once;
  * predicted classes whose test accuracy (against cora's own labels, by original id)
    is the one `jgraph eval --inference full` reports, and probabilities that are the
    logits' softmax;
  * a node list's rows, the same as those of the whole output;
  * under the launcher as 2 processes x 2 devices, the same rows for the same ids as
    1 process x 4 devices;
an R-GCN link run on ACM's three node types writes each type's rows, those link
evaluation scores; and every bad input is refused by name.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jgraph.bench.exchange import global_csc
from jgraph.config import ConfigError, load
from jgraph.data import load_dataset, load_npz, read_embeddings
from jgraph.data.outputs import OutputsError
from jgraph.jobs.experiment import Experiment, Inference
from jgraph.jobs.link import full_graph_embeddings
from jgraph.partition import partition_graph
from jgraph.progress import Progress
from jgraph.train.embed import OutputExists, embed
from jgraph.train.loop import train_and_evaluate
from jgraph.train.model import evaluate_run, open_trained

pytestmark = pytest.mark.slow     # trains a run, then full-graph programs


def _inference_tests():
    """test_inference.py, whose dense single-device reference this module reuses (the
    suite imports test modules by path, not as a package)."""
    path = Path(__file__).parents[1] / "jobs" / "test_inference.py"
    spec = importlib.util.spec_from_file_location("jgraph_tests_inference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dense_reference = _inference_tests().dense_reference

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = str(ROOT / "experiments" / "sage_cora.yaml")
# The partition below is Cora as it is: the config asks for no other preparation.
SETTINGS = ["data.num_parts=4", "train.epochs=1", "train.batch_size=64", "model.hidden=16",
            "train.fanouts=[5,5]", "train.eval_fanouts=[5,5]", "exchange.max_rungs=1",
            "data.normalize_features=false"]


@pytest.fixture(scope="module")
def cora():
    return load_dataset("cora")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cora):
    parts = tmp_path_factory.mktemp("cora4-embed") / "parts"
    partition_graph(cora, 4, "metis", parts)
    workdir = tmp_path_factory.mktemp("cora4-run")
    config = load(Experiment, EXPERIMENT, SETTINGS + [f"data.path={parts}"])
    train_and_evaluate(config, str(workdir), Progress(enabled=False))
    return str(workdir)


@pytest.fixture(scope="module")
def reference(workdir):
    """(every layer's rows by original id: {1: hidden, 2: logits}) of the saved model on
    one device over the whole graph."""
    run, params, _ = open_trained(workdir)
    dg = run.dg
    model = nnx.merge(run.job.graphdef, params)
    feat = run.job.inputs.features["_N"].to_numpy()
    x = model.encoder({"_N": jnp.asarray(feat)}, {"_N": jnp.ones(feat.shape[0], bool)})
    indptr, indices = global_csc(dg)
    by_new = {k: dense_reference(model, x, indptr, indices, depth=k) for k in (1, 2)}
    # Row i of by_new is the node of new id i; the outputs speak original ids.
    order = np.asarray(dg.parts.node_map())        # new id -> original id
    return {k: rows[np.argsort(order)] for k, rows in by_new.items()}


def by_id(out, n):
    """The rows of an output directory in original-id order, each id there once."""
    ids, values = read_embeddings(out)
    assert np.array_equal(np.sort(ids), np.arange(n))
    return np.asarray(values)[np.argsort(ids)]


def test_hidden_rows_and_logits_equal_the_dense_single_device_model(workdir, reference,
                                                                   cora, tmp_path):
    n = cora.num_nodes["_N"] if isinstance(cora.num_nodes, dict) else cora.num_nodes
    hidden = embed(workdir, str(tmp_path / "hidden"))
    assert hidden["layer"] == 1 and hidden["width"] == 16 and hidden["rows"] == n
    np.testing.assert_allclose(by_id(tmp_path / "hidden", n), reference[1],
                               rtol=1e-5, atol=1e-5)
    embed(workdir, str(tmp_path / "logits"), what="logits")
    logits = by_id(tmp_path / "logits", n)
    np.testing.assert_allclose(logits, reference[2], rtol=1e-5, atol=1e-5)
    # --layer 2 is the logits; the hidden rows are not the logits.
    embed(workdir, str(tmp_path / "layer2"), layer=2)
    np.testing.assert_allclose(by_id(tmp_path / "layer2", n), logits, rtol=1e-6, atol=1e-6)
    assert reference[1].shape[1] != reference[2].shape[1]


def test_predictions_score_as_full_graph_evaluation_and_probabilities_are_the_softmax(
        workdir, reference, cora, tmp_path):
    n = reference[2].shape[0]
    embed(workdir, str(tmp_path / "pred"), what="predictions")
    pred = by_id(tmp_path / "pred", n)
    assert pred.dtype == np.int32 and pred.shape == (n,)
    test = np.asarray(cora.splits["_N"]["test"])
    labels = np.asarray(cora.node_data["_N"]["label"])
    accuracy = float(np.mean(pred[test] == labels[test]))
    scores = evaluate_run(workdir, ("test",), Inference.FULL)
    assert scores["test"]["count"] == test.size
    assert accuracy == pytest.approx(scores["test"]["acc"], abs=1e-12)
    assert accuracy > 1 / 7          # trained: better than one class of seven
    embed(workdir, str(tmp_path / "prob"), what="probabilities")
    prob = by_id(tmp_path / "prob", n)
    logits = reference[2] - reference[2].max(1, keepdims=True)
    want = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(prob, want, rtol=1e-4, atol=1e-6)
    assert np.array_equal(pred, prob.argmax(1))


def test_a_node_list_gets_exactly_its_rows(workdir, reference, tmp_path):
    listed = np.array([2707, 0, 5, 1200, 5])          # a repeat is written once
    path = tmp_path / "nodes.txt"
    path.write_text("# cora ids\n" + "\n".join(map(str, listed)) + "\n")
    out = embed(workdir, str(tmp_path / "some"), nodes=str(path), node_type="_N")
    assert out["rows"] == 4
    ids, values = read_embeddings(tmp_path / "some", "_N")
    assert sorted(ids.tolist()) == [0, 5, 1200, 2707]
    np.testing.assert_allclose(values, reference[1][ids], rtol=1e-5, atol=1e-5)
    np.save(tmp_path / "nodes.npy", np.array([7, 3], np.int64))
    ids, _ = read_embeddings(embed(workdir, str(tmp_path / "npy"),
                                   nodes=str(tmp_path / "nodes.npy"))["out"])
    assert sorted(ids.tolist()) == [3, 7]


def test_load_run_answers_a_few_nodes_as_the_whole_graph_outputs(workdir, reference, cora):
    from jgraph import load_run
    run = load_run(workdir)
    ids = np.array([2707, 0, 5, 1200, 5])              # in this order, repeats too
    exact = [-1, -1]
    np.testing.assert_allclose(run.embed(ids, fanouts=exact), reference[1][ids],
                               rtol=1e-5, atol=1e-5)
    logits = run.logits(ids, fanouts=exact)
    np.testing.assert_allclose(logits, reference[2][ids], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run.predict(ids, fanouts=exact), logits.argmax(1))
    prob = run.probabilities(ids, fanouts=exact)
    np.testing.assert_allclose(prob.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(prob.argmax(1), logits.argmax(1))
    # The run's eval fanouts (5, 5) sample as its sampled evaluation does: the test
    # nodes' predictions score its accuracy; every neighbour scores full-graph's.
    test = np.asarray(cora.splits["_N"]["test"])
    labels = np.asarray(cora.node_data["_N"]["label"])[test]
    sampled = evaluate_run(workdir, ("test",), Inference.SAMPLED)["test"]["acc"]
    full = evaluate_run(workdir, ("test",), Inference.FULL)["test"]["acc"]
    assert np.mean(run.predict(test) == labels) == pytest.approx(sampled, abs=1e-12)
    assert np.mean(run.predict(test, fanouts=exact) == labels) == pytest.approx(full,
                                                                              abs=1e-12)
    compiled = len(run._programs)
    np.testing.assert_array_equal(run.predict(test[::-1]), run.predict(test)[::-1])
    assert len(run._programs) == compiled              # the same shapes: no new program


@pytest.mark.parametrize("call, message", [
    (lambda run: run.predict([2708]), "node id 2708 is out of range"),
    (lambda run: run.embed([1], layer=3), "--layer 3: the model has layers 1 to 2"),
    (lambda run: run.predict([1], fanouts=[5]), r"fanouts \[5\]: one per layer, 2"),
    (lambda run: run.predict([1], fanouts=[5, -3]), r"fanouts \[5, -3\]: .*-1 for all"),
    (lambda run: run.outputs([1], what="classes"), "what='classes': one of"),
    (lambda run: run.predict([1], node_type="paper"), "'paper' is not a node type"),
    (lambda run: run.score([1], [2]), "a node classification run scores nodes"),
])
def test_load_run_refuses_bad_requests_by_name(workdir, call, message):
    from jgraph import load_run
    with pytest.raises(ConfigError, match=message):
        call(load_run(workdir))


def test_two_processes_write_the_rows_one_process_writes(workdir, tmp_path):
    one = tmp_path / "one"
    embed(workdir, str(one))
    two = tmp_path / "two"
    proc = subprocess.run(
        [sys.executable, "-m", "jgraph.launch", "--num-processes", "2",
         "--devices-per-process", "2", "--", sys.executable, "-m", "jgraph.cli.main", "embed",
         workdir, "--out", str(two), "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("[rank 0] {")]
    assert len(summary) == 1
    assert json.loads(summary[0].split(" ", 2)[2])["rows"] == 2708
    index = json.loads((two / "index.json").read_text())
    assert [c["ids"] for c in index["node_types"]["_N"]["chunks"]] == [
        f"_N/ids-{p:05d}.npy" for p in range(4)]
    n = 2708
    # The same per-device programs over the same windows: the same rows.
    np.testing.assert_allclose(by_id(two, n), by_id(one, n), rtol=1e-6, atol=1e-6)


def test_an_output_directory_is_replaced_only_with_overwrite(workdir, tmp_path):
    out = tmp_path / "out"
    embed(workdir, str(out), what="predictions")
    with pytest.raises(OutputExists, match="pass --overwrite"):
        embed(workdir, str(out))
    embed(workdir, str(out), overwrite=True)
    assert json.loads((out / "index.json").read_text())["what"] == "embeddings"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(OutputExists, match="is not a jgraph outputs directory"):
        embed(workdir, str(other), overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob("out.partial-*"))


@pytest.mark.parametrize("kwargs, message", [
    ({"layer": 0}, "--layer 0: the model has layers 1 to 2"),
    ({"layer": 3}, "--layer 3: the model has layers 1 to 2"),
    ({"what": "logits", "layer": 1}, "logits come from the last layer"),
    ({"what": "classes"}, "--what 'classes': one of"),
    ({"node_type": "paper"}, "--node-type 'paper' is not a node type"),
    ({"nodes": [0, 2708]}, "node id 2708 is out of range: type '_N' has ids 0 to 2707"),
    ({"nodes": [-1]}, "node id -1 is out of range"),
    ({"nodes": [0.5, 1.0]}, "node ids must be a list of integers, got float64"),
    ({"nodes": "missing.txt"}, "missing.txt: no such node list file"),
])
def test_bad_requests_are_refused_by_name(workdir, tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("'", "'")):
        embed(workdir, str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_workdir_without_a_model_and_a_full_disk_are_refused(workdir, tmp_path,
                                                              monkeypatch):
    with pytest.raises(ConfigError, match="not a trained run"):
        embed(str(tmp_path), str(tmp_path / "out"))
    import jgraph.atomic as atomic  # where the free space is read
    monkeypatch.setattr(atomic.shutil, "disk_usage",
                        lambda path: type("Usage", (), {"free": 1000})())
    with pytest.raises(ConfigError, match="the outputs need about .* MiB and the disk has "
                                          "0.0 MiB free"):
        embed(workdir, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_damaged_index_or_chunk_is_named_by_the_reader(workdir, tmp_path):
    out = tmp_path / "out"
    embed(workdir, str(out), nodes=[1, 2, 3])
    np.save(out / "_N" / "values-00000.npy", np.zeros((1, 16), np.float32))
    with pytest.raises(OutputsError, match="values-00000.npy: 1 rows, the index says"):
        read_embeddings(out)
    (out / "index.json").write_text("{")
    with pytest.raises(OutputsError, match="index.json: unreadable"):
        read_embeddings(out)
    with pytest.raises(OutputsError, match="not a jgraph outputs directory"):
        read_embeddings(tmp_path)


def test_a_link_run_on_three_node_types_writes_each_types_embeddings(shared_data,
                                                                    tmp_path):
    """R-GCN link prediction on ACM (papers, authors, subjects; subjects learn their
    rows), 2 parts: every node of every type once, each row the embedding link
    evaluation scores (the last layer, by full-graph inference); no classes."""
    path = shared_data("heco_acm.npz")
    graph = load_npz(path)
    # Narrow (16 wide, not 64) and sampled thinly: the rows asserted below are the
    # saved model's, whatever it learned. Width is most of the cost of the exact
    # answers of `score` (every in-neighbour of ACM's subjects, up to 2,000, is a slot).
    config = load(Experiment, str(ROOT / "experiments" / "lp_rgcn_acm.yaml"),
                  [f"data.path={path}", "data.num_parts=2", "train.epochs=1",
                   "link.eval_negatives=20", "link.negatives=1", "model.hidden=16",
                   "model.embedding_dim=16", "train.fanouts=[4,4]",
                   "train.eval_fanouts=[4,4]", "exchange.max_rungs=1"])
    workdir = str(tmp_path / "run")
    train_and_evaluate(config, workdir, Progress(enabled=False))
    out = embed(workdir, str(tmp_path / "all"))
    assert out["layer"] == 2 and out["node_types"] == dict(graph.num_nodes)
    run, params, embeddings = open_trained(workdir)
    want = full_graph_embeddings(run, params, embeddings)      # by new id, every type
    node_map = np.asarray(run.dg.parts.node_map())
    starts = np.asarray(run.dg.meta.orig_type_offsets)
    for t, ntype in enumerate(graph.node_types):
        ids, values = read_embeddings(tmp_path / "all", ntype)
        assert np.array_equal(np.sort(ids), np.arange(graph.num_nodes[ntype]))
        new = run.dg.parts.to_new(ntype, ids)
        assert np.array_equal(node_map[new] - starts[t], ids)
        np.testing.assert_allclose(values, want[new], rtol=1e-6, atol=1e-6)
    with pytest.raises(OutputsError, match="name one"):
        read_embeddings(tmp_path / "all")
    with pytest.raises(ConfigError, match="a link prediction model has no classes"):
        embed(workdir, str(tmp_path / "pred"), what="predictions")
    # Pairs scored in original ids: the decoder on those rows, over exact neighbourhoods.
    from jgraph import load_run
    trained = load_run(workdir)
    r = 1
    s_type, name, d_type = trained.relations[r]
    rng = np.random.default_rng(0)
    src = rng.integers(0, graph.num_nodes[s_type], 6)
    dst = rng.integers(0, graph.num_nodes[d_type], 6)
    got = trained.score(src, dst, relation=name, fanouts=[-1, -1])
    model = nnx.merge(run.job.graphdef, params)
    h_src, h_dst = (want[run.dg.parts.to_new(t, i)] for t, i in ((s_type, src),
                                                               (d_type, dst)))
    expected = np.asarray(model.score(jnp.asarray(h_src), jnp.asarray(h_dst),
                                      jnp.full(6, r, jnp.int32)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # The same pairs from a file: the same scores (compared on a cheap sampled
    # neighbourhood, drawn alike on every call; the exact one above is the costly one).
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("\n".join(f"{a} {b}" for a, b in zip(src, dst)) + "\n")
    sampled = trained.score(src, dst, relation=name, fanouts=[2, 2])
    np.testing.assert_allclose(trained.score(str(pairs), relation=(s_type, name, d_type),
                                             fanouts=[2, 2]), sampled, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="name one with relation="):
        trained.score(src, dst)
    with pytest.raises(ConfigError, match="relation 'cites' is not in the graph"):
        trained.score(src, dst, relation="cites")
    with pytest.raises(ConfigError, match="a link prediction model has no classes"):
        trained.predict([0], node_type=s_type)
