"""What every benchmark does first: load GRAPH, partition it, open it on the mesh."""
from __future__ import annotations

import contextlib
import tempfile
from typing import Iterator

from jgraph.data import DatasetError, load_dataset, symmetrize
from jgraph.dist import DistGraph, make_mesh
from jgraph.dist.mesh import first_devices
from jgraph.partition import PartitionMeta, partition_graph
from jgraph.progress import Progress


@contextlib.contextmanager
def partition_on_mesh(spec: str, num_parts: int, method: str, *, symmetrized: bool,
                      seed: int, bench: str, progress: Progress,
                      node_data: tuple[str, ...] = (), splits: tuple[str, ...] = ()
                      ) -> Iterator[tuple[PartitionMeta, DistGraph]]:
    """Load `spec` (an npz, a built-in name or synthetic:...), partition it into
    `num_parts` and open it on a mesh of the first `num_parts` devices.

    A context manager yielding (meta, dist_graph); the partition directory lives until
    it exits. The graph must be homogeneous with every array of `node_data` and a
    non-empty split of each name in `splits`, else DatasetError names `bench` and what
    it needs.
    """
    mesh = make_mesh(num_parts, first_devices(num_parts))
    with tempfile.TemporaryDirectory(prefix="jgraph-bench-") as tmp:
        with progress.phase("loading graph"):
            graph = load_dataset(spec)
            if symmetrized:
                graph = symmetrize(graph)
        ntypes = graph.node_types
        missing = [n for n in node_data if n not in graph.node_data.get(ntypes[0], {})]
        if len(ntypes) != 1 or missing:
            wanted = f" with node data {list(node_data)}" if node_data else ""
            raise DatasetError(f"{spec}: jgraph bench {bench} needs a homogeneous "
                               f"graph{wanted}" + (f"; missing {missing}" if missing else ""))
        if splits and not all(len(graph.splits.get(ntypes[0], {}).get(s, ())) for s in splits):
            raise DatasetError(f"{spec}: jgraph bench {bench} needs a non-empty "
                               f"{'/'.join(splits)} split; the graph has "
                               f"{ {k: len(v) for k, v in graph.splits.get(ntypes[0], {}).items()} }")
        with progress.phase(f"partitioning ({method}, {num_parts} parts)"):
            meta = partition_graph(graph, num_parts, method, tmp, seed=seed)
        del graph
        yield meta, DistGraph(tmp, mesh)
