"""A trained featureless run's classes, as `jgraph embed`, `jgraph.load_run` and Correct &
Smooth's base read them: a labelled node that no signal reaches gives the class prior
(`jgraph.jobs.signal`), every other node the model's own outputs."""
import dataclasses
import json

import numpy as np
import pytest

from jgraph import load_run, read_embeddings
from jgraph.data.outputs import What
from jgraph.jobs.inference import full_graph_rows_program
from jgraph.jobs.propagation import labelled_rows
from jgraph.jobs.signal import host_signal, signal_of
from jgraph.progress import Progress
from jgraph.train.embed import embed
from jgraph.train.loop import train_and_evaluate
from jgraph.train.model import open_trained
from tests.jobs.test_signal import EPOCHS, config, partitioned

PARTS = 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("far")
    base = config(partitioned(PARTS, str(root)), PARTS)
    experiment = dataclasses.replace(base, train=dataclasses.replace(base.train,
                                                                     epochs=EPOCHS))
    train_and_evaluate(experiment, str(root / "run"), Progress(enabled=False))
    return str(root / "run")


@pytest.mark.slow        # a training run, then full-graph inference and sampled outputs
def test_unreached_nodes_are_exported_and_answered_with_the_prior(workdir, tmp_path):
    run, params, embeddings = open_trained(workdir, Progress(enabled=False))
    reached, prior = host_signal(run, signal_of(run, embeddings))
    assert 0 < reached.sum() < reached.size            # both kinds of node are there
    majority = int(np.argmax(prior))
    # The model's own predictions (no signal), by labelled row.
    rows, _ = full_graph_rows_program(run.job, run.dg.graph, What.PROBABILITIES, None)(
        params, embeddings, run.job.data(run.dg.graph))
    own = labelled_rows(run.dg, run.job.labels.layout, rows).to_numpy()
    assert (np.argmax(own[~reached], axis=1) != majority).any()   # noise, without it
    # jgraph embed: unreached items get the prior, reached ones the model's softmax.
    embed(workdir, str(tmp_path / "p"), what=What.PROBABILITIES, node_type="item",
          progress=Progress(enabled=False))
    ids, probs = read_embeddings(tmp_path / "p", "item")
    by_id = np.empty_like(probs)
    by_id[ids] = probs
    far, own_by_id = by_original_id(run, ~reached), by_original_id(run, own)
    np.testing.assert_allclose(by_id[far], np.broadcast_to(prior, (far.sum(), prior.size)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(by_id[~far], own_by_id[~far], rtol=1e-5, atol=1e-6)
    # load_run answers as the export.
    answered = load_run(workdir).predict(ids, "item")
    np.testing.assert_array_equal(answered, np.argmax(probs, axis=1))
    assert (answered[far[ids]] == majority).all()
    # The result counts them: each split's nodes that no signal reaches.
    with open(f"{workdir}/result.json") as f:
        result = json.load(f)
    for split in ("val", "test"):
        mask = run.dg.split_mask(split, run.target).to_numpy().astype(bool)
        assert result[f"unreached_{split}"] == int(np.sum(mask & ~reached))
    assert result["unreached_val"] + result["unreached_test"] > 0


def by_original_id(run, values: np.ndarray) -> np.ndarray:
    """`values` of the labelled type's rows (row order, as `DistTensor.to_numpy`),
    indexed by the type's original ids instead."""
    book = run.dg.book
    start = run.dg.meta.orig_type_offsets[book.node_types.index(run.target)]
    original = run.dg.parts.node_map()[run.job.labels.layout.global_ids()] - start
    out = np.empty_like(values)
    out[original] = values
    return out
