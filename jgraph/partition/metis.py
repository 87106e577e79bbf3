"""METIS k-way partitioning with several balance constraints.

DistDGL balances node types, splits and edges with METIS's multi-constraint mode
(`ncon` > 1). pymetis fixes `ncon` at 1, so jgraph calls the METIS library that the
`cmeel-metis` wheel ships (Linux x86-64) through ctypes, and falls back to pymetis
with one combined weight elsewhere. Either way `jgraph.partition.assignment` refines the
result afterwards, so every constraint ends within tolerance; the backend only
changes how much refining is needed and so how many edges end up cut.

Memory. METIS keeps every level of its coarsening in memory; power-law graphs coarsen
slowly (each level keeps most of the edges of the one before), so on an R-MAT graph
METIS alone holds about 60 bytes per adjacency entry, some 12 GB for 100M edges. With
its `ONDISK` option, which jgraph sets, the finer levels wait on disk while the coarser
ones are built and are read back while the partition is projected up: about 25 bytes
per entry, the same partition, some 7 % more time. METIS writes those files (only those
of graphs past 128 MB) into its working directory, so `part_kway` runs it inside a
temporary directory of its own.
"""
from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import importlib.metadata
import os
import tempfile

import numpy as np
import scipy.sparse

_NOPTIONS = 40          # METIS_NOPTIONS
_OPTION_SEED = 9        # METIS_OPTION_SEED
_OPTION_ONDISK = 11     # METIS_OPTION_ONDISK
_OPTION_NUMBERING = 19  # METIS_OPTION_NUMBERING (metis.h enum order)
_METIS_OK = 1
_IDX_MAX = 2**31 - 1    # cmeel-metis is built with 32-bit idx_t


class Backend(enum.Enum):
    LIBMETIS = "libmetis"   # multi-constraint, via cmeel-metis
    PYMETIS = "pymetis"     # one combined constraint


@functools.cache
def _libmetis():
    """The METIS shared library from the cmeel-metis wheel, or None if absent."""
    try:
        dist = importlib.metadata.distribution("cmeel-metis")
    except importlib.metadata.PackageNotFoundError:
        return None
    lib_dir = dist.locate_file("cmeel.prefix/lib")
    try:
        # libmetis needs GKlib, which its RUNPATH does not find: load it globally first.
        ctypes.CDLL(str(lib_dir / "libGKlib.so"), mode=ctypes.RTLD_GLOBAL)
        return ctypes.CDLL(str(lib_dir / "libmetis.so"))
    except OSError:
        return None


def available_backends() -> tuple[Backend, ...]:
    return ((Backend.LIBMETIS,) if _libmetis() is not None else ()) + (Backend.PYMETIS,)


def part_kway(adj: scipy.sparse.csr_matrix, weights: np.ndarray, num_parts: int, *,
              seed: int = 0, imbalance: float = 0.05,
              backend: Backend | None = None, spill_dir: str | None = None) -> np.ndarray:
    """int32[N]: METIS k-way partition of a symmetric graph.

    adj: symmetric CSR without self-loops; its values are integer edge weights.
    weights: float64[N, C] node weights, one column per balance constraint; all-zero
      columns are ignored.
    imbalance: allowed max/mean - 1 per constraint (METIS's `ubvec`).
    spill_dir: where METIS's temporary directory for the coarsening levels it keeps on
      disk goes (default: the system's temporary directory); libmetis only.
    """
    backend = backend or available_backends()[0]
    if adj.nnz > _IDX_MAX:
        raise ValueError(f"METIS takes at most {_IDX_MAX} adjacency entries, the graph has "
                         f"{adj.nnz}; use --method random for graphs this large")
    totals = weights.sum(axis=0)
    weights = weights[:, totals > 0]
    if backend is Backend.LIBMETIS:
        with _inside_temporary_directory(spill_dir):
            return _part_libmetis(adj, weights, num_parts, seed, imbalance)
    # One weight: each constraint scaled to the same total, summed.
    scaled = weights / weights.sum(axis=0) * (4.0 * weights.shape[0])
    combined = np.maximum(np.rint(scaled.sum(axis=1)), 1)
    return _part_pymetis(adj, combined, num_parts, seed)


@contextlib.contextmanager
def _inside_temporary_directory(parent: str | None):
    """Run the block with a new temporary directory (under `parent`) as the working
    directory, where METIS writes its on-disk levels; both undone afterwards. The working
    directory is the process's: other threads must not open relative paths meanwhile."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="jgraph-metis-", dir=parent) as spill:
        os.chdir(spill)
        try:
            yield
        finally:
            os.chdir(before)


def _integer_weights(weights: np.ndarray) -> np.ndarray:
    """int32 weights; fractional or huge columns are rescaled to keep their ratios."""
    out = np.empty(weights.shape, np.int32)
    for c in range(weights.shape[1]):
        col = weights[:, c]
        if np.all(col == np.rint(col)) and col.sum() < _IDX_MAX // 4:
            out[:, c] = col
        else:
            out[:, c] = np.rint(col * ((_IDX_MAX // 4) / col.sum()))
    return out


def _part_libmetis(adj, weights, num_parts, seed, imbalance) -> np.ndarray:
    lib = _libmetis()
    n = adj.shape[0]
    ncon = weights.shape[1]
    as_ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    xadj = np.ascontiguousarray(adj.indptr, np.int32)
    adjncy = np.ascontiguousarray(adj.indices, np.int32)
    adjwgt = np.ascontiguousarray(adj.data, np.int32)
    vwgt = np.ascontiguousarray(_integer_weights(weights))
    options = np.zeros(_NOPTIONS, np.int32)
    lib.METIS_SetDefaultOptions(as_ptr(options))
    options[_OPTION_SEED] = seed & 0x7FFFFFFF
    options[_OPTION_ONDISK] = 1
    options[_OPTION_NUMBERING] = 0
    ubvec = np.full(ncon, 1.0 + imbalance, np.float32)
    nvtxs = np.array([n], np.int32)
    ncon_ = np.array([ncon], np.int32)
    nparts = np.array([num_parts], np.int32)
    objval = np.zeros(1, np.int32)
    part = np.zeros(n, np.int32)
    status = lib.METIS_PartGraphKway(
        as_ptr(nvtxs), as_ptr(ncon_), as_ptr(xadj), as_ptr(adjncy), as_ptr(vwgt), None,
        as_ptr(adjwgt), as_ptr(nparts), None, as_ptr(ubvec), as_ptr(options),
        as_ptr(objval), as_ptr(part))
    if status != _METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway failed with status {status}")
    return part


def _part_pymetis(adj, vweights, num_parts, seed) -> np.ndarray:
    import pymetis

    options = pymetis.Options(seed=int(seed) & 0x7FFFFFFF)
    adjacency = pymetis.CSRAdjacency(adj.indptr.astype(np.int64), adj.indices.astype(np.int64))
    _, membership = pymetis.part_graph(
        num_parts, adjacency=adjacency, vweights=vweights.astype(np.int64),
        eweights=adj.data.astype(np.int64), options=options, recursive=False)
    return np.asarray(membership, np.int32)
