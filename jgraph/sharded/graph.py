"""The partitioned graph on the mesh: each device holds its partition's in-edges.

`DistGraph` is the host-side handle (DistDGL's DistGraph): it opens a partition
directory, checks it against the mesh, and loads only the partitions of this process's
devices. `ShardedGraph` is the pytree the compiled step receives.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from jax.sharding import Mesh

import jgraph.segments as segments
from jgraph.exchange import Exchange, ExchangeConfig
from jgraph.mesh import (
    REPLICATED,
    ROWS,
    all_processes,
    check_parts,
    local_parts,
    max_over_processes,
    replicate,
    shard_rows,
)
from jgraph.partition import PartitionBook, PartitionedGraph, PartitionFormatError, open_partitions
from jgraph.partition.store import ArraySpec
from jgraph.sharded.layout import RowLayout

INT32_MAX = np.iinfo(np.int32).max


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedGraph:
    """Every partition's in-edge CSC, padded to the largest partition. P = partitions,
    n = `nodes_per_part` (max nodes in a partition), e = `edges_per_part` (max edges).

    Row-sharded (device k holds block k; shapes below are per device, globally each
    leading dimension is P times larger):
      indptr: int32[n + 1] — in-edges of local node i are `indices[indptr[i]:indptr[i+1]]`;
        padding nodes have no edges.
      indices: int32[e] — global id of each in-edge's source; -1 in padding.
      etype: int32[e] — relation index of each in-edge; -1 in padding.
      edge_mask: bool[e] — True for real edges.
      in_degree: int32[n] — number of in-edges of each local node, 0 for padding.
      node_mask: bool[n] — True for real nodes; local node i is global id offsets[k] + i.
    Replicated:
      offsets: int32[P+1] — the partition book: partition k owns [offsets[k], offsets[k+1]).
    Static (part of the tree structure):
      num_nodes, nodes_per_part, edges_per_part: ints; num_relations: int;
      max_in_degree: the largest in-degree of any node (bounds "all neighbours").
    """

    indptr: jax.Array
    indices: jax.Array
    etype: jax.Array
    edge_mask: jax.Array
    in_degree: jax.Array
    node_mask: jax.Array
    offsets: jax.Array
    num_nodes: int = dataclasses.field(metadata=dict(static=True))
    nodes_per_part: int = dataclasses.field(metadata=dict(static=True))
    edges_per_part: int = dataclasses.field(metadata=dict(static=True))
    num_relations: int = dataclasses.field(metadata=dict(static=True))
    max_in_degree: int = dataclasses.field(default=0, metadata=dict(static=True))

    def specs(self) -> ShardedGraph:
        """The `shard_map` in/out specs of this graph: rows sharded, offsets replicated."""
        return dataclasses.replace(
            self, indptr=ROWS, indices=ROWS, etype=ROWS, edge_mask=ROWS, in_degree=ROWS,
            node_mask=ROWS, offsets=REPLICATED)


def check_int32(num_nodes: int, edges_per_part: int, what: str) -> None:
    """Raise ValueError unless the device program's int32 ids and offsets hold the
    graph: global node ids (the exchange routes them) and one partition's in-edge
    offsets. Counts across partitions (the graph's edges) are int64 on the host and
    never enter the program."""
    if num_nodes >= INT32_MAX:
        raise ValueError(f"{what}: {num_nodes} nodes do not fit int32 node ids")
    if edges_per_part >= INT32_MAX:
        raise ValueError(f"{what}: a partition with {edges_per_part} edges does not fit "
                         f"int32 edge offsets; partition it into more parts (devices)")


def load_sharded_graph(pg: PartitionedGraph, mesh: Mesh) -> ShardedGraph:
    """Load each local partition's CSC onto its device (other processes load theirs)."""
    meta, book = pg.meta, pg.book
    check_parts(meta.num_parts, mesh, source=f"partition directory {pg.root}")
    n = max(int(book.part_sizes().max()), 1)
    e = max(max(int(p.num_edges) for p in meta.parts), 1)
    check_int32(meta.num_nodes, e, str(pg.root))

    def indptr(k):
        ip = np.asarray(pg.part(k).indptr)
        return np.concatenate([ip, np.full(n + 1 - ip.size, ip[-1])])

    def degree(k):
        return np.diff(np.asarray(pg.part(k).indptr))

    return ShardedGraph(
        indptr=shard_rows(mesh, n + 1, (), np.int32, indptr),
        indices=shard_rows(mesh, e, (), np.int32, lambda k: pg.part(k).indices, fill=-1),
        etype=shard_rows(mesh, e, (), np.int32, lambda k: pg.part(k).etype, fill=-1),
        edge_mask=shard_rows(mesh, e, (), bool,
                             lambda k: np.ones(meta.parts[k].num_edges, bool)),
        in_degree=shard_rows(mesh, n, (), np.int32, degree),
        node_mask=shard_rows(mesh, n, (), bool, lambda k: np.ones(book.part_sizes()[k], bool)),
        offsets=replicate(mesh, book.offsets.astype(np.int32)),
        num_nodes=meta.num_nodes, nodes_per_part=n, edges_per_part=e,
        num_relations=len(meta.relations),
        # Each process reads only its own partitions.
        max_in_degree=max_over_processes(max((int(degree(k).max(initial=0))
                                              for k in local_parts(mesh)), default=0)))


def check_local_parts(pg: PartitionedGraph, mesh: Mesh) -> None:
    """Before training on them: this process's partitions hold what a step relies on
    (`PartitionedGraph.check_part`: ids, CSC offsets, relations, splits, label ranges).
    Every process learns whether all passed, so none waits for one that raised."""
    check_parts(pg.meta.num_parts, mesh, source=f"partition directory {pg.root}")
    error = None
    try:
        pg.check_files(local_parts(mesh))
        for k in local_parts(mesh):
            pg.check_part(k)
    except PartitionFormatError as e:
        error = e
    if not all_processes(error is None):
        raise error or PartitionFormatError(f"{pg.root}: another process found a corrupt "
                                            f"partition (its error names the file)")


class DistGraph:
    """A partition directory opened on a mesh, one partition per device.

    graph: the `ShardedGraph`; book: the `PartitionBook`; ndata(name, ntype): a node
    array as a `DistTensor`; exchange(config): the owner-routed `Exchange` for this
    book; degrees(): global in-/out-degree counts (host numpy); rows(...): a row-sharded
    array of this process's partitions' blocks. abstract: False (an `AbstractGraph`,
    made from counts for `jgraph compile --abstract`, holds shapes, not values).
    """

    abstract = False

    def __init__(self, root: str | os.PathLike | PartitionedGraph, mesh: Mesh):
        self.parts = root if isinstance(root, PartitionedGraph) else open_partitions(root)
        self.mesh = mesh
        self.meta = self.parts.meta
        self.book: PartitionBook = self.parts.book
        check_local_parts(self.parts, mesh)
        self.graph = load_sharded_graph(self.parts, mesh)

    @property
    def num_parts(self) -> int:
        return self.meta.num_parts

    @property
    def node_types(self) -> tuple[str, ...]:
        return self.book.node_types

    def layout(self, ntype: str | None = None) -> RowLayout:
        return RowLayout.of(self.book, ntype)

    def _single_type(self) -> str:
        if len(self.node_types) != 1:
            raise KeyError(f"the graph has node types {list(self.node_types)}; name one "
                           f"with ntype=")
        return self.node_types[0]

    def rows(self, rows_per_part: int, row_shape: tuple[int, ...], dtype, load, fill=0):
        """A row-sharded array of partition k's rows `load(k)` in block k, padded with
        `fill` (`jgraph.mesh.shard_rows`)."""
        return shard_rows(self.mesh, rows_per_part, row_shape, dtype, load, fill)

    def ndata(self, name: str, ntype: str | None = None):
        """The node array `name` of `ntype` (the only type, if there is one) as a
        DistTensor (of `SparseRows` where the partition stores sparse rows)."""
        from jgraph.sharded.tensor import DistTensor
        ntype, spec = self.node_spec(name, ntype)

        def load(k):
            return self.parts.part(k).node_data[ntype][name]

        if spec.sparse is not None:
            return DistTensor.load_sparse(self.mesh, self.layout(ntype), name, load,
                                          spec.shape[0], spec.sparse, np.dtype(spec.dtype))
        return DistTensor.load(self.mesh, self.layout(ntype), name, load, spec.shape,
                               np.dtype(spec.dtype))

    def node_spec(self, name: str, ntype: str | None = None) -> tuple[str, ArraySpec]:
        """(the node type, meta.json's spec) of node array `name` of `ntype` (the only
        type, if there is one); KeyError naming what there is."""
        ntype = ntype or self._single_type()
        specs = self.meta.node_data.get(ntype, {})
        if name not in specs:
            raise KeyError(f"node data {name!r} of type {ntype!r} is not in {self.parts.root}; "
                           f"it has {sorted(specs)}")
        return ntype, specs[name]

    def split_type(self, split: str, ntype: str | None = None) -> str:
        """The node type (`ntype`, or the only type) after checking it has `split`."""
        ntype = ntype or self._single_type()
        names = self.meta.splits.get(ntype, [])
        if split not in names:
            raise KeyError(f"split {split!r} of type {ntype!r} is not in {self.parts.root}; "
                           f"it has {sorted(names)}")
        return ntype

    def split_mask(self, split: str, ntype: str | None = None):
        """bool DistTensor: True for the nodes of `ntype` in `split` (train/val/test)."""
        from jgraph.sharded.tensor import DistTensor
        ntype = self.split_type(split, ntype)
        layout = self.layout(ntype)

        def load(k):
            part = self.parts.part(k)
            mask = np.zeros(layout.counts[k], bool)
            mask[np.asarray(part.splits[ntype][split]) - layout.starts[k]] = True
            return mask
        return DistTensor.load(self.mesh, layout, f"{split}_mask", load, (), np.dtype(bool))

    def exchange(self, config: ExchangeConfig = ExchangeConfig(),
                 platform: str | None = None) -> Exchange:
        """The exchange for this graph's partition book, on the mesh's platform (or
        `platform`: the one a program is built for, see `jgraph.target`). A strategy
        that groups device pairs by their expected loads (`Exchange.pair_weighted`: the
        scheduled one) gets them: how many of partition k's halo nodes (its in-edges'
        sources owned elsewhere) each partition owns."""
        platform = platform or self.mesh.devices.flat[0].platform
        weights = None
        if Exchange.pair_weighted(config, platform):
            weights = np.stack([self._halo_by_owner(k) for k in range(self.num_parts)]
                               ).astype(np.float64)
        return Exchange(self.book.offsets, config, platform=platform, pair_weights=weights)

    def _halo_by_owner(self, k: int) -> np.ndarray:
        """int64[P]: how many of partition k's halo nodes each partition owns, from
        meta.json (no partition's arrays are read), or counted from its halo in a
        partition written before meta.json recorded it."""
        recorded = self.meta.parts[k].halo_by_owner
        if recorded:
            return np.asarray(recorded, np.int64)
        offsets = np.asarray(self.book.offsets)
        halo = np.asarray(self.parts.part(k).halo)
        return np.bincount(segments.segment_of(offsets, halo), minlength=self.num_parts)

    def degrees(self) -> tuple[np.ndarray, np.ndarray]:
        """(in_degree, out_degree) int64[N] over all partitions (reads every partition)."""
        n = self.meta.num_nodes
        in_deg = np.concatenate([np.diff(self.parts.part(k).indptr)
                                 for k in range(self.num_parts)]) if n else np.zeros(0, np.int64)
        out_deg = np.zeros(n, np.int64)
        for k in range(self.num_parts):
            out_deg += np.bincount(self.parts.part(k).indices, minlength=n)
        return in_deg.astype(np.int64), out_deg
