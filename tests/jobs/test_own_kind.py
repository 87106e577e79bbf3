"""A kind of job written in this file alone: label-smoothed node classification, one job
class and one kind, put in the job table by one line (`register`). It trains,
evaluates, embeds, benches and compiles abstractly as the kinds jgraph ships do, and
nothing in jgraph names it: a kind owns all of itself."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jgraph.bench.config import TrainBench
from jgraph.bench.train import bench_train
from jgraph.config import ConfigError
from jgraph.exchange.config import ExchangeConfig
from jgraph.jobs import kind_of, register, unregister
from jgraph.jobs.abstract import abstract_graph, counts_of
from jgraph.jobs.experiment import DataConfig, Experiment, ModelConfig, TrainConfig
from jgraph.jobs.sampled import SampledNodes
from jgraph.jobs.step import NodeClassification, Outcome
from jgraph.planner.compile import compile_abstract
from jgraph.progress import Progress
from jgraph.target import Target, target_mesh
from jgraph.train.api import evaluate, train
from jgraph.train.embed import embed

pytestmark = pytest.mark.slow     # a training run, a bench and a compile

SMOOTHING = 0.1
CORA_NODES, CORA_TRAIN = 2708, 140
CORA_MAJORITY = 0.319             # the most frequent class's share of Cora's test nodes


class SmoothedClassification(NodeClassification):
    """Sampled node classification whose loss is cross-entropy against labels smoothed
    by SMOOTHING (optax.smooth_labels)."""

    def batch_loss(self, params, embedding_rows, batch, key=None):
        params, rows = self.computing(params, {**batch.rows, **embedding_rows})
        model = nnx.merge(self.graphdef, params)
        logits = model(rows, batch.valid, batch.blocks, key).astype(jnp.float32)
        labels = jnp.where(batch.label_mask, batch.labels, 0)
        target = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), SMOOTHING)
        losses = optax.softmax_cross_entropy(logits, target)
        correct = (jnp.argmax(logits, axis=-1) == labels) & batch.label_mask
        count = jnp.sum(batch.label_mask, dtype=jnp.int32)
        return (jnp.sum(jnp.where(batch.label_mask, losses, 0.0)),
                Outcome(count, jnp.sum(correct, dtype=jnp.int32), count, logits))


class SmoothedNodes(SampledNodes):
    task = "smoothed_node"
    title = "label-smoothed node classification"
    job_class = SmoothedClassification


def config_of(path: str = "cora", **train) -> Experiment:
    return Experiment(name="smoothed", task="smoothed_node",
                      data=DataConfig(path=path, num_parts=2, normalize_features=True),
                      model=ModelConfig(hidden=32, num_layers=2),
                      train=TrainConfig(fanouts=(5, 5), eval_fanouts=(-1, -1), lr=0.01,
                                        batch_size=32, **train))


@pytest.fixture(scope="module")
def smoothed():
    kind = register(SmoothedNodes())          # the one line that adds a kind
    yield kind
    unregister(kind)


@pytest.fixture(scope="module")
def trained(smoothed, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoothed")
    # A one-rung exchange ladder: one compiled branch a transfer, the same numbers
    # (tests/train/test_loop.py's run does the same).
    config = dataclasses.replace(config_of(epochs=5), exchange=ExchangeConfig(max_rungs=1))
    return workdir, train(config, str(workdir), progress=False)


def test_the_config_names_the_kind_and_nothing_else_trains_it(smoothed):
    assert kind_of(config_of()) is smoothed
    unregister(smoothed)
    try:
        with pytest.raises(ConfigError, match="no kind of job trains task smoothed_node"):
            config_of()
    finally:
        register(smoothed)


def test_it_trains_and_evaluates_as_the_shipped_kinds(smoothed, trained):
    workdir, result = trained
    assert result["config"]["task"] == "smoothed_node" and result["devices"] == 2
    # Its kind's fields: node classification's scores, well above the majority class.
    assert result["test_acc"] > CORA_MAJORITY + 0.2, result
    rows = (workdir / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(row)["loss"] for row in rows]
    assert len(losses) == 5 and losses[-1] < losses[0]
    # The saved model evaluates to the run's own scores (its kind's evaluation).
    scores = evaluate(str(workdir), ("test",))
    assert scores["test"]["acc"] == pytest.approx(result["test_acc"])


def test_it_embeds_every_node(smoothed, trained, tmp_path):
    workdir, _ = trained
    out = embed(str(workdir), str(tmp_path / "out"), progress=Progress(enabled=False))
    assert out["rows"] == CORA_NODES and out["width"] == 32     # the last hidden layer


def test_it_benches(smoothed):
    bench = TrainBench(data=DataConfig(path="cora", num_parts=2),
                       model=ModelConfig(hidden=32, num_layers=2),
                       train=TrainConfig(fanouts=(5, 5), eval_fanouts=(5, 5), epochs=1,
                                         batch_size=64), task="smoothed_node")
    row = bench_train(bench, Progress(enabled=False))
    assert row["task"] == "smoothed_node" and row["seeds_per_epoch"] == CORA_TRAIN
    assert np.isfinite(row["final_loss"]) and row["refused_steps"] == 0


def test_it_compiles_abstractly(smoothed):
    config = config_of("synthetic:nodes=20k,edges=200k,feat=16,classes=5")
    # Its own build, over a graph of shapes: nothing of it is written for compiling.
    graph = abstract_graph(config, counts_of(config, 2), target_mesh(Target.CPU, 2))
    run = smoothed.build(config, graph, "cpu")
    assert type(run.job) is SmoothedClassification and run.dg.abstract
    assert isinstance(run.job.labels.array, jax.ShapeDtypeStruct)
    report = compile_abstract(config, Target.CPU, 2)
    assert report["ok"] and report["devices"] == 2
