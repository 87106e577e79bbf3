"""What a model's first layer reads for each node: stored features or a learnable
embedding, per node type.

`NodeInputs` names, for every node type of a partitioned graph, where its input rows
come from: a feature `DistTensor`, or a `DistEmbedding` (DistDGL's DistEmbedding) for
a featureless type such as the entities of AIFB or AM. The model's `InputEncoder`
turns the fetched rows into one input matrix.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax

from jgraph.exchange import Exchange
from jgraph.mesh import REPLICATED, ROWS
from jgraph.sharded.cache import HotCache
from jgraph.sharded.embedding import DistEmbedding, EmbeddingState
from jgraph.sharded.graph import DistGraph
from jgraph.sharded.sparse_optim import SparseAdam, SparseOptimizer
from jgraph.sharded.tensor import DistTensor


@dataclasses.dataclass(frozen=True, eq=False)
class NodeInputs:
    """Fields:
      features: {ntype: DistTensor [rows of that type, F_t]} for types with features.
      embeddings: {ntype: DistEmbedding} for the others.
      layouts: {ntype: RowLayout} of every type, in the graph's type order.
      caches: {ntype: HotCache} for feature types whose hot rows every device holds.
    """

    features: Mapping[str, DistTensor]
    embeddings: Mapping[str, DistEmbedding]
    layouts: Mapping
    caches: Mapping[str, HotCache] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, dg: DistGraph, *, feature: str = "feat", embedding_dim: int = 64,
           optimizer: SparseOptimizer = SparseAdam(), learnable: bool = False) -> NodeInputs:
        """Each node type's `feature` array, or a learnable embedding of `embedding_dim`
        where a type has none (or for every type when `learnable`)."""
        features, embeddings = {}, {}
        for ntype in dg.node_types:
            if not learnable and feature in dg.meta.node_data.get(ntype, {}):
                features[ntype] = dg.ndata(feature, ntype)
            else:
                embeddings[ntype] = DistEmbedding(dg.layout(ntype), embedding_dim, optimizer,
                                                  name=f"embedding of {ntype!r}")
        return cls(features, embeddings, {t: dg.layout(t) for t in dg.node_types})

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.layouts)

    def widths(self) -> dict[str, int]:
        """{ntype: width of its input rows}."""
        out = {t: int(f.shape[1]) if len(f.shape) > 1 else 1 for t, f in self.features.items()}
        out.update({t: e.dim for t, e in self.embeddings.items()})
        return {t: out[t] for t in self.node_types}

    # -- host side ---------------------------------------------------------------------

    def arrays(self) -> dict[str, jax.Array]:
        """{ntype: feature array} — the step's feature argument."""
        return {t: f.array for t, f in self.features.items()}

    def specs(self) -> dict:
        return dict.fromkeys(self.features, ROWS)

    def cache_arrays(self) -> dict:
        """{ntype: (ids, rows)} replicated: the step's cache argument."""
        return {t: c.device_args(self.features[t]) for t, c in self.caches.items()}

    def cache_specs(self) -> dict:
        return dict.fromkeys(self.caches, (REPLICATED, REPLICATED))

    def init_embeddings(self, mesh, key) -> dict[str, EmbeddingState]:
        return {t: e.init(mesh, jax.random.fold_in(key, i))
                for i, (t, e) in enumerate(self.embeddings.items())}

    def embedding_specs(self) -> dict:
        return {t: e.specs() for t, e in self.embeddings.items()}

    # -- inside the step (per device, under shard_map) --------------------------------

    def fetch(self, exchange: Exchange, features: Mapping, embeddings: Mapping, ids,
              distinct: bool = True, caches: Mapping | None = None):
        """Rows of global ids `ids` (int32[n], -1 = padding), per type; caches: this
        step's `cache_arrays()`, answered without the exchange.

        Returns (rows {ntype: [n, F_t]}, valid {ntype: bool[n]}, stats): a row is real
        where `valid[ntype]` (the id is a node of that type), zero elsewhere.
        """
        rows, valid, stats = {}, {}, []
        for ntype, layout in self.layouts.items():
            ok = (ids >= 0) & layout.contains(ids)
            if ntype in self.features:
                got, st = self.features[ntype].lookup(exchange, features[ntype], ids, ok,
                                                     distinct=distinct,
                                                     cache=(caches or {}).get(ntype))
            else:
                got, st = self.embeddings[ntype].lookup(exchange, embeddings[ntype], ids, ok,
                                                       distinct=distinct)
            rows[ntype], valid[ntype] = got, ok
            stats.append(st)
        return rows, valid, tuple(stats)

    def local_rows(self, features: Mapping, embeddings: Mapping, ntype: str) -> jax.Array:
        """This device's own rows of `ntype` (its block, padded), without the exchange."""
        if ntype in self.features:
            return features[ntype]
        return embeddings[ntype].table
