"""Control-variate sampling (`train.sampler: control_variate`): VR-GCN (Chen, Zhu and
Song, ICML 2018), where two sampled neighbours per node train as well as all of them.

Every node keeps a *history* of its input to each layer above the first, h̄ (one
row-sharded table per layer: the kind's own state, `TrainState.extra`). Layer l
aggregates, for a dst node v with in-neighbours N(v) of which the batch sampled S(v),

    Σ_{u ∈ N(v)} h̄_u  +  |N(v)| / |S(v)| · Σ_{u ∈ S(v)} (h_u - h̄_u)

the exact sum of every neighbour's history plus a scaled correction from the sampled
neighbours' fresh rows h_u. Over the draws its mean is the exact sum of the fresh rows
(whatever h̄ is), and its variance depends only on h - h̄, which vanishes as training
settles. The input layer's history is the input itself: its aggregate P X is exact,
computed once per partition (the paper's preprocessing, `prepare`), so only the layers
above it sample: fanouts' last entry (the input layer's) is drawn only where input
dropout needs sampled neighbours for its noise term (`cv_forward`), which then fetches
their feature rows too. After each
step the fresh rows of every node the batch computed become its histories, on the
owners (a node computed on several devices gets their mean: the same value, since a
node's draws depend only on its id and the step).

Σ_{u ∈ N(v)} h̄_u is fetched, not kept as running sums: a running sum must be updated
along the out-edges of every node whose history changed, and a step writes the
histories of every layer's src rows (fanout + 1 times the rows it reads sums for), so
pushing deltas moves more than fetching. The fetch walks each dst node's in-edges in
chunks of `CHUNK`: chunk ids are a second id space (every node's chunks numbered after
the ones before it, so each partition owns a contiguous range, `chunk_offsets`) routed
by the same exchange machinery, `window` chunks a round, as many rounds as the busiest
device needs, so a hub spans rounds and nothing is sized by the largest degree.

Mean and gcn GraphSAGE only: their aggregate is linear in the neighbours' rows, which
the estimator needs (`check_model` says why each other layer is refused). A model that
drops trains with the paper's CVD (`cv_forward`): a mean pass without dropout keeps
the control variate and the histories, and a dropout pass adds each sampled
neighbour's dropout noise scaled to exact dropout's variance.
"""
from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

import jgraph.segments as segments
from jgraph.config import ConfigError
from jgraph.data.sparse import SparseRows, dense
from jgraph.exchange import (
    Exchange,
    ExchangeStats,
    Strategy,
    exclusive_sum,
    owned_index,
    owned_rows,
    route_rows,
    segment_of,
    store_rows,
)
from jgraph.jobs.experiment import Experiment, HistoryInit, Sampler
from jgraph.jobs.kind import NodeKind
from jgraph.jobs.metrics import masked_cross_entropy
from jgraph.jobs.run import Run, job_fields, node_parts, seed_loader, with_caches
from jgraph.jobs.step import NodeClassification, Outcome, TrainState, Writes
from jgraph.jobs.table import register
from jgraph.jobs.windows import (
    Summed,
    edge_window,
    full_graph_layers,
    local_inputs,
    window_aggregate,
)
from jgraph.mesh import REPLICATED, ROWS, rows_sharding, vary_like
from jgraph.models.gat import GATConv
from jgraph.models.sage import Aggregator, SAGEConv
from jgraph.models.stack import layer_input
from jgraph.sampling.blocks import Block
from jgraph.sharded import DistGraph

CHUNK = 16
"""In-edges one request of the history fetch reads (see the module)."""


class ControlVariateData(NamedTuple):
    """`StepData`'s arrays and the control variates' own, per device blocks of the
    graph's node rows (local node i is global id offsets[me] + i):

      input_sums: float32[n, F] — Σ of each node's in-neighbours' input rows (P X
        unnormalised: the input layer's exact aggregate).
      chunk_start: int32[n] — each node's first in-edge chunk, counted from this
        partition's first (its global chunk id adds `chunk_offsets[me]`).
    """

    graph: object
    features: dict
    labels: jax.Array
    caches: dict
    input_sums: jax.Array
    chunk_start: jax.Array


def check_model(gnn) -> None:
    """ValueError unless every layer is a mean or gcn GraphSAGE layer, saying why
    another is refused: the estimator corrects a sum of histories by a scaled sample of
    differences, which has the exact aggregate as its mean only where the aggregate is
    linear in the neighbours' rows."""
    for i, conv in enumerate(gnn.convs):
        if isinstance(conv, SAGEConv) and conv.aggregator in (Aggregator.MEAN,
                                                               Aggregator.GCN):
            continue
        if isinstance(conv, SAGEConv) and conv.aggregator is Aggregator.POOL:
            why = ("its pool aggregate is a maximum over the neighbours' transformed "
                   "rows, and no sum of histories plus a scaled sample has a maximum as "
                   "its mean")
        elif isinstance(conv, SAGEConv):
            why = (f"its {conv.aggregator.value} aggregate is not linear in the "
                   f"neighbours' rows")
        elif isinstance(conv, GATConv):
            why = ("its attention weights are a softmax over the whole neighbourhood of "
                   "rows that change every step, so its aggregate is not linear in the "
                   "neighbours' rows (attention computed from the histories alone is a "
                   "different model, not an estimate of this one)")
        else:
            why = f"a {type(conv).__name__} has no control-variate estimator here"
        raise ValueError(f"train.sampler: control_variate needs mean or gcn GraphSAGE "
                         f"layers (an aggregate linear in the neighbours' rows); layer "
                         f"{i} is {_name(conv)}: {why}")


def _name(conv) -> str:
    return (f"a {conv.aggregator.value} GraphSAGE layer" if isinstance(conv, SAGEConv)
            else f"a {type(conv).__name__}")


def input_block(dst: jax.Array) -> Block:
    """The input layer's block: its dst nodes read only their own rows and `input_sums`
    (no neighbour slot)."""
    n = dst.shape[0]
    return Block(dst=dst, src=dst, nbr=jnp.zeros((n, 0), jnp.int32),
                 mask=jnp.zeros((n, 0), bool))


def chunk_counts(degree: jax.Array, chunk: int) -> jax.Array:
    return (degree + chunk - 1) // chunk


def chunk_neighbours(graph, chunk_start, chunk_offsets, chunk: int, axis: str):
    """owner_fn of chunk ids: int32[n, chunk] the in-neighbours (id + 1; 0 = none) of
    each requested chunk of an owned node's in-edges."""
    def fn(ids, mask):
        c = owned_index(ids, mask, chunk_offsets, axis)
        # A node without in-edges starts where the next one does: the last start at or
        # below c is the node whose chunks hold it.
        node = segment_of(chunk_start, c)
        lo = graph.indptr[node] + (c - chunk_start[node]) * chunk
        pos = lo[:, None] + jnp.arange(chunk, dtype=jnp.int32)
        ok = mask[:, None] & (pos < (graph.indptr[node] + graph.in_degree[node])[:, None])
        return jnp.where(ok, graph.indices[jnp.where(ok, pos, 0)] + 1, 0)
    return fn


def neighbour_history_sums(exchange: Exchange, chunks: Exchange, graph, chunk_start, ids,
                           degree, first, read, window: int, chunk: int = CHUNK):
    """(float32[n, F] Σ of `read` over every in-neighbour of each id, stats): ids
    int32[n] (-1 = none), degree int32[n] their in-degrees, first int32[n] their first
    chunk ids; read: an owner_fn of node rows (a history table's). The ids' chunks are
    one request of this device's, moved `window` chunks a round for as many rounds as
    the busiest device needs (`Exchange.in_windows`); stats: the chunks' gathers and
    the rows' gathers, each over every round."""
    n = ids.shape[0]
    count = jnp.where(ids >= 0, chunk_counts(degree, chunk), 0)
    # No node has more in-edges than a partition holds.
    starts = exclusive_sum(count, n * chunk_counts(graph.edges_per_part, chunk))
    neighbours = chunk_neighbours(graph, chunk_start, chunks.offsets, chunk, exchange.axis)
    width = jax.eval_shape(read, ids[:1], ids[:1] >= 0).shape[1:]
    acc = jnp.zeros((n,) + width, jnp.float32) + (ids[0] * 0).astype(jnp.float32)

    def window_sums(k, ok, carry):
        acc, got_stats, row_stats = carry
        i = segment_of(starts, k)
        nbr, st_nbr = chunks.gather(first[i] + k - starts[i], ok, neighbours, distinct=True)
        rows, st_rows = exchange.gather(nbr.reshape(-1) - 1, nbr.reshape(-1) > 0, read)
        per_chunk = jnp.sum(rows.reshape((window, chunk) + width).astype(jnp.float32), axis=1)
        acc = acc.at[jnp.where(ok, i, n)].add(per_chunk, mode="drop")
        return acc, got_stats.combined(st_nbr), row_stats.combined(st_rows)
    acc, st_nbr, st_rows = exchange.in_windows(
        starts[-1] + count[-1], window, window_sums,
        (acc, ExchangeStats.none(), ExchangeStats.none()))
    return acc, (st_nbr, st_rows)


def drawn_sum(block, rows: jax.Array) -> jax.Array:
    """[n_dst, F]: Σ over each dst node's sampled slots of `rows` (block's src rows),
    a slot column at a time (never an [n_dst, W, F] gather: an input layer's W may be
    a hub's degree and F the raw features')."""
    n_dst, width = block.nbr.shape
    acc = vary_like(vary_like(jnp.zeros((n_dst,) + rows.shape[1:], rows.dtype), rows),
                    block.nbr)
    if width == 0:
        return acc

    def column(k, acc):
        nbr = lax.dynamic_index_in_dim(block.nbr, k, axis=1, keepdims=False)
        ok = lax.dynamic_index_in_dim(block.mask, k, axis=1, keepdims=False)
        return acc + jnp.where(ok[:, None], jnp.take(rows, jnp.where(ok, nbr, 0), axis=0), 0)
    return lax.fori_loop(0, width, column, acc)


def drops(gnn) -> bool:
    """Whether `gnn` applies dropout (between layers or to its inputs) in training."""
    return bool(gnn.dropout.rate) or bool(gnn.input_dropout.rate)


def cv_forward(gnn, x, input_sums, degree, blocks, history_src, history_sums, key=None):
    """(the last layer's rows [n_dst, C], the fresh input rows of layers 1.. L-1, one
    [n_src_l, F] per layer, for block l's src): the stack `gnn` on `blocks` (model
    order), every layer's neighbour aggregate estimated with control variates (see the
    module), and with `key` (training a model that drops) VR-GCN's CVD.

    The mean pass, without dropout, estimates layer l's aggregate as the module says
    (h̄ the histories, μ its fresh rows):

        Σ_{u ∈ N(v)} h̄_u  +  n/D · Σ_{u ∈ S(v)} (μ_u - h̄_u)           (n = |N(v)|, D = |S(v)|)

    and its rows are the histories' next values. The dropout pass reads the same
    blocks with dropout applied (`gnn.post` and `gnn.drop_inputs` with `key`, so the
    masks are those plain training draws on the same rows), its rows h̃, and adds the
    dropout noise of the sampled neighbours to the mean pass's estimate:

        ... + sqrt(n/D) · Σ_{u ∈ S(v)} (h̃_u - μ_u)

    Where μ_u is the mean of h̃_u over the masks, the noise term has mean zero, so the
    estimate's mean over masks and samples is exact dropout's, E Σ_{u ∈ N(v)} h̃_u;
    and the noise terms of distinct neighbours being independent, its variance over a
    sample of D of the n is D/n of the whole sum's, which the sqrt(n/D) scale brings
    back to exact dropout's, where n/D would inflate it n/D-fold (the paper's variance
    argument, Chen et al. 2018, sec. 4.2). That holds exactly where dropout's only
    randomness is the layer's own masks: at the input layer (μ = x), and at the layer
    above an exact one (tested: the mean and the variance match). Deeper, μ (the mean
    pass's rows, without dropout below) stands for E h̃ as the paper's approximation:
    through a nonlinearity they differ, and the estimate's mean moves from exact
    dropout's by sqrt(D/n) of that difference. With every neighbour drawn (D = n) the
    estimate is Σ h̃_u itself: exact dropout training's forward and gradients, at any
    depth. The input layer's aggregate is exact without input dropout; with it,
    blocks[0] draws the input layer's neighbours for its noise term. Gradients flow
    through both passes (the mean pass's n/D term carries the gradient's mean)."""
    last = len(gnn.convs) - 1

    def layer(i, h, summed, deg, step_key):
        """Layer i's rows from its dst rows in h and `summed`, the sum of its
        neighbours' messages."""
        conv = gnn.convs[i]
        n_dst = summed.shape[0]
        partial = {"sum": summed, "count": deg}
        return gnn.post(i, conv.update(layer_input(conv, h[:n_dst]), partial), step_key)

    # x may be sparse input rows (the first layer takes them as they are). The noise
    # is summed after the layer's message, linear in its rows for every layer the
    # estimator allows (`check_model`): input dropout's noise keeps x's non-zeros, so
    # the first layer's is an embedding bag, never a dense [n_src, F] matrix.
    mean, fresh = x, []
    noisy = gnn.drop_inputs(x, key) if key is not None and drops(gnn) else None
    for i in range(len(gnn.convs)):
        conv, block = gnn.convs[i], blocks[i]
        n_dst = block.num_dst
        deg = degree[:n_dst].astype(mean.dtype)
        sampled = jnp.maximum(jnp.sum(block.mask, axis=1), 1).astype(mean.dtype)
        total = input_sums.astype(mean.dtype)[:n_dst] if i == 0 else (
            history_sums[i - 1].astype(mean.dtype)
            + drawn_sum(block, mean - history_src[i - 1].astype(mean.dtype))
            * (deg / sampled)[:, None])
        summed = conv.message(total)
        if noisy is not None:
            noise = drawn_sum(block, conv.message(layer_input(conv, _minus(noisy, mean))))
            noisy = layer(i, noisy, summed + noise * jnp.sqrt(deg / sampled)[:, None],
                          deg, key)
        mean = layer(i, mean, summed, deg, None)
        if i < last:
            fresh.append(mean)
    return (mean if noisy is None else noisy), fresh


def _minus(a, b):
    """a - b, for rows of the same layout: sparse rows with b's non-zeros (a dropped
    copy of b) subtract their stored values."""
    if isinstance(b, SparseRows):
        return b.with_values(a.values - b.values)
    return a - b


class Batch(NamedTuple):
    """One device's batch: `step.Batch`'s fields and what the estimator reads.

    input_sums: [n0, F] P X sums of blocks[0]'s nodes; degree: int32[n0] their
    in-degrees; history_src, history_sums: per layer above the first, as `cv_forward`
    takes them."""

    blocks: tuple
    rows: dict
    valid: dict
    labels: jax.Array
    label_mask: jax.Array
    stats: object
    input_sums: jax.Array
    degree: jax.Array
    history_src: tuple
    history_sums: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class ControlVariateClassification(NodeClassification):
    """Node classification whose layers above the first estimate their aggregates with
    control variates (see the module). `sampler` draws the layers above the input one
    (len(fanouts) = layers - 1), and the input layer too where `input_hop` (input
    dropout: its noise term reads sampled neighbours).

    graph: the `ShardedGraph`; input_sums, chunk_start: its per-device blocks of
    `ControlVariateData`; chunk_offsets: int64[P + 1] the partitions' chunk id ranges
    (`prepare` sets these four). widths: the input width of each layer above the
    first; history_init, history_dtype: how the histories start, what they are stored
    in."""

    graph: object = None
    input_sums: jax.Array | None = None
    chunk_start: jax.Array | None = None
    chunk_offsets: np.ndarray | None = None
    widths: tuple[int, ...] = ()
    history_init: HistoryInit = HistoryInit.INFERENCE
    history_dtype: object = jnp.float32
    input_hop: bool = False
    # The compiled history inference, shared by the jobs `dataclasses.replace` makes of
    # this one (calibrated, grown), so a refresh reuses the program that made the first
    # histories.
    history_programs: dict = dataclasses.field(default_factory=dict, repr=False)

    # -- host side ---------------------------------------------------------------------

    @property
    def chunks(self) -> Exchange:
        """The exchange of in-edge chunk ids: the job's, over `chunk_offsets`."""
        ex = self.exchange
        return Exchange(self.chunk_offsets, ex.config, ex.axis, ex.platform, ex.capacities,
                        planned=ex.planned)

    def data(self, graph) -> ControlVariateData:
        base = super().data(graph)
        return ControlVariateData(*base, self.input_sums, self.chunk_start)

    def data_specs(self, graph) -> ControlVariateData:
        return ControlVariateData(*super().data_specs(graph), ROWS, ROWS)

    def state_specs(self) -> TrainState:
        return dataclasses.replace(super().state_specs(),
                                   extra=tuple(ROWS for _ in self.widths))

    def init(self, params) -> TrainState:
        state = super().init(params)
        return dataclasses.replace(state, extra=self.initial_histories(state))

    def initial_histories(self, state: TrainState) -> tuple:
        """One [P * nodes_per_part, width] row-sharded table per layer above the first:
        zeros, or every node's input to that layer by full-graph inference with the
        state's parameters."""
        n = self.graph.nodes_per_part
        # Made on the devices (abstractly, under `jax.eval_shape`).
        zeros = jax.jit(lambda: tuple(
            jnp.zeros((self.mesh.size * n, w), self.history_dtype) for w in self.widths),
            out_shardings=tuple(rows_sharding(self.mesh) for _ in self.widths))()
        if self.history_init is HistoryInit.ZEROS:
            return zeros
        return self.inferred_histories(dataclasses.replace(state, extra=zeros))

    def inferred_histories(self, state: TrainState) -> tuple:
        """Every node's input to each layer above the first, by full-graph inference
        with the state's parameters (no dropout): the histories as exact as they get.
        The state's tables are given up for the new ones (donated: a refresh holds one
        set of tables, not two). One compiled program per job, the one that made the
        first histories, so a refresh compiles nothing."""
        if "inference" not in self.history_programs:
            self.history_programs["inference"] = self._history_program()
        return self.history_programs["inference"](state.params, state.embeddings,
                                                  self.data(self.graph), state.extra)

    def _history_program(self):
        inputs, exchange = self.inputs, here(self.exchange, self.mesh)

        def per_device(params, embeddings, data, old):
            del old                        # donated: the new tables take its buffers
            model = nnx.merge(self.graphdef, params)
            layers, _ = full_graph_layers(model, inputs, data.features, embeddings,
                                          data.graph, exchange)
            return tuple(h.astype(self.history_dtype) for h in layers[:-1])
        tables = tuple(ROWS for _ in self.widths)
        return jax.jit(jax.shard_map(
            per_device, mesh=self.mesh,
            in_specs=(REPLICATED, inputs.embedding_specs(), self.data_specs(self.graph),
                      tables),
            out_specs=tables), donate_argnums=(3,))

    def evaluating(self, loader, fanouts) -> NodeClassification:
        """Evaluation samples plainly (with the eval fanouts: all neighbours by default)."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(NodeClassification)}
        return NodeClassification(**plain).evaluating(loader, fanouts)

    # -- inside the step (per device, under shard_map) --------------------------------

    def batch_of(self, data, embeddings, order, index, step, histories=None) -> Batch:
        """`Job.batch_of` and the estimator's rows: the P X sums and
        in-degrees of the input block's nodes, and per layer above it the histories of
        its src and the sums of its dst's neighbours' histories. histories: the state's
        tables (None: zeros, for measuring what the batch sends)."""
        exchange, axis = self.exchange, self.exchange.axis
        graph = data.graph
        if histories is None:
            n = graph.nodes_per_part
            histories = tuple(jnp.zeros((n, w), self.history_dtype) for w in self.widths)
        seeds, mask = self.loader.batch(order, index)
        sample = self.sampler.sample(graph, exchange, seeds, mask, seed=self.seed, step=step,
                                     local_seeds=True)
        blocks = (tuple(sample.blocks) if self.input_hop
                  else (input_block(sample.blocks[0].src), *sample.blocks))
        nodes = blocks[0].dst
        rows, valid, input_stats = self.inputs.fetch(exchange, data.features, embeddings,
                                                     blocks[0].src, caches=data.caches)
        me = lax.axis_index(axis)
        first_chunk = jnp.asarray(self.chunk_offsets, jnp.int32)[me]

        def about(ids, ok):
            local = owned_index(ids, ok, graph.offsets, axis)
            return {"sums": data.input_sums[local], "degree": graph.in_degree[local],
                    "first": data.chunk_start[local] + first_chunk}
        info, info_stats = exchange.gather(nodes, nodes >= 0, about, distinct=True)
        chunks = self.chunks
        history_src, history_sums, history_stats = [], [], []
        for layer, table in enumerate(histories, start=1):
            block = blocks[layer]
            read = owned_rows(table, graph.offsets, axis)
            src, st_src = exchange.gather(block.src, block.src >= 0, read, distinct=True)
            n_dst = block.num_dst
            sums, st_sums = neighbour_history_sums(exchange, chunks, graph, data.chunk_start,
                                                  block.dst, info["degree"][:n_dst],
                                                  info["first"][:n_dst], read, max(n_dst, 8))
            history_src.append(src)
            history_sums.append(sums)
            history_stats.append((st_src, *st_sums))
        dst = sample.seeds
        y, label_stats = self.labels.lookup(exchange, data.labels, dst, dst >= 0, local=True)
        stats = (sample.stats, input_stats, label_stats, info_stats, tuple(history_stats))
        return Batch(blocks, rows, valid, y, (dst >= 0) & (y >= 0), stats, info["sums"],
                     info["degree"], tuple(history_src), tuple(history_sums))

    def batch_loss(self, params, embedding_rows, batch: Batch, key=None):
        """(loss sum, `Outcome` whose out is (logits, the fresh rows of the layers above
        the first)); with `key`, the model's dropout through CVD (`cv_forward`)."""
        del embedding_rows                 # no embeddings (checked)
        model = nnx.merge(self.graphdef, params)
        x = model.encoder(batch.rows, batch.valid).astype(jnp.float32)
        logits, fresh = cv_forward(model.gnn, x, batch.input_sums, batch.degree,
                                   batch.blocks, batch.history_src, batch.history_sums,
                                   key)
        loss, correct, count = masked_cross_entropy(logits, batch.labels, batch.label_mask)
        return loss, Outcome(count, correct, count, (logits, tuple(fresh)))

    # The step is `Job.train_step` with the estimator, and every fresh
    # row the batch computed written to its node's history (a node computed on several
    # devices gets their mean). Refused, as a sampled step is, where the sample or a
    # history write did not fit its capacity.

    def training_batch(self, state: TrainState, data, order, index) -> Batch:
        return self.batch_of(data, state.embeddings, order, index, state.step,
                             state.extra)

    def learned_rows(self, state: TrainState, batch: Batch) -> dict:
        return {}                          # no learnable embeddings (checked)

    def writes(self, batch: Batch, outcome: Outcome, row_grads: dict, applied) -> Writes:
        """The fresh rows of each layer above the first sent to their nodes' owners."""
        _, fresh = outcome.out
        routed, stats = [], []
        fit = jnp.ones((), bool)
        for layer, rows in enumerate(fresh, start=1):
            ids = batch.blocks[layer].src
            got, st = route_rows(self.exchange, ids, ids >= 0,
                                 lax.stop_gradient(rows).astype(jnp.float32))
            routed.append(got)
            stats.append(st)
            fit = fit & (st.overflow == 0)
        return Writes({}, (tuple(stats),), fit, tuple(routed))

    def written(self, state: TrainState, data, writes: Writes, applied) -> TrainState:
        """The histories with the routed rows written in place where applied (a copy of
        a whole table would cost its size)."""
        kept = tuple(store_rows(table, got, data.graph.offsets, self.exchange.axis,
                                where=applied)
                     for table, got in zip(state.extra, writes.rest))
        return dataclasses.replace(state, extra=kept)


def here(exchange: Exchange, mesh) -> Exchange:
    """`exchange` for the devices of `mesh` (the job's may be built for other hardware,
    `jgraph compile --target`): what the host-run programs of the job use."""
    config = dataclasses.replace(exchange.config, strategy=Strategy.AUTO)
    return Exchange(exchange.offsets, config, exchange.axis, mesh.devices.flat[0].platform)


def prepare(job: ControlVariateClassification, graph, chunk: int = CHUNK,
            abstract: bool = False) -> ControlVariateClassification:
    """`job` with its P X sums and in-edge chunk ids, computed once for the partition:
    every node's in-edges walked in windows as full-graph inference does (abstract: a
    graph of shapes, whose sums and chunk ids are shapes too)."""
    inputs, mesh = job.inputs, job.mesh
    exchange = here(job.exchange, mesh)
    if len(inputs.node_types) != 1 or inputs.embeddings:
        raise ValueError(f"train.sampler: control_variate needs one node type with input "
                         f"features (its first layer's aggregate is computed once); this "
                         f"graph has node types {list(inputs.node_types)}, learnable "
                         f"embeddings for {sorted(inputs.embeddings)}")
    (ntype,) = inputs.node_types

    def per_device(graph, features):
        x = local_inputs(inputs, lambda rows, valid: dense(rows[ntype]).astype(jnp.float32),
                         features, {}, graph, exchange.axis)
        window = edge_window(graph.edges_per_part, x.shape[1])
        acc, lost = window_aggregate(Summed(), x, graph, exchange, window)
        count = jnp.where(graph.node_mask, chunk_counts(graph.in_degree, chunk), 0)
        # Each node's chunks round its in-edges up by less than one chunk.
        start = exclusive_sum(count, graph.nodes_per_part
                              + chunk_counts(graph.edges_per_part, chunk))
        # Every partition's chunk count, on every device (each process reads them).
        me = lax.axis_index(exchange.axis)
        totals = lax.psum(jnp.zeros(mesh.size, jnp.int32).at[me].set(start[-1] + count[-1]),
                          exchange.axis)
        return acc["sum"], start, totals, lost
    program = jax.jit(jax.shard_map(
        per_device, mesh=mesh, in_specs=(graph.specs(), inputs.specs()),
        out_specs=(ROWS, ROWS, REPLICATED, REPLICATED)))
    if abstract:
        # A graph of shapes: every partition's chunks at their bound, one per node
        # plus one per `chunk` edges.
        sums, start, _, _ = jax.eval_shape(program, graph, inputs.arrays())
        bound = graph.nodes_per_part + graph.edges_per_part // chunk
        return dataclasses.replace(job, graph=graph, input_sums=sums, chunk_start=start,
                                   chunk_offsets=np.arange(mesh.size + 1) * bound)
    sums, start, totals, lost = program(graph, inputs.arrays())
    if int(lost):
        raise RuntimeError(f"control variates: {int(lost)} in-edge source id(s) are not "
                           f"nodes of the graph")
    offsets = segments.offsets(np.asarray(jax.device_get(totals)))
    if offsets[-1] >= np.iinfo(np.int32).max:
        raise ValueError(f"control variates number the graph's in-edges in chunks of "
                         f"{chunk}: {int(offsets[-1])} chunks do not fit int32 ids")
    return dataclasses.replace(job, graph=graph, input_sums=sums, chunk_start=start,
                               chunk_offsets=offsets)


def layer_widths(gnn) -> tuple[int, ...]:
    """The input width of each layer of `gnn` (checked by `check_model`: GraphSAGE)."""
    return tuple(conv.fc_neigh.in_features for conv in gnn.convs)


def cv_fanouts(config: Experiment) -> tuple:
    """The hops a control-variate job draws: those above the input layer, and the input
    layer's too with input dropout (its noise term's neighbours)."""
    fanouts = config.train.fanouts
    return tuple(fanouts) if config.model.input_dropout else tuple(fanouts[:-1])


class ControlVariateNodes(NodeKind):
    """Node classification with control-variate sampling (`train.sampler:
    control_variate`): the layers above the input one draw fanouts[:-1]."""

    sampler = Sampler.CONTROL_VARIATE
    title = "node classification with control variates"
    histories = True

    def check(self, config: Experiment) -> None:
        """What the estimator needs: mean or gcn GraphSAGE layers above an input layer;
        dropout between layers and on the inputs (CVD), no other."""
        m = config.model
        if m.num_layers < 2:
            raise ConfigError("train.sampler: control_variate needs model.num_layers >= 2 "
                              "(the input layer's aggregate is exact; the layers above it "
                              "sample)")
        aggregator = Aggregator(m.aggregator)
        if m.kind != "sage" or aggregator not in (Aggregator.MEAN, Aggregator.GCN):
            raise ConfigError(f"train.sampler: control_variate needs model.kind: sage with "
                              f"model.aggregator mean or gcn (an aggregate linear in the "
                              f"neighbours' rows); got {m.kind} / {aggregator.value}")
        if m.attn_dropout:
            raise ConfigError(f"model.attn_dropout={m.attn_dropout}: train.sampler: "
                              f"control_variate trains GraphSAGE layers, which have no "
                              f"attention to drop; its dropout (CVD) is model.dropout and "
                              f"model.input_dropout")
        super().check(config)

    def bench_fields(self, run: Run, job, state) -> dict:
        """Its history tables too: one per layer above the first, every node's row."""
        return {**super().bench_fields(run, job, state), "history_bytes_per_device":
                sum(h.nbytes for h in state.extra) // run.dg.mesh.size}

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        t, m = config.train, config.model
        p = node_parts(config, dg)
        model = nnx.merge(p.graphdef, p.params)
        try:
            check_model(model.gnn)
            job = prepare(ControlVariateClassification(
                p.graphdef, loader=seed_loader(config, dg, p.target, t.batch_size,
                                               t.drop_last),
                labels=p.labels, widths=layer_widths(model.gnn)[1:],
                history_init=t.history_init, history_dtype=t.history_precision.dtype,
                input_hop=bool(m.input_dropout),
                **job_fields(config, dg.exchange(config.exchange, platform), p.inputs,
                             cv_fanouts(config))), dg.graph, abstract=dg.abstract)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        return Run(config, dg, p.target, p.num_classes, with_caches(config, dg, job),
                   p.params, self)

    def end_epoch(self, run: Run, job, state: TrainState, epoch: int):
        """Every `train.history_refresh` epochs, every history recomputed by full-graph
        inference with the current parameters; the row's history_refresh_seconds say
        what it took (None on the other epochs)."""
        t = run.config.train
        if t.history_refresh is None:
            return state, {}
        if (epoch + 1) % t.history_refresh or epoch + 1 == t.epochs:   # none after the last
            return state, {"history_refresh_seconds": None}
        begin = time.perf_counter()
        histories = jax.block_until_ready(job.inferred_histories(state))
        return (dataclasses.replace(state, extra=histories),
                {"history_refresh_seconds": time.perf_counter() - begin})


register(ControlVariateNodes())
