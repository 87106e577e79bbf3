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

Determinism. METIS draws its random numbers from the C library's `rand()`, whose state
is the process's: another thread that calls `rand()` while METIS runs (the gRPC client
of `jax.distributed`'s coordination service does) changes the partition, about once
in a hundred calls of a few milliseconds and nearly always in a long one. Where other
threads may do so (once `jax.distributed` is started: a job of several processes),
`part_kway` runs METIS in a child process of its own, which reads the graph from files
in its temporary directory.
"""
from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import importlib.metadata
import os
import resource
import signal
import subprocess
import sys
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
              backend: Backend | None = None, spill_dir: str | None = None,
              isolated: bool | None = None) -> np.ndarray:
    """int32[N]: METIS k-way partition of a symmetric graph.

    adj: symmetric CSR without self-loops; its values are integer edge weights.
    weights: float64[N, C] node weights, one column per balance constraint; all-zero
      columns are ignored.
    imbalance: allowed max/mean - 1 per constraint (METIS's `ubvec`).
    spill_dir: where METIS's temporary directory for the coarsening levels it keeps on
      disk goes (default: the system's temporary directory); libmetis only.
    isolated: run METIS in a child process of its own (see the module docstring);
      None: where `jax.distributed` runs in this process. The child's peak memory
      counts in the phase being sampled (`PhasePeak.add_child`).
    """
    backend = backend or available_backends()[0]
    if adj.nnz > _IDX_MAX:
        raise ValueError(f"METIS takes at most {_IDX_MAX} adjacency entries, the graph has "
                         f"{adj.nnz}; use --method random for graphs this large")
    totals = weights.sum(axis=0)
    weights = weights[:, totals > 0]
    if backend is Backend.LIBMETIS:
        arrays = _libmetis_arrays(adj, weights)
    else:
        # One weight: each constraint scaled to the same total, summed.
        scaled = weights / weights.sum(axis=0) * (4.0 * weights.shape[0])
        arrays = (adj.indptr, adj.indices, adj.data,
                  np.maximum(np.rint(scaled.sum(axis=1)), 1).astype(np.int64))
    if _rand_shared() if isolated is None else isolated:
        with tempfile.TemporaryDirectory(prefix="jgraph-metis-", dir=spill_dir) as spill:
            return _part_in_child(spill, backend, arrays, num_parts, seed, imbalance)
    if backend is Backend.LIBMETIS:
        with _inside_temporary_directory(spill_dir):
            return _part_libmetis(*arrays, num_parts, seed, imbalance)
    return _part_pymetis(*arrays, num_parts, seed)


def _rand_shared() -> bool:
    """Whether another thread of this process may call `rand()` while METIS runs:
    `jax.distributed`'s client, whose threads do, has been started."""
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


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


_ARRAYS = ("xadj", "adjncy", "adjwgt", "vwgt")


def _libmetis_arrays(adj, weights) -> tuple[np.ndarray, ...]:
    """METIS's int32 arrays of the graph: (xadj, adjncy, adjwgt, vwgt [n, ncon])."""
    return (np.ascontiguousarray(adj.indptr, np.int32),
            np.ascontiguousarray(adj.indices, np.int32),
            np.ascontiguousarray(adj.data, np.int32),
            np.ascontiguousarray(_integer_weights(weights)))


def _part_in_child(folder: str, backend: Backend, arrays, num_parts: int, seed: int,
                   imbalance: float) -> np.ndarray:
    """`backend`'s METIS in a child process (this file run as a script, in `folder`,
    which holds the arrays and receives the partition); its peak memory counted in the
    phase being sampled."""
    from jgraph.memory import PhasePeak  # not loaded by the child itself
    for name, values in zip(_ARRAYS, arrays):
        np.save(os.path.join(folder, f"{name}.npy"), values)
    # -P: the script's folder (jgraph/partition) is not put on the module path.
    proc = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), folder,
                           backend.value, str(num_parts), str(seed), repr(float(imbalance))],
                          cwd=folder, capture_output=True, text=True)
    if proc.returncode:
        how = (f"exit {proc.returncode}" if proc.returncode > 0 else
               f"killed by {signal.Signals(-proc.returncode).name}"
               + (" (out of memory?)" if proc.returncode == -signal.SIGKILL else ""))
        # METIS says what it refused on stdout; Python's error is stderr's last line.
        said = [out.strip().splitlines()[-1] for out in (proc.stdout, proc.stderr)
                if out.strip()]
        raise RuntimeError(f"METIS in a child process failed ({how})"
                           + (": " + " / ".join(said) if said else ""))
    PhasePeak.add_child(int(proc.stdout.split()[-1]))
    return np.load(os.path.join(folder, "part.npy"))


def _own_peak_bytes() -> int:
    """This process's peak resident memory since it started its program (Linux's
    VmHWM; `ru_maxrss` would count the parent's memory it was forked with)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _part_libmetis(xadj, adjncy, adjwgt, vwgt, num_parts, seed, imbalance) -> np.ndarray:
    lib = _libmetis()
    n = xadj.size - 1
    ncon = vwgt.shape[1]
    as_ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
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


def _part_pymetis(xadj, adjncy, adjwgt, vweights, num_parts, seed) -> np.ndarray:
    import pymetis

    options = pymetis.Options(seed=int(seed) & 0x7FFFFFFF)
    adjacency = pymetis.CSRAdjacency(np.asarray(xadj, np.int64), np.asarray(adjncy, np.int64))
    _, membership = pymetis.part_graph(
        num_parts, adjacency=adjacency, vweights=np.asarray(vweights, np.int64),
        eweights=np.asarray(adjwgt, np.int64), options=options, recursive=False)
    return np.asarray(membership, np.int32)


if __name__ == "__main__":
    # An isolated METIS (`_part_in_child`):
    #   python -P metis.py FOLDER BACKEND PARTS SEED IMBALANCE
    folder, backend_, parts, seed_, imbalance_ = sys.argv[1:]
    loaded = [np.load(os.path.join(folder, f"{name}.npy"), mmap_mode="c") for name in _ARRAYS]
    found = (_part_libmetis(*loaded, int(parts), int(seed_), float(imbalance_))
             if Backend(backend_) is Backend.LIBMETIS
             else _part_pymetis(*loaded, int(parts), int(seed_)))
    np.save(os.path.join(folder, "part.npy"), found)
    print(_own_peak_bytes())
