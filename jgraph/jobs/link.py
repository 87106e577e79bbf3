"""The fused SPMD step for link prediction, and its ranking evaluation.

Per device, inside one `shard_map` program: take this step's positive edges from the
`EdgeLoader` (those whose destination the device owns), draw their negatives
(`NegativeSampler`), deduplicate every endpoint into the seeds, sample their blocks
(remote seeds through the exchange), mask the batch's own edges and their reverses out
of the blocks (`exclude_pairs`), fetch the input rows, embed the seeds, score the
positives and negatives with the decoder and take the loss. As for node
classification, each device differentiates its sum and the gradients are divided by
the global count, so 8 devices equal one device computing the same blocks.

Evaluation ranks each validation or test positive against its fixed negatives (stored
with the partition, OGB's protocol): MRR and Hits@k over the embeddings of every node,
computed by sampled blocks (`train.eval_fanouts`) or by layer-wise full-graph
inference.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jgraph.config import ConfigError
from jgraph.data.outputs import What
from jgraph.data.prepare import HeldOut, Preparation
from jgraph.jobs.experiment import Experiment, Inference, LinkLoss, Task
from jgraph.jobs.inputs import NodeInputs
from jgraph.jobs.kind import JobKind
from jgraph.jobs.programs import Programs
from jgraph.jobs.run import (
    Run,
    build_model,
    check_features,
    check_one_hot,
    input_width,
    job_fields,
    sparse_optimizer,
    with_caches,
)
from jgraph.jobs.step import Job, Outcome, StepData
from jgraph.jobs.table import register
from jgraph.mesh import REPLICATED, ROWS, replicated
from jgraph.models.link import LinkPredictor
from jgraph.progress import Progress
from jgraph.sampling import NodeLoader
from jgraph.sampling.edges import (
    EdgeBatch,
    EdgeLoader,
    NegativeSampler,
    TypeTable,
    exclude_pairs,
    link_seeds,
)
from jgraph.sharded.graph import ShardedGraph


def link_loss(pos, neg, mask, neg_mask, kind: LinkLoss):
    """(loss sum, weight, correct, count): the loss is `sum / weight` once summed over
    devices; correct counts the positives scored above all their negatives."""
    pos = pos.astype(jnp.float32)
    neg = neg.astype(jnp.float32)
    count = jnp.sum(mask, dtype=jnp.int32)
    beaten = jnp.any(neg_mask & (neg >= pos[:, None]), axis=1)
    correct = jnp.sum(mask & ~beaten, dtype=jnp.int32)
    if kind is LinkLoss.BCE:
        terms = jax.nn.softplus(-pos) + jnp.sum(jnp.where(neg_mask, jax.nn.softplus(neg), 0.0),
                                                axis=1)
        weight = count + jnp.sum(neg_mask & mask[:, None], dtype=jnp.int32)
    else:
        logits = jnp.concatenate([pos[:, None], jnp.where(neg_mask, neg, -jnp.inf)], axis=1)
        terms = -jax.nn.log_softmax(logits, axis=1)[:, 0]
        weight = count
    return jnp.sum(jnp.where(mask, terms, 0.0)), weight, correct, count


class LinkBatch(NamedTuple):
    """One device's batch: blocks (the batch's edges excluded), input rows and their
    validity, the endpoints' rows among the seeds (`LinkSeeds`), the positives'
    relations and mask, the stats (sample first) and the excluded slot count."""

    blocks: tuple
    rows: dict
    valid: dict
    ends: Any
    etype: jax.Array
    mask: jax.Array
    stats: Any
    excluded: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class LinkPrediction(Job):
    """The job of a link prediction run: the `Job`'s fields (the loader an
    `EdgeLoader`), the negatives, the node type table they are drawn with, the loss,
    and whether the batch's edges are excluded from its blocks."""

    negatives: NegativeSampler = dataclasses.field(kw_only=True)
    table: TypeTable = dataclasses.field(kw_only=True)
    loss: LinkLoss = LinkLoss.BCE
    exclude: bool = True

    @property
    def seeds_per_step(self) -> int:
        """Seeds one device's batch expands: both ends of each positive and the new
        negative endpoints."""
        b = self.loader.batch_size
        return 2 * b + self.negatives.candidates(b, self.table.cum.shape[0])

    def batch_seeds(self, order, index):
        """In the step: the endpoints of batch `index` and of its negatives (drawn as
        at step `index`), as seeds; not the device's own."""
        batch = self.loader.batch(order, index)
        ends = link_seeds(batch, *self.negatives.sample(self.table, batch, seed=self.seed,
                                                        step=index, axis=self.exchange.axis))
        return ends.seeds, ends.seeds >= 0, False

    def full_graph_program(self, graph: ShardedGraph, masks=None, mesh=None):
        """The program that embeds every owned node by layer-wise full-graph inference
        (`full_graph_embedding_program`; link prediction has no splits of nodes)."""
        return full_graph_embedding_program(self, graph, mesh)

    # -- inside the step -----------------------------------------------------------------

    def fetch_edges(self, data: StepData, embeddings, batch: EdgeBatch, step,
                    exclude: bool) -> LinkBatch:
        """Draw the negatives of this device's positives `batch`, sample the blocks of
        every endpoint (the batch's pairs excluded when `exclude`) and fetch the rows."""
        axis = self.exchange.axis
        candidates, where, valid = self.negatives.sample(self.table, batch, seed=self.seed,
                                                         step=step, axis=axis)
        ends = link_seeds(batch, candidates, where, valid)
        sample = self.sampler.sample(data.graph, self.exchange, ends.seeds, ends.seeds >= 0,
                                     seed=self.seed, step=step)
        blocks, excluded = sample.blocks, jnp.int32(0)
        if exclude:
            blocks, excluded = exclude_pairs(blocks, batch.src, batch.dst, batch.mask,
                                             rows=2 * batch.src.shape[0])
        rows, valid_rows, input_stats = self.inputs.fetch(
            self.exchange, data.features, embeddings, sample.input_nodes, caches=data.caches)
        return LinkBatch(blocks, rows, valid_rows, ends, batch.etype, batch.mask,
                         (sample.stats, input_stats), lax.psum(excluded, axis))

    def batch_loss(self, params, embedding_rows, batch: LinkBatch, key=None):
        """(loss sum, `Outcome` weighing the loss's terms: positives, and negatives for
        BCE) of one device's batch."""
        params, rows = self.computing(params, {**batch.rows, **embedding_rows})
        model = nnx.merge(self.graphdef, params)
        h = model(rows, batch.valid, batch.blocks, key).astype(jnp.float32)
        ends = batch.ends
        h_src = h[ends.src]
        pos = model.score(h_src, h[ends.dst], batch.etype)
        neg = model.score(h_src[:, None, :], h[ends.neg], batch.etype[:, None])
        loss, weight, correct, count = link_loss(pos, neg, batch.mask, ends.neg_mask,
                                                 self.loss)
        return loss, Outcome(weight, correct, count)

    def step_metrics(self, batch: LinkBatch) -> dict:
        """The pairs excluded from the batch's blocks (summed over devices)."""
        return {"excluded": batch.excluded}

    def batch_of(self, data: StepData, embeddings, order, index, step) -> LinkBatch:
        """Training batch `index` of positive edges (see `Job.batch_of`),
        the batch's pairs excluded from its blocks when the job says so."""
        return self.fetch_edges(data, embeddings, self.loader.batch(order, index), step,
                                self.exclude)

    def eval_step(self, params, embeddings, data: StepData, order, index):
        """Per device: (seeds int32[B], their embeddings [B, D], stats) of batch `index`
        of the job's loader, without dropout (`outputs_step`'s last layer). Link
        prediction ranks every validation and test edge against its fixed negatives
        (`LinkEvaluator`) with these embeddings: build the job with `evaluating` over a
        `NodeLoader` of the nodes to embed."""
        return self.outputs_step(params, embeddings, data, order, index, What.EMBEDDINGS)

    def eval_specs(self):
        """Seeds and embeddings row-sharded (each device's batch), stats replicated."""
        return ROWS, ROWS, REPLICATED


# -- ranking ----------------------------------------------------------------------------


def ogb_ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """float64[n]: each positive's rank among its negatives, OGB's way: 1 + the mean
    of the optimistic (negatives scored above it) and pessimistic (at or above) counts,
    so ties cost half."""
    pos = np.asarray(pos, np.float64)[:, None]
    neg = np.asarray(neg, np.float64)
    return 1.0 + 0.5 * ((neg > pos).sum(axis=1) + (neg >= pos).sum(axis=1))


def rank_metrics(ranks: np.ndarray, hits=(1, 10, 50)) -> dict:
    """{"mrr", "hits@k"...} of ranks, and the positives' count."""
    ranks = np.asarray(ranks, np.float64)
    out = {"mrr": float(np.mean(1.0 / ranks)) if ranks.size else None}
    for k in hits:
        out[f"hits@{k}"] = float(np.mean(ranks <= k)) if ranks.size else None
    out["count"] = int(ranks.size)
    return out


# Scoring a chunk's negatives by a matmul with every node's embedding costs chunk x N x D
# multiply-adds; gathering their rows, chunk x K x D rows moved. Measured on XLA:CPU
# (22,470 nodes of 128, K = 1,000): the matmul took a sixth of the gather's time, so it
# is used up to this many nodes per negative.
MATMUL_NODES_PER_NEGATIVE = 32


def score_edges(model_params, graphdef, emb: np.ndarray, src, dst, etype, negatives,
                chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(pos float32[n], neg float32[n, K]): the decoder's (`LinkPredictor.score`) scores
    of edges and of each positive's negatives (same source, the negative as
    destination), `chunk` positives at a time. The embeddings go to the device once and
    each chunk reads its rows there (gathering [chunk, K, D] rows on the host and
    copying them over took 23 s of facebook_musae's final evaluation, 35k held-out edges
    with 1,000 negatives each); a chunk's negatives are scored by a matmul with every
    row when the graph has at most `MATMUL_NODES_PER_NEGATIVE` x K nodes."""
    matmul = emb.shape[0] <= MATMUL_NODES_PER_NEGATIVE * max(negatives.shape[1], 1)
    score = _scorer(graphdef, matmul)
    table = jnp.asarray(emb)
    pos = np.empty(len(src), np.float32)
    neg = np.empty(negatives.shape, np.float32)
    for lo in range(0, len(src), chunk):
        at = slice(lo, lo + chunk)
        n = len(src[at])
        pad = lambda a, n=n: np.concatenate([a, np.zeros((chunk - n, *a.shape[1:]), a.dtype)])
        p, q = score(model_params, table, pad(np.asarray(src[at])), pad(np.asarray(dst[at])),
                     pad(np.asarray(negatives[at])), pad(np.asarray(etype[at])))
        pos[at], neg[at] = np.asarray(p)[:n], np.asarray(q)[:n]
    return pos, neg


@functools.cache
def _scorer(graphdef, matmul: bool):
    """jit: (params, emb [N, D], src [c], dst [c], negatives [c, K], etype [c]) -> scores
    of the pairs and of the negatives, read from `emb` on the device (one compilation
    per chunk shape). matmul: each source's query against every row, then the
    negatives' columns; else the negatives' rows gathered."""
    @jax.jit
    def score(params, emb, src, dst, negatives, etype):
        model = nnx.merge(graphdef, params)
        pos = model.score(emb[src], emb[dst], etype)
        query = model.query(emb[src], etype)
        if matmul:
            return pos, jnp.take_along_axis(query @ emb.T, negatives, axis=1)
        return pos, jnp.einsum("cd,ckd->ck", query, emb[negatives])
    return score


class LinkEdges(NamedTuple):
    """An evaluation split's positives and their fixed negatives, every part's, in
    global ids: src, dst, etype [n]; negatives [n, K]."""

    src: np.ndarray
    dst: np.ndarray
    etype: np.ndarray
    negatives: np.ndarray


def eval_edges(dg, split: str) -> LinkEdges:
    parts = [dg.parts.part(k).edge_splits[split] for k in range(dg.num_parts)]
    cat = lambda name: np.concatenate([np.asarray(p[name]) for p in parts])
    return LinkEdges(cat("src"), cat("dst"), cat("etype"), cat("negatives"))


def to_host(array: jax.Array) -> np.ndarray:
    """A sharded array on every process's host (replicated first)."""
    return np.asarray(_replicate(array.sharding.mesh)(array))


@functools.cache
def _replicate(mesh):
    return jax.jit(lambda x: x, out_shardings=replicated(mesh))


def embedding(run):
    """The run's job embedding every node with the evaluation fanouts."""
    t = run.config.train
    return run.job.evaluating(NodeLoader.every_node(run.dg, batch_size=t.eval_batch_size),
                              t.eval_fanouts)


class NodeEmbedder:
    """Every node's embedding by sampled blocks with the evaluation fanouts (one
    compilation, at the first call: `compile_seconds`)."""

    def __init__(self, run, on_trace=None):
        dg = run.dg
        self.job = embedding(run)
        self.loader, self.dg = self.job.loader, dg
        self.program = self.job.compile_eval(dg.graph, on_trace)
        self.data = self.job.data(dg.graph)
        self.order = self.loader.epoch_order(0)
        self.compiled = None
        self.compile_seconds: float | None = None

    def __call__(self, params, embeddings) -> np.ndarray:
        from jgraph.jobs.run import check_stats
        if self.compiled is None:
            start = time.perf_counter()
            self.compiled = self.program.lower(params, embeddings, self.data, self.order,
                                               jnp.int32(0)).compile()
            self.compile_seconds = time.perf_counter() - start
        out = None
        for i in range(self.loader.steps_per_epoch):
            seeds, h, stats = self.compiled(params, embeddings, self.data, self.order,
                                            jnp.int32(i))
            check_stats(jax.device_get(stats))
            seeds, h = to_host(seeds), to_host(h)
            if out is None:
                out = np.zeros((self.dg.meta.num_nodes, h.shape[1]), np.float32)
            real = seeds >= 0
            out[seeds[real]] = h[real]
        return out


class LinkEvaluator:
    """MRR and Hits@k (`link.hits`) of edge splits: every node embedded by sampled
    blocks (`NodeEmbedder`, compiled once) or by full-graph inference, then each
    positive ranked against its fixed negatives (`ogb_ranks`)."""

    def __init__(self, run, inference: Inference, on_trace=None):
        self.run, self.inference = run, inference
        self.embedder = (NodeEmbedder(run, on_trace)
                         if inference is Inference.SAMPLED else None)
        self.edges: dict[str, LinkEdges] = {}

    @property
    def compile_seconds(self) -> float | None:
        return None if self.embedder is None else self.embedder.compile_seconds

    def embed(self, params, embeddings) -> np.ndarray:
        if self.embedder is not None:
            return self.embedder(params, embeddings)
        return full_graph_embeddings(self.run, params, embeddings)

    def __call__(self, params, embeddings, splits=("val",)) -> dict:
        """{split: {"mrr", "hits@k"..., "count"}}."""
        emb = self.embed(params, embeddings)
        out = {}
        for split in splits:
            if split not in self.edges:
                self.edges[split] = eval_edges(self.run.dg, split)
            e = self.edges[split]
            pos, neg = score_edges(params, self.run.job.graphdef, emb, e.src, e.dst, e.etype,
                                   e.negatives)
            out[split] = rank_metrics(ogb_ranks(pos, neg), self.run.config.link.hits)
        return out


def full_graph_embedding_program(job: LinkPrediction, graph: ShardedGraph, mesh=None):
    """jit(shard_map(...)): (params, embeddings, data) -> (each device's own nodes'
    embeddings [n, D] row-sharded, ids lost by the exchange), on the job's mesh or on
    `mesh` (to build it for other hardware, see `jgraph.target`): the last layer's rows
    of `full_graph_rows_program`."""
    from jgraph.jobs.inference import full_graph_rows_program
    return full_graph_rows_program(job, graph, What.EMBEDDINGS, None, mesh)


def full_graph_embeddings(run, params, embeddings) -> np.ndarray:
    """float32[N, D]: every node's embedding by layer-wise full-graph inference."""
    job, dg = run.job, run.dg
    h, lost = full_graph_embedding_program(job, dg.graph)(params, embeddings,
                                                          job.data(dg.graph))
    if int(lost):
        from jgraph.exchange import ExchangeOverflowError
        raise ExchangeOverflowError(f"full-graph inference: {int(lost)} id(s) were lost by "
                                    f"the exchange; leave ExchangeConfig.max_capacity None")
    h = to_host(h)
    h = h.reshape(dg.num_parts, -1, h.shape[-1])
    sizes = np.diff(np.asarray(dg.book.offsets))
    return np.concatenate([h[k, :sizes[k]] for k in range(dg.num_parts)]).astype(np.float32)


def link_model(config: Experiment, inputs: NodeInputs, num_relations: int) -> LinkPredictor:
    """The link predictor of `config.model` and `config.link`: a node classifier of
    model.hidden classes has its encoder and GNN (both embed nodes model.hidden wide),
    then the decoder, all drawn from one stream of train.seed."""
    m, rngs = config.model, nnx.Rngs(config.train.seed)
    classifier = build_model(config, inputs, m.hidden, num_relations, rngs)
    return LinkPredictor(classifier.encoder, classifier.gnn, config.link.decoder, m.hidden,
                         num_relations, rngs=rngs)


def link_fields(config: Experiment, table: TypeTable) -> dict:
    """`LinkPrediction`'s own fields from `config.link`; table: the node types' (the
    partitioned graph's, or the counts')."""
    link = config.link
    return dict(negatives=NegativeSampler(link.negatives, link.negative_sampler),
                table=table, loss=link.loss, exclude=link.exclude)


class LinkPredictions(JobKind):
    """Link prediction (`task: link`): a `LinkPrediction` job over the partition's
    training edges; the model embeds nodes at model.hidden and scores edges, ranked
    against fixed negatives (MRR, Hits@k)."""

    task = Task.LINK
    title = "link prediction"
    node_splits = False
    classifies = False
    timed_by_phase = False
    rate = "edges_per_s"
    train_key = "train_hits_1"
    """A positive scored above all its batch's negatives."""
    validation_key = "val_mrr"

    def preparation(self, config: Experiment) -> Preparation:
        """The data section's steps, and the held-out edges the run is scored on."""
        link = config.link
        return dataclasses.replace(super().preparation(config), held_out=HeldOut(
            link.val_fraction, link.test_fraction, link.eval_negatives, link.split_seed))

    def output_width(self, config: Experiment, num_classes: int) -> int:
        """Node embeddings model.hidden wide."""
        return config.model.hidden

    def bench_fields(self, run: Run, job, state) -> dict:
        link = run.config.link
        fields = super().bench_fields(run, job, state)
        fields["edges_per_epoch"] = fields.pop("seeds_per_epoch")
        return {**fields, "negatives": link.negatives,
                "negative_sampler": link.negative_sampler.value, "exclude": link.exclude}

    def build(self, config: Experiment, dg, platform: str | None = None) -> Run:
        t, m = config.train, config.model
        if "train" not in dg.meta.edge_splits:
            raise ConfigError(f"{dg.parts.root} holds no training edges for link prediction "
                              f"(its edge splits: {sorted(dg.meta.edge_splits) or 'none'}); "
                              f"give data.path a graph to split, not a node classification "
                              f"partition")
        check_features(config, dg)
        num_relations = dg.graph.num_relations
        # The encoder's last layer gives each node a hidden-wide embedding: that is the
        # width one-hot inputs are laid out for (in place of node classification's
        # classes).
        width = input_width(config, m.hidden, num_relations)
        inputs = NodeInputs.of(dg, feature=config.data.feature, embedding_dim=width,
                               optimizer=sparse_optimizer(config), learnable=m.learnable_inputs)
        check_one_hot(config, inputs)
        graphdef, params = nnx.split(link_model(config, inputs, num_relations), nnx.Param)
        try:
            loader = EdgeLoader.from_split(dg, "train", batch_size=t.batch_size,
                                           drop_last=t.drop_last, seed=t.seed)
        except ValueError as e:
            raise ConfigError(f"train.batch_size: {e}") from None
        job = LinkPrediction(graphdef, loader=loader, **link_fields(config, TypeTable.of(dg)),
                             **job_fields(config, dg.exchange(config.exchange, platform),
                                          inputs))
        return Run(config, dg, None, 0, with_caches(config, dg, job), params, self)

    def programs(self, run: Run) -> Programs:
        """Sampled evaluation embeds every node; full-graph inference too."""
        return Programs(run.job, run.dg.graph, run.params, embedding(run), None)

    def describe(self, run: Run) -> str:
        return f"{run.job.loader.num_seeds:,} positive training edges"

    def has_split(self, run: Run, split: str) -> bool:
        meta = run.dg.meta             # a split held out with fraction 0 is empty
        return split in meta.edge_splits and sum(p.edge_splits[split]
                                                 for p in meta.parts) > 0

    def validation(self, run: Run, on_trace=None, progress: Progress | None = None):
        if not run.has_split("val"):
            return None
        return LinkEvaluator(run, Inference.SAMPLED, on_trace)

    def evaluate(self, run: Run, params, embeddings, splits, inference: Inference,
                 evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
        """Every split ranked with one embedding of the nodes (the validation's
        sampled evaluator reused where it embeds as asked)."""
        present = [s for s in splits if run.has_split(s)]
        out = dict.fromkeys(splits)
        evaluator = (evaluators or {}).get("val")
        if inference is not Inference.SAMPLED or not isinstance(evaluator, LinkEvaluator):
            evaluator = LinkEvaluator(run, inference, on_trace)
        if present:
            out.update(evaluator(params, embeddings, present))
        return out

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        val = scores["val"]
        return {f"val_{k}": v for k, v in val.items() if k != "count"}, val["mrr"]

    def final_scores(self, final: dict, config: Experiment) -> dict:
        keys = ["mrr", *(f"hits@{k}" for k in config.link.hits)]
        return {f"{split}_{key}": None if final[split] is None else final[split][key]
                for split in ("val", "test") for key in keys}


register(LinkPredictions())
