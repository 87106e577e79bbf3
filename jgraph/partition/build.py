"""`partition_graph`: assign, relabel, and write the partition directory.

Relabelling: nodes are sorted by (partition, original homogeneous id). Since the
original ids number the node types one after another, each partition's range holds its
nodes type by type, and within a type in original order.
"""
from __future__ import annotations

import os
import shutil
import time

import numpy as np

from jgraph.data.graph import Graph
from jgraph.partition.assignment import (Method, PartitionError, assign, balance,
                                         check_request, constraints_for, parse_method,
                                         undirected_adjacency)
from jgraph.partition.metis import Backend
from jgraph.partition.store import (FORMAT_VERSION, PartitionMeta, part_dir, save_array,
                                    write_meta)
from jgraph.progress import Progress


def partition_graph(graph: Graph, num_parts: int, method: Method | str, out_dir: str | os.PathLike,
                    *, seed: int = 0, tolerance: float = 0.05, rebalance: bool = True,
                    overwrite: bool = False, backend: Backend | None = None,
                    progress: Progress | None = None) -> PartitionMeta:
    """Partition `graph` into `num_parts` and write the directory `out_dir`.

    Returns the metadata that `out_dir/meta.json` holds. `tolerance` is the allowed
    max/mean - 1 of every balance constraint; `rebalance=False` keeps the raw METIS or
    random assignment (its balance is still measured and reported).
    """
    start = time.perf_counter()
    progress = progress or Progress(enabled=False)
    method = parse_method(method)
    check_request(graph, num_parts, tolerance)      # before anything is written
    out_dir = os.fspath(out_dir)
    _prepare_dir(out_dir, overwrite)
    edge_data = _homogeneous_edge_data(graph)   # fail early on inconsistent edge data

    with progress.phase("constraints and adjacency"):
        constraints = constraints_for(graph)
        adjacency = (undirected_adjacency(graph)
                     if (method is Method.METIS or rebalance) and num_parts > 1 else None)
    with progress.phase(f"assigning nodes ({method.value})"):
        parts = assign(graph, num_parts, method, seed=seed, tolerance=tolerance,
                       rebalance=rebalance, constraints=constraints, adjacency=adjacency,
                       backend=backend)
    del adjacency

    with progress.phase("relabelling"):
        node_map = np.argsort(parts, kind="stable").astype(np.int64)   # new -> original
        inverse = np.empty_like(node_map)
        inverse[node_map] = np.arange(node_map.size)
        type_ids = graph.node_type_ids()
        num_types = len(graph.node_types)
        counts = np.bincount(parts.astype(np.int64) * num_types + type_ids,
                             minlength=num_parts * num_types).reshape(num_parts, num_types)
        offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
        ntype_offsets = offsets[:-1, None] + np.concatenate(
            [np.zeros((num_parts, 1), np.int64), np.cumsum(counts, axis=1)], axis=1)
        save_array(os.path.join(out_dir, "node_map.npy"), node_map)
        save_array(os.path.join(out_dir, "node_map_inv.npy"), inverse)

    with progress.phase("sorting edges by destination"):
        src, dst, etype = graph.homogeneous_edges()
        cut = float(np.mean(parts[src] != parts[dst])) if src.size else 0.0
        new_src, new_dst = inverse[src], inverse[dst]
        del src, dst
        order = np.lexsort((new_src, etype, new_dst))
        new_src, new_dst, etype = new_src[order], new_dst[order], etype[order]
        edge_bounds = np.searchsorted(new_dst, offsets)

    orig_offsets = graph.type_offsets()
    part_info = []
    for k in progress.iterate(range(num_parts), "writing partitions", num_parts):
        d = part_dir(out_dir, k)
        lo, hi = int(offsets[k]), int(offsets[k + 1])
        e0, e1 = int(edge_bounds[k]), int(edge_bounds[k + 1])
        indptr = np.searchsorted(new_dst[e0:e1], np.arange(lo, hi + 1)).astype(np.int64)
        sources = new_src[e0:e1]
        halo = np.unique(sources[(sources < lo) | (sources >= hi)])
        save_array(os.path.join(d, "indptr.npy"), indptr)
        save_array(os.path.join(d, "indices.npy"), sources)
        save_array(os.path.join(d, "etype.npy"), etype[e0:e1])
        save_array(os.path.join(d, "edge_ids.npy"), order[e0:e1].astype(np.int64))
        save_array(os.path.join(d, "halo.npy"), halo)
        for name, values in edge_data.items():
            save_array(os.path.join(d, "edge", f"{name}.npy"), values[order[e0:e1]])
        for t, ntype in enumerate(graph.node_types):
            # Original type-local ids of this part's nodes of type t, in new-id order.
            rows = node_map[ntype_offsets[k, t]:ntype_offsets[k, t + 1]] - orig_offsets[t]
            for name, values in graph.node_data.get(ntype, {}).items():
                save_array(os.path.join(d, "node", ntype, f"{name}.npy"), values[rows])
        split_counts = {}
        for ntype, named in graph.splits.items():
            t = graph.node_types.index(ntype)
            split_counts[ntype] = {}
            for name, idx in named.items():
                new_ids = inverse[orig_offsets[t] + idx]
                mine = np.sort(new_ids[(new_ids >= lo) & (new_ids < hi)])
                save_array(os.path.join(d, "split", ntype, f"{name}.npy"), mine)
                split_counts[ntype][name] = int(mine.size)
        part_info.append({
            "num_nodes": hi - lo,
            "num_nodes_per_type": dict(zip(graph.node_types, counts[k].tolist())),
            "num_edges": e1 - e0,
            "num_halo": int(halo.size),
            "splits": split_counts,
        })

    meta = PartitionMeta(
        format_version=FORMAT_VERSION,
        graph_name=graph.name,
        num_parts=num_parts,
        method=method.value,
        node_types=list(graph.node_types),
        relations=[list(r) for r in graph.relations],
        num_nodes=graph.total_nodes,
        num_edges=graph.num_edges,
        num_nodes_per_type=dict(graph.num_nodes),
        num_edges_per_relation=[int(e.shape[1]) for e in graph.edges.values()],
        offsets=offsets.tolist(),
        ntype_offsets=ntype_offsets.tolist(),
        orig_type_offsets=orig_offsets.tolist(),
        node_data={t: {name: _spec(v) for name, v in data.items()}
                   for t, data in graph.node_data.items() if data},
        edge_data={name: _spec(v) for name, v in edge_data.items()},
        splits={t: list(named) for t, named in graph.splits.items() if named},
        parts=part_info,
        edge_cut_fraction=cut,
        balance=balance(parts, constraints, num_parts),
        balance_tolerance=tolerance,
        seed=seed,
        seconds=time.perf_counter() - start,
    )
    write_meta(out_dir, meta)
    return meta


def _spec(values: np.ndarray) -> dict:
    return {"dtype": values.dtype.name, "shape": list(values.shape[1:])}


def _homogeneous_edge_data(graph: Graph) -> dict[str, np.ndarray]:
    """Edge data laid end to end over the relations (the homogeneous edge order)."""
    names = sorted({k for data in graph.edge_data.values() for k in data})
    out = {}
    for name in names:
        pieces = []
        for rel in graph.relations:
            data = graph.edge_data.get(rel, {})
            if name not in data:
                raise PartitionError(f"edge data {name!r} is on some relations but not on "
                                     f"{tuple(rel)}; partitioned edge data must cover every "
                                     f"relation")
            pieces.append(data[name])
        out[name] = np.concatenate(pieces)
    return out


def _prepare_dir(out_dir: str, overwrite: bool) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PartitionError(f"--out {out_dir}: exists and is not a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not overwrite:
            raise PartitionError(f"--out {out_dir}: directory is not empty; choose another "
                                 f"or pass overwrite (--overwrite)")
        if not os.path.exists(os.path.join(out_dir, "meta.json")):
            raise PartitionError(f"--out {out_dir}: not a jgraph partition directory; "
                                 f"refusing to overwrite it")
        os.remove(os.path.join(out_dir, "meta.json"))   # first: never a stale valid dir
        for entry in os.listdir(out_dir):
            path = os.path.join(out_dir, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(out_dir, exist_ok=True)
