"""Read and write graphs in the `.npz` layouts of jgraph's datasets.

Three layouts, told apart by their keys (see the data README):

- homogeneous: `src`, `dst` [E]; `feat` [N, D] dense or CSR (`feat_indptr`,
  `feat_indices`, `feat_data`, `feat_shape`); `label` [N]; `<name>_idx` splits;
  optional `num_nodes`, and `ndata__<name>` / `edata__<name>` for further node or edge
  arrays.
- relational (RDF): `num_nodes`, `num_relations`, `src`, `dst`, `etype` [E],
  `rel_names` [R]; labels and splits as above. One node type, one relation per etype.
- heterogeneous: `node_types`, `num_nodes__{type}`,
  `edge_index__{src}__{rel}__{dst}` [2, E], `edge_types`; `feat__{type}` or
  `featcsr__{type}__{indptr,indices,data,shape}`; `label` for `target_type`;
  `<split>_idx` and `<split>_idx__{k}` splits of the target type.

CSR features stay sparse (`SparseRows`, padded index/value rows) unless padding every
row to the fullest one would take more memory than the dense matrix; then they are
made dense, their dtype kept.
`save_npz` writes whichever layout fits the graph, and `load_npz` reads it back.
"""
from __future__ import annotations

import contextlib
import os
import re
import zipfile

import numpy as np

import jgraph.segments as segments
from jgraph.data.graph import DEFAULT_NTYPE, DEFAULT_REL, Graph, GraphError, Relation
from jgraph.data.sparse import SparseRows

_SPLIT_KEY = re.compile(r"^(?P<name>.+)_idx(__(?P<k>\d+))?$")


class DatasetError(ValueError):
    """A dataset file that cannot be read; the message names the file and the field."""


@contextlib.contextmanager
def as_dataset_errors(where: str):
    """A context in which what the writer (`ChunkedWriter`) finds wrong in the data, a
    GraphError, is raised as a DatasetError naming `where`, the data's file."""
    try:
        yield
    except GraphError as e:
        raise DatasetError(f"{where}: {e}") from None


def load_npz(path: str | os.PathLike, name: str | None = None) -> Graph:
    """Load a graph from an `.npz` file in any of jgraph's three layouts."""
    path = os.fspath(path)
    name = name or os.path.splitext(os.path.basename(path))[0]
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DatasetError(f"{path}: not a readable .npz file ({e})") from e
    try:
        if "node_types" in arrays:
            return _heterogeneous(arrays, name)
        if "etype" in arrays:
            return _relational(arrays, name)
        if "src" in arrays and "dst" in arrays:
            return _homogeneous(arrays, name)
    except KeyError as e:
        raise DatasetError(f"{path}: missing array {e.args[0]!r}") from e
    except GraphError as e:
        raise DatasetError(f"{path}: {e}") from e
    raise DatasetError(f"{path}: not a graph layout jgraph knows: expected 'src' and 'dst' "
                       f"(homogeneous), 'etype' (relational) or 'node_types' "
                       f"(heterogeneous); found {sorted(arrays)}")


def _csr_features(arrays: dict, prefix: str) -> SparseRows | np.ndarray:
    """Sparse rows from `{prefix}indptr/indices/data/shape` CSR arrays, or the dense
    matrix where padded rows would be larger (see `SparseRows.pays`)."""
    shape = arrays[prefix + "shape"]
    if np.shape(shape) != (2,):
        raise GraphError(f"{prefix}shape must be [rows, columns], got {shape!r}")
    try:
        rows = SparseRows.from_csr(arrays[prefix + "indptr"], arrays[prefix + "indices"],
                                   arrays[prefix + "data"], shape, what=f"{prefix}*")
    except ValueError as e:
        raise GraphError(str(e)) from e
    return rows if rows.pays() else rows.toarray()


def _csr_arrays(prefix: str, rows: SparseRows) -> dict[str, np.ndarray]:
    indptr, indices, data = rows.to_csr()
    return {prefix + "indptr": indptr, prefix + "indices": indices, prefix + "data": data,
            prefix + "shape": np.array(rows.shape, np.int64)}


def _dense(values) -> np.ndarray:
    """Sparse node data other than the features, written dense (the layouts store only
    features as CSR)."""
    return values.toarray() if isinstance(values, SparseRows) else values


def _splits(arrays: dict) -> dict[str, np.ndarray]:
    """`train_idx` -> split 'train'; `train_idx__40` -> split 'train_40'."""
    out = {}
    for key, value in arrays.items():
        m = _SPLIT_KEY.match(key)
        if m and not key.startswith(("ndata__", "edata__")):
            out[m["name"] + (f"_{m['k']}" if m["k"] else "")] = value
    return out


def _extra(arrays: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def _homogeneous_node_data(arrays: dict) -> dict[str, np.ndarray]:
    data = _extra(arrays, "ndata__")
    if "feat" in arrays:
        data["feat"] = arrays["feat"]
    elif "feat_indptr" in arrays:
        data["feat"] = _csr_features(arrays, "feat_")
    if "label" in arrays:
        data["label"] = arrays["label"]
    if "node_is_literal" in arrays:
        data["is_literal"] = arrays["node_is_literal"]
    return data


def _homogeneous(arrays: dict, name: str) -> Graph:
    node_data = _homogeneous_node_data(arrays)
    num_nodes = int(arrays["num_nodes"]) if "num_nodes" in arrays else None
    return Graph.homogeneous(arrays["src"], arrays["dst"], num_nodes, name=name,
                             node_data=node_data, edge_data=_extra(arrays, "edata__"),
                             splits=_splits(arrays))


def _relational(arrays: dict, name: str) -> Graph:
    num_rel = int(arrays["num_relations"])
    src, dst, etype = arrays["src"], arrays["dst"], arrays["etype"]
    if not (src.shape == dst.shape == etype.shape):
        raise GraphError(f"src, dst and etype differ in length: {src.shape}, {dst.shape}, "
                         f"{etype.shape}")
    if etype.size and (etype.min() < 0 or etype.max() >= num_rel):
        raise GraphError(f"etype has values outside [0, num_relations={num_rel})")
    names = [str(n) for n in arrays.get("rel_names", [f"r{i}" for i in range(num_rel)])]
    if len(names) != num_rel:
        raise GraphError(f"rel_names has {len(names)} entries, num_relations is {num_rel}")
    order, bounds = segments.group_by(etype, num_rel)
    edata = _extra(arrays, "edata__")
    edges, edge_data = {}, {}
    for r in range(num_rel):
        rel = Relation(DEFAULT_NTYPE, names[r], DEFAULT_NTYPE)
        sel = order[bounds[r]:bounds[r + 1]]
        edges[rel] = np.stack([src[sel], dst[sel]])
        if edata:
            edge_data[rel] = {k: v[sel] for k, v in edata.items()}
    return Graph(name=name, num_nodes={DEFAULT_NTYPE: int(arrays["num_nodes"])}, edges=edges,
                 node_data={DEFAULT_NTYPE: _homogeneous_node_data(arrays)},
                 edge_data=edge_data, splits={DEFAULT_NTYPE: _splits(arrays)})


def _heterogeneous(arrays: dict, name: str) -> Graph:
    ntypes = [str(t) for t in arrays["node_types"]]
    num_nodes = {t: int(arrays[f"num_nodes__{t}"]) for t in ntypes}
    edges, edge_data = {}, {}
    for key in (str(k) for k in arrays["edge_types"]):
        parts = key.split("__")
        if len(parts) != 3:
            raise GraphError(f"edge type {key!r} is not 'src__rel__dst'")
        rel = Relation(*parts)
        edges[rel] = arrays[f"edge_index__{key}"]
        data = _extra(arrays, f"edata__{key}__")
        if data:
            edge_data[rel] = data
    node_data = {t: {} for t in ntypes}
    for t in ntypes:
        if f"feat__{t}" in arrays:
            node_data[t]["feat"] = arrays[f"feat__{t}"]
        elif f"featcsr__{t}__indptr" in arrays:
            node_data[t]["feat"] = _csr_features(arrays, f"featcsr__{t}__")
        node_data[t].update(_extra(arrays, f"ndata__{t}__"))
    target = str(arrays["target_type"]) if "target_type" in arrays else None
    splits = {}
    if target is not None:
        if target not in num_nodes:
            raise GraphError(f"target_type {target!r} is not one of node_types {ntypes}")
        if "label" in arrays:
            node_data[target]["label"] = arrays["label"]
        splits[target] = _splits({k: v for k, v in arrays.items() if "_idx" in k})
    return Graph(name=name, num_nodes=num_nodes, edges=edges, node_data=node_data,
                 edge_data=edge_data, splits=splits)


# -- writing --------------------------------------------------------------------------


def save_npz(graph: Graph, path: str | os.PathLike, compress: bool = False) -> None:
    """Write `graph` in the layout that fits it, so that `load_npz` reads it back.

    A homogeneous graph is written in the homogeneous layout (readable by any tool
    that reads `cora.npz`), a graph with one node type and several relations in the
    relational layout, anything else in the heterogeneous layout. The layouts have no
    place for the user's ids (`Graph.ids`): a graph with them is refused, not written
    without them (`save_chunked` keeps them).
    """
    if graph.ids:
        raise GraphError(f"graph {graph.name!r} has the user's ids of {sorted(graph.ids)}, "
                         f"which an .npz file cannot hold: save it with save_chunked, or "
                         f"drop them first (graph.replace(ids={{}}))")
    single_type = len(graph.num_nodes) == 1
    arrays = _single_type_arrays(graph) if single_type else _heterogeneous_arrays(graph)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    (np.savez_compressed if compress else np.savez)(path, **arrays)


def _single_type_arrays(graph: Graph) -> dict[str, np.ndarray]:
    (ntype, n), = graph.num_nodes.items()
    arrays: dict[str, np.ndarray] = {"num_nodes": np.int64(n)}
    rels = graph.relations
    if graph.is_homogeneous and rels[0].name == DEFAULT_REL:
        arrays["src"], arrays["dst"] = graph.edges[rels[0]]
        for k, v in graph.edge_data.get(rels[0], {}).items():
            arrays[f"edata__{k}"] = v
    else:
        src, dst, etype = graph.homogeneous_edges()
        arrays.update(src=src, dst=dst, etype=etype.astype(np.int64),
                      num_relations=np.int64(len(rels)),
                      rel_names=np.array([r.name for r in rels]))
        names = {k for r in rels for k in graph.edge_data.get(r, {})}
        for k in names:
            arrays[f"edata__{k}"] = np.concatenate([_edge_array(graph, r, k) for r in rels])
    for k, v in graph.node_data.get(ntype, {}).items():
        if k == "feat" and isinstance(v, SparseRows):
            arrays.update(_csr_arrays("feat_", v))
        else:
            arrays[k if k in ("feat", "label") else f"ndata__{k}"] = _dense(v)
    for k, v in graph.splits.get(ntype, {}).items():
        arrays[f"{k}_idx"] = v
    return arrays


def _edge_array(graph: Graph, rel: Relation, key: str) -> np.ndarray:
    data = graph.edge_data.get(rel, {})
    if key not in data:
        raise GraphError(f"edge data {key!r} is on some relations but not on {tuple(rel)}; "
                         f"the relational layout needs it on all")
    return data[key]


def _heterogeneous_arrays(graph: Graph) -> dict[str, np.ndarray]:
    labelled = [t for t in graph.node_types if "label" in graph.node_data.get(t, {})]
    split_types = [t for t in graph.node_types if graph.splits.get(t)]
    targets = set(labelled) | set(split_types)
    if len(targets) > 1:
        raise GraphError(f"the heterogeneous layout has one target type, but labels or "
                         f"splits are on {sorted(targets)}")
    arrays: dict[str, np.ndarray] = {"node_types": np.array(graph.node_types)}
    if targets:
        (target,) = targets
        arrays["target_type"] = np.array(target)
        for k, v in graph.splits.get(target, {}).items():
            arrays[f"{k}_idx"] = v
    for t, n in graph.num_nodes.items():
        arrays[f"num_nodes__{t}"] = np.int64(n)
        for k, v in graph.node_data.get(t, {}).items():
            if k == "label":
                arrays["label"] = v
            elif k == "feat" and isinstance(v, SparseRows):
                arrays.update(_csr_arrays(f"featcsr__{t}__", v))
            elif k == "feat":
                arrays[f"feat__{t}"] = v
            else:
                arrays[f"ndata__{t}__{k}"] = _dense(v)
    keys = []
    for rel, index in graph.edges.items():
        key = "__".join(rel)
        if len(key.split("__")) != 3:
            raise GraphError(f"relation {tuple(rel)} contains '__' and cannot be written "
                             f"in the heterogeneous layout")
        keys.append(key)
        arrays[f"edge_index__{key}"] = index
        for k, v in graph.edge_data.get(rel, {}).items():
            arrays[f"edata__{key}__{k}"] = v
    arrays["edge_types"] = np.array(keys)
    return arrays
