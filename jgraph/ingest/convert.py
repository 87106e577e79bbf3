"""Convert a graph to the chunked format (`jgraph.data.chunked`), streaming what is large.

`convert(spec, out)` takes anything `load_dataset` reads, and DGL's chunked graph
directories. A homogeneous OGB dataset directory is streamed: edges, features and labels
pass through a chunk at a time, so memory is bounded by the chunk sizes, not by the
graph (ogbn-papers100M: 1.6B edges and 111M x 128 features). A DGL chunked graph
directory (DGL's or GraphStorm's metadata.json with csv / numpy / parquet files) is
streamed too, by `jgraph.ingest.dgl.convert_dgl`. Anything else (built-in graphs, `.npz`
files, synthetic specs, ogbn-mag) is loaded whole and written by `save_chunked`.

papers100M's binary layout keeps its arrays in `.npz` files, zip archives of `.npy`
members, deflated (`np.savez_compressed`) or stored (`np.savez`). `NpzMember` reads one
member as a stream: its `.npy` header, then its values in blocks. `edge_index` [2, E]
in C order holds every source before every destination, so it is read as two streams
of the member in lockstep, the second started at row 1 (for a deflated member that
start costs one pass of decompressing row 0).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

import jgraph.segments as segments
from jgraph.data.chunked import (
    ChunkedWriter,
    check_chunked_out,
    is_chunked_dir,
    is_dgl_chunked_dir,
    save_chunked,
)
from jgraph.data.datasets import load_dataset
from jgraph.data.graph import GraphError
from jgraph.data.npz import DatasetError, as_dataset_errors
from jgraph.data.ogb import (
    _SPLITS,
    csv_blocks,
    is_ogb_dir,
    ogb_split_dir,
    read_ogb_csv,
    read_ogb_labels,
    read_ogb_values,
)
from jgraph.data.prepare import Preparation
from jgraph.data.prepare_chunked import prepare_chunked
from jgraph.ingest.dgl import convert_dgl
from jgraph.npy import read_header
from jgraph.progress import Progress

EDGES_PER_CHUNK, ROWS_PER_CHUNK = 1 << 24, 1 << 20
# Bytes read from a zip member per call: bounds the decompressor's temporary buffers.
_PIECE = 1 << 24
# Seconds between two progress lines while edges stream.
_NOTE_EVERY = 10.0
_READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, zipfile.BadZipFile)


# -- one member of an .npz, as a stream ----------------------------------------------------


class NpzMember:
    """One array of an `.npz` file, read front to back; use it as a context manager.

    Fields: path; key; shape; dtype (native byte order); fortran — stored column-major
    (2-D and up); size — values in all; position — values read or skipped so far.
    `read(count)` gives the next `count` values in storage order (fewer at the end),
    `skip(count)` passes over values. Errors are DatasetErrors naming file and key.
    """

    def __init__(self, path: str | os.PathLike, key: str):
        self.path, self.key = os.fspath(path), key
        self.where = f"{self.path}: {key}"
        self._zip = _open_zip(self.path)
        try:
            names = self._zip.namelist()
            member = f"{key}.npy" if f"{key}.npy" in names else key
            if member not in names:
                raise DatasetError(f"{self.path}: no array {key!r}; it holds "
                                   f"{sorted(n.removesuffix('.npy') for n in names)}")
            self._file = self._zip.open(member)
            shape, fortran, stored = read_header(self._file)
            if stored.hasobject:
                raise DatasetError(f"{self.where}: holds Python objects, not numbers")
        except DatasetError:
            self.close()
            raise
        except _READ_ERRORS as e:
            self.close()
            raise DatasetError(f"{self.where}: not a readable .npy member ({e})") from None
        self.shape = tuple(int(s) for s in shape)
        self.fortran = bool(fortran) and len(self.shape) > 1
        self._stored = stored
        self.dtype = stored.newbyteorder("=")
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.position = 0

    def __enter__(self) -> NpzMember:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(*_READ_ERRORS):
            if getattr(self, "_file", None) is not None:
                self._file.close()
            self._zip.close()

    def read(self, count: int) -> np.ndarray:
        """The next `count` values (fewer where the array ends), 1-D, in storage order."""
        count = max(0, min(count, self.size - self.position))
        out = np.empty(count, self._stored)
        raw = out.view(np.uint8)
        filled = 0
        while filled < raw.size:
            try:
                piece = self._file.read(min(raw.size - filled, _PIECE))
            except _READ_ERRORS as e:
                raise DatasetError(f"{self.where}: cannot be read past value "
                                   f"{self.position + filled // out.itemsize} ({e})") from None
            if not piece:
                raise DatasetError(f"{self.where}: truncated: ends after "
                                   f"{self.position + filled // out.itemsize} of its "
                                   f"{self.size} values ({self._stored}{list(self.shape)})")
            raw[filled:filled + len(piece)] = np.frombuffer(piece, np.uint8)
            filled += len(piece)
        self.position += count
        return out.astype(self.dtype, copy=False)

    def skip(self, count: int) -> None:
        """Pass over the next `count` values (a deflated member decompresses them)."""
        count = max(0, min(count, self.size - self.position))
        left = count * self._stored.itemsize
        try:
            while left:         # in pieces: a deflated member's seek reads what it skips
                step = min(left, _PIECE)
                self._file.seek(step, os.SEEK_CUR)
                left -= step
        except _READ_ERRORS as e:
            raise DatasetError(f"{self.where}: cannot be read ({e})") from None
        self.position += count


def _open_zip(path: str) -> zipfile.ZipFile:
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such file")
    try:
        return zipfile.ZipFile(path)
    except _READ_ERRORS as e:
        raise DatasetError(f"{path}: not a readable .npz (zip) file ({e})") from None


def npz_keys(path: str | os.PathLike) -> list[str]:
    """The array names of an `.npz` file, without reading any array."""
    with _open_zip(os.fspath(path)) as z:
        return [n.removesuffix(".npy") for n in z.namelist()]


def npz_shape(path: str | os.PathLike, key: str) -> tuple[int, ...]:
    """The shape of array `key` of an `.npz` file, from its header alone."""
    with NpzMember(path, key) as member:
        return member.shape


def npz_rows(path: str | os.PathLike, key: str, rows: int) -> Iterator[np.ndarray]:
    """Array `key` of an `.npz` file in blocks of at most `rows` rows (along axis 0),
    [k, *shape[1:]] each, read as a stream: memory bounded by one block."""
    with NpzMember(path, key) as member:
        if not member.shape:
            raise DatasetError(f"{member.where}: a scalar, not an array of rows")
        if member.fortran:
            raise DatasetError(f"{member.where}: stored in Fortran (column-major) order, "
                               f"which cannot be read by rows as a stream; save it in C order")
        n, row_shape = member.shape[0], member.shape[1:]
        width = int(np.prod(row_shape, dtype=np.int64))
        for start in range(0, n, rows):
            k = min(rows, n - start)
            yield member.read(k * width).reshape(k, *row_shape)


def npz_edge_index(path: str | os.PathLike, key: str, edges: int
                   ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) blocks of at most `edges` edges of a [2, E] array `key` of an `.npz`
    file: in C order two streams of it in lockstep, one from each row."""
    with contextlib.ExitStack() as stack:
        src = stack.enter_context(NpzMember(path, key))
        if len(src.shape) != 2 or src.shape[0] != 2:
            raise DatasetError(f"{src.where}: shape {list(src.shape)}, expected [2, E]")
        e = src.shape[1]
        if src.fortran:         # stored as [E, 2]: each edge's pair together
            for start in range(0, e, edges):
                pairs = src.read(2 * min(edges, e - start)).reshape(-1, 2)
                yield pairs[:, 0], pairs[:, 1]
            return
        dst = stack.enter_context(NpzMember(path, key))
        dst.skip(e)
        for start in range(0, e, edges):
            k = min(edges, e - start)
            yield src.read(k), dst.read(k)


# -- OGB directories, streamed ---------------------------------------------------------------


class Stream(NamedTuple):
    """Blocks of one array and where they come from (named in errors)."""

    where: str
    blocks: Iterable


def is_streamed(spec: str | os.PathLike) -> bool:
    """Whether `convert` streams `spec`: a homogeneous OGB dataset directory."""
    spec = os.fspath(spec)
    return (os.path.isdir(spec) and is_ogb_dir(spec)
            and not os.path.exists(os.path.join(spec, "raw", "num-node-dict.csv.gz")))


def convert_ogb(path: str | os.PathLike, out: str | os.PathLike, *, split: str | None = None,
                name: str | None = None, edges_per_chunk: int = EDGES_PER_CHUNK,
                rows_per_chunk: int = ROWS_PER_CHUNK, overwrite: bool = False,
                progress: Progress | None = None) -> None:
    """Write a homogeneous OGB dataset directory as a chunked graph, a chunk at a time:
    the same graph as `load_ogb(path, split)` gives, never read whole."""
    path = os.fspath(path)
    if not is_streamed(path):
        raise DatasetError(f"{path}: not a homogeneous OGB dataset directory (raw/edge.csv.gz "
                           f"or raw/data.npz)")
    raw = os.path.join(path, "raw")
    binary = os.path.exists(os.path.join(raw, "data.npz"))
    num_nodes, edges, node_data = (_binary(raw, edges_per_chunk, rows_per_chunk) if binary
                                   else _csv(raw, edges_per_chunk, rows_per_chunk))
    split_dir = ogb_split_dir(path, split)
    splits = _splits(split_dir) if split_dir else {}
    write_streams(out, num_nodes, edges, node_data, splits,
                  name=name or os.path.basename(os.path.normpath(path)),
                  rows_per_chunk=rows_per_chunk, overwrite=overwrite,
                  progress=progress or Progress(enabled=False))


def _binary(raw: str, edges: int, rows: int) -> tuple[int, Stream, dict[str, Stream]]:
    """papers100M's layout: raw/data.npz (edge_index [2, E], node_feat [N, F], node_year
    [N, 1], num_nodes_list [1], num_edges_list [1]) and raw/node-label.npz (node_label
    [N, 1], NaN where unlabelled), read as load_ogb reads them."""
    data, labels = os.path.join(raw, "data.npz"), os.path.join(raw, "node-label.npz")
    keys = npz_keys(data)
    if "edge_index" not in keys:
        raise DatasetError(f"{data}: no array 'edge_index'; it holds {sorted(keys)}")
    # jgraph's name -> (file, array, what each row block becomes), as load_ogb reads them
    members = {}
    if "node_feat" in keys and np.prod(npz_shape(data, "node_feat")):
        members["feat"] = (data, "node_feat", _as_is)
    if "node_year" in keys:
        members["year"] = (data, "node_year", _one_column)
    if os.path.exists(labels):
        members["label"] = (labels, "node_label", _labels)
    node_data = {name: Stream(f"{file}: {key}", map(block, npz_rows(file, key, rows)))
                 for name, (file, key, block) in members.items()}
    shape = npz_shape(data, "edge_index")
    if len(shape) != 2 or shape[0] != 2:
        raise DatasetError(f"{data}: edge_index has shape {list(shape)}, expected [2, E]")
    num_edges = shape[1]
    if "num_edges_list" in keys and _one_count(data, "num_edges_list") != num_edges:
        raise DatasetError(f"{data}: num_edges_list says {_one_count(data, 'num_edges_list')} "
                           f"edges, edge_index holds {num_edges}")
    if "num_nodes_list" in keys:
        num_nodes = _one_count(data, "num_nodes_list")
    elif members:           # as load_ogb: the node arrays' rows, else the largest id + 1
        file, key, _ = next(iter(members.values()))
        num_nodes = npz_shape(file, key)[0]
    else:
        num_nodes = 1 + max((int(max(s.max(initial=-1), d.max(initial=-1)))
                             for s, d in npz_edge_index(data, "edge_index", edges)), default=-1)
    edge_stream = Stream(f"{data}: edge_index", (
        (src, dst, {}) for src, dst in npz_edge_index(data, "edge_index", edges)))
    return num_nodes, edge_stream, node_data


def _as_is(block: np.ndarray) -> np.ndarray:
    return block


def _one_column(block: np.ndarray) -> np.ndarray:
    return block.reshape(-1)


def _labels(block: np.ndarray) -> np.ndarray:
    """OGB's float labels, NaN where unlabelled, as int64 classes with -1 there."""
    return np.where(np.isnan(block), -1, block).astype(np.int64).reshape(-1)


def _one_count(file: str, key: str) -> int:
    """The count of a one-graph dataset's [1] array (num_nodes_list, num_edges_list)."""
    with NpzMember(file, key) as member:
        counts = member.read(member.size)
    if counts.size != 1:
        raise DatasetError(f"{file}: {key} holds {counts.size} graphs' counts; jgraph reads "
                           f"node-property datasets (one graph)")
    return int(counts[0])


def _csv(raw: str, edges: int, rows: int) -> tuple[int, Stream, dict[str, Stream]]:
    """ogbn-arxiv's and -products' layout: raw/edge.csv.gz (+ edge-feat.csv.gz),
    num-node-list.csv.gz, node-feat.csv.gz, node_year.csv.gz, node-label.csv.gz."""
    num_nodes = int(read_ogb_csv(os.path.join(raw, "num-node-list.csv.gz"), np.int64)[0, 0])
    node_data = {}
    feat = os.path.join(raw, "node-feat.csv.gz")
    if os.path.exists(feat):
        node_data["feat"] = Stream(feat, (b.astype(np.float32)
                                          for b in csv_blocks(feat, rows=rows)))
    # One value per node: small enough to read whole (and read as load_ogb reads them).
    for file, key, read in (("node_year.csv.gz", "year", read_ogb_values),
                            ("node-label.csv.gz", "label", read_ogb_labels)):
        file = os.path.join(raw, file)
        if os.path.exists(file):
            node_data[key] = Stream(file, _blocks(read(file), rows))
    edge_file = os.path.join(raw, "edge.csv.gz")
    feat_file = os.path.join(raw, "edge-feat.csv.gz")
    blocks = (_csv_edges(edge_file, feat_file, edges) if os.path.exists(feat_file)
              else ((b[:, 0], b[:, 1], {}) for b in _pairs(edge_file, edges)))
    return num_nodes, Stream(edge_file, blocks), node_data


def _blocks(values: np.ndarray, rows: int) -> Iterator[np.ndarray]:
    for a in range(0, max(len(values), 1), rows):
        yield values[a:a + rows]


def _pairs(file: str, edges: int) -> Iterator[np.ndarray]:
    for block in csv_blocks(file, np.int64, edges):
        if block.shape[1] != 2:
            raise DatasetError(f"{file}: {block.shape[1]} columns, expected 2 (src,dst)")
        yield block


def _csv_edges(edge_file: str, feat_file: str, edges: int):
    """(src, dst, {"feat": float32}) blocks of edge.csv.gz and edge-feat.csv.gz read in
    lockstep."""
    seen = 0
    for pairs, feat in itertools.zip_longest(_pairs(edge_file, edges),
                                             csv_blocks(feat_file, rows=edges)):
        if pairs is None or feat is None or len(pairs) != len(feat):
            raise DatasetError(f"{feat_file}: has a different number of lines from "
                               f"{edge_file} (they agree for the first {seen})")
        seen += len(pairs)
        feat = feat.astype(np.float32)
        yield pairs[:, 0], pairs[:, 1], {"feat": feat[:, 0] if feat.shape[1] == 1 else feat}


def _splits(directory: str) -> dict[str, np.ndarray]:
    """split/<name>/{train,valid,test}.csv.gz as sorted ids (OGB lists them in any
    order), named train, val, test."""
    out = {}
    for ogb_name, name in _SPLITS.items():
        file = os.path.join(directory, f"{ogb_name}.csv.gz")
        if os.path.exists(file):
            ids = read_ogb_csv(file, np.int64)[:, 0]
            unique = segments.distinct(ids)
            if unique.size != ids.size:
                raise DatasetError(f"{file}: lists {ids.size - unique.size} node(s) more "
                                   f"than once")
            out[name] = unique
    return out


# -- writing ----------------------------------------------------------------------------------


def write_streams(out: str | os.PathLike, num_nodes: int, edges: Stream,
                  node_data: dict[str, Stream], splits: dict[str, np.ndarray], *,
                  name: str, rows_per_chunk: int = ROWS_PER_CHUNK, overwrite: bool = False,
                  progress: Progress | None = None) -> None:
    """Write a homogeneous graph given as streams: `edges` of (src, dst, {name: data})
    blocks, one chunk each; `node_data` of row blocks in id order; sorted `splits`."""
    progress = progress or Progress(enabled=False)
    with ChunkedWriter(out, num_nodes, name=name, overwrite=overwrite) as w:
        with progress.phase("edges"), as_dataset_errors(edges.where):
            count, chunks, noted = 0, 0, time.perf_counter()
            for src, dst, data in edges.blocks:
                w.add_edges(src, dst, data=data)
                count, chunks = count + len(src), chunks + 1
                if time.perf_counter() - noted >= _NOTE_EVERY:
                    progress.note(f"{chunks:,} edge chunks written, {count:,} edges so far")
                    noted = time.perf_counter()
            progress.note(f"{chunks:,} edge chunks, {count:,} edges")
        with progress.phase("node data"):
            for key, stream in node_data.items():
                count = 0
                with as_dataset_errors(stream.where):
                    for rows in stream.blocks:
                        w.add_node_data(key, rows)
                        count += len(rows)
                if count != num_nodes:
                    raise DatasetError(f"{stream.where}: node data {key!r} has {count} rows, "
                                       f"the graph has {num_nodes} nodes")
        for key, ids in splits.items():
            for a in range(0, max(len(ids), 1), rows_per_chunk):
                w.add_split(key, ids[a:a + rows_per_chunk])


# -- any input ------------------------------------------------------------------------------


def convert(spec: str | os.PathLike, out: str | os.PathLike, *,
            edges_per_chunk: int = EDGES_PER_CHUNK, rows_per_chunk: int = ROWS_PER_CHUNK,
            overwrite: bool = False, progress: Progress | None = None) -> None:
    """Write the graph `spec` names (anything `load_dataset` reads, or a DGL chunked
    graph directory) as a chunked graph directory `out`: a homogeneous OGB directory, a
    DGL chunked directory and a chunked directory (re-chunked, with what was done to it
    and its held-out edges) streamed, anything else read whole."""
    progress = progress or Progress(enabled=False)
    for flag, value in (("edges_per_chunk", edges_per_chunk), ("rows_per_chunk", rows_per_chunk)):
        if value < 1:
            raise GraphError(f"{flag} must be at least 1, got {value}")
    check_chunked_out(os.path.realpath(os.fspath(out)), overwrite)   # before a long read
    if is_streamed(spec):
        convert_ogb(spec, out, edges_per_chunk=edges_per_chunk, rows_per_chunk=rows_per_chunk,
                    overwrite=overwrite, progress=progress)
        return
    if is_chunked_dir(spec):
        prepare_chunked(spec, out, Preparation(), overwrite=overwrite, progress=progress,
                        block_edges=edges_per_chunk, rows_per_chunk=rows_per_chunk)
        return
    if is_dgl_chunked_dir(spec):
        convert_dgl(spec, out, edges_per_chunk=edges_per_chunk, rows_per_chunk=rows_per_chunk,
                    overwrite=overwrite, progress=progress)
        return
    with progress.phase("loading dataset"):
        graph = load_dataset(spec)
    with progress.phase("writing chunks"):
        save_chunked(graph, out, edges_per_chunk=edges_per_chunk,
                     rows_per_chunk=rows_per_chunk, overwrite=overwrite)
