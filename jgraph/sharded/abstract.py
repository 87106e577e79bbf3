"""A partitioned graph of shapes: what `jgraph compile --abstract` builds a run on.

To plan a job too big for this machine (papers100M on 64 H100s), a run is built as
`jgraph train` builds it, by its kind's own `build`, over an `AbstractGraph` instead of
a `DistGraph`: the same handle, made from counts per partition (`Shapes`), whose
arrays are shape structs placed on the mesh and never generated. From a graph's totals
(`Counts`), partitioning is assumed to meet its balance tolerance: partition 0 holds
(1 + tolerance) x the mean of nodes, in-edges and each split (as `jgraph partition`
guarantees), the others share the rest evenly.

Where a build reads values rather than shapes, it asks `DistGraph.abstract` and takes
what counts give instead: the classes (`Shapes.classes`), the control-variate chunk
numbering (its bound). A homogeneous graph with node features.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

import jgraph.segments as segments
from jgraph.exchange import Exchange, ExchangeConfig
from jgraph.mesh import REPLICATED, ROWS, struct_on
from jgraph.partition import PartitionBook
from jgraph.partition.store import ArraySpec, PartInfo, PartitionMeta
from jgraph.sharded.graph import DistGraph, ShardedGraph, check_int32
from jgraph.sharded.tensor import DistTensor

# What partitioning guarantees: every balanced count within this of the mean (the
# default --balance-tolerance of `jgraph partition`).
BALANCE_TOLERANCE = 0.05
NODE_TYPE = "_N"
RELATION = (NODE_TYPE, "_E", NODE_TYPE)


@dataclasses.dataclass(frozen=True)
class Counts:
    """The sizes an abstract graph is made of: nodes, in-edges (those the model
    samples), feature width, classes, the nodes of each split ({name: count}; link
    prediction: none), training positive edges (link prediction; else 0) and
    partitions."""

    nodes: int
    edges: int
    feat: int
    classes: int
    splits: dict
    positives: int
    parts: int

    def largest(self, total: int) -> int:
        mean = total / self.parts
        return min(total, max(math.ceil(mean * (1 + BALANCE_TOLERANCE)), math.ceil(mean)))

    def split(self, total: int) -> np.ndarray:
        """int64[P]: partition 0 the largest, the others even, summing to total."""
        first = self.largest(total)
        if self.parts == 1:
            return np.array([total], np.int64)
        rest = total - first
        sizes = np.full(self.parts - 1, rest // (self.parts - 1), np.int64)
        sizes[:rest % (self.parts - 1)] += 1
        return np.concatenate([[first], sizes])


@dataclasses.dataclass(frozen=True)
class Described:
    """Where an abstract graph came from (`root`, as a partition directory's path in
    messages); it has no partitions to read."""

    root: str

    def part(self, k: int):
        raise TypeError(f"{self.root} is a graph of shapes (jgraph compile --abstract): "
                        f"partition {k} has no arrays to read")


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Per partition (int64[P] each): nodes, in-edges, the nodes of each split ({name:
    counts}) and training positive edges (link prediction; None: none); feat, classes:
    the feature width (0: none) and the number of classes; max_in_degree: the largest
    in-degree, where known (0: not known; then fanouts of every neighbour, -1, have no
    width)."""

    nodes: np.ndarray
    edges: np.ndarray
    splits: dict
    positives: np.ndarray | None
    feat: int
    classes: int
    max_in_degree: int = 0

    @classmethod
    def of(cls, counts: Counts) -> Shapes:
        """The partitioning of `counts` that balance guarantees (`Counts.split`)."""
        return cls(counts.split(counts.nodes), counts.split(counts.edges),
                   {name: counts.split(total) for name, total in counts.splits.items()},
                   counts.split(counts.positives) if counts.positives else None,
                   counts.feat, counts.classes)


class AbstractGraph(DistGraph):
    """A `DistGraph` of `shapes` on `mesh`: node data `feature` (float32 rows
    `shapes.feat` wide) and `label` (int classes), every array a shape struct.
    source: what it is described as in messages (a synthetic spec)."""

    abstract = True

    def __init__(self, shapes: Shapes, mesh: Mesh, source: str, *, feature: str = "feat",
                 label: str = "label"):
        P = shapes.nodes.size
        if mesh.size != P:
            raise ValueError(f"{P} partitions of counts for a mesh of {mesh.size} devices")
        self.shapes, self.mesh, self.parts = shapes, mesh, Described(source)
        sizes, edges = shapes.nodes, shapes.edges
        num_nodes, num_edges = int(sizes.sum()), int(edges.sum())
        offsets = segments.offsets(sizes)
        self.book = PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], axis=1),
                                  (NODE_TYPE,))
        parts = [PartInfo(int(sizes[k]), {NODE_TYPE: int(sizes[k])}, int(edges[k]), 0,
                          {NODE_TYPE: {name: int(c[k]) for name, c in shapes.splits.items()}},
                          {} if shapes.positives is None else
                          {"train": int(shapes.positives[k])})
                 for k in range(P)]
        node_data = {label: ArraySpec("int32", (), 0, shapes.classes - 1)}
        if shapes.feat:
            node_data[feature] = ArraySpec("float32", (shapes.feat,))
        self.meta = PartitionMeta(
            format_version=0, graph_name=source, num_parts=P, method="assumed",
            node_types=[NODE_TYPE], relations=[list(RELATION)], num_nodes=num_nodes,
            num_edges=num_edges, num_nodes_per_type={NODE_TYPE: num_nodes},
            num_edges_per_relation=[num_edges], offsets=offsets.tolist(),
            ntype_offsets=self.book.ntype_offsets.tolist(),
            orig_type_offsets=[0, num_nodes], node_data={NODE_TYPE: node_data},
            edge_data={}, splits={NODE_TYPE: list(shapes.splits)} if shapes.splits else {},
            parts=parts, edge_cut_fraction=0.0, balance={},
            balance_tolerance=BALANCE_TOLERANCE, seed=0, seconds=0.0,
            edge_splits={} if shapes.positives is None else {"train": {"negatives": 0}})
        n, e = max(int(sizes.max()), 1), max(int(edges.max()), 1)
        check_int32(num_nodes, e, f"{source} on {P} device(s)")
        rows = lambda width, dtype: struct_on(mesh, ROWS, (P * width,), dtype)
        self.graph = ShardedGraph(
            indptr=rows(n + 1, jnp.int32), indices=rows(e, jnp.int32),
            etype=rows(e, jnp.int32), edge_mask=rows(e, jnp.bool_),
            in_degree=rows(n, jnp.int32), node_mask=rows(n, jnp.bool_),
            offsets=struct_on(mesh, REPLICATED, (P + 1,), jnp.int32),
            num_nodes=num_nodes, nodes_per_part=n, edges_per_part=e, num_relations=1,
            max_in_degree=shapes.max_in_degree)

    def rows(self, rows_per_part: int, row_shape: tuple[int, ...], dtype, load, fill=0):
        """The shape of the row-sharded array `DistGraph.rows` would build."""
        return struct_on(self.mesh, ROWS, (self.mesh.size * rows_per_part, *row_shape),
                         dtype)

    def ndata(self, name: str, ntype: str | None = None) -> DistTensor:
        ntype, spec = self.node_spec(name, ntype)
        layout = self.layout(ntype)
        array = self.rows(layout.rows_per_part, spec.shape, jnp.dtype(spec.dtype), None)
        return DistTensor(array, layout, name, self.mesh)

    def split_mask(self, split: str, ntype: str | None = None) -> DistTensor:
        layout = self.layout(self.split_type(split, ntype))
        return DistTensor(self.rows(layout.rows_per_part, (), jnp.bool_, None), layout,
                          f"{split}_mask", self.mesh)

    def exchange(self, config: ExchangeConfig = ExchangeConfig(),
                 platform: str | None = None) -> Exchange:
        """Sized by its plan (`planned`): there are no batches to measure."""
        platform = platform or self.mesh.devices.flat[0].platform
        return Exchange(self.book.offsets, config, platform=platform, planned=True)

    def degrees(self):
        raise TypeError(f"{self.parts.root} is a graph of shapes: it has no degrees")
