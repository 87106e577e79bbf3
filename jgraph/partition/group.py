"""The processes of one partitioning job, and how they agree.

`jgraph partition` run under `python -m jgraph.launch --num-processes N` (or SLURM's
`srun`, Open MPI's `mpirun`) is N processes of one `jax.distributed` job. Each owns a
contiguous range of the node ids (`Group.nodes`) and a share of the edge blocks, and
they meet at barriers. What they exchange goes two ways:

- small values (counts, loads, moves, a phase's facts) through the key-value store of
  `jax.distributed`'s coordination service (`Group.gather`, `Group.sum`);
- per-node arrays (a level's cluster labels, the partitions after a refinement pass)
  through files in the job's work directory, which every process must see (the same
  requirement as the output directory: one folder on a shared file system), each
  process writing its own slice (`Group.share`); and what one process has for another
  (requests to join a cluster another process owns, the sums of its nodes' weights
  into such clusters), one file from each process to each other (`Group.exchange`,
  `Group.add_at_owners`).

A process that dies fails the job: `jgraph.launch` stops the others and names it, and
under SLURM or Open MPI the coordination service's heartbeat does the same. One
process is `Group.single()`, whose every method does nothing or returns its input.
"""
from __future__ import annotations

import io
import os
from collections.abc import Callable

import numpy as np

import jgraph.segments as segments

# Barriers wait this long for a slow peer (a phase may run for an hour on one process
# more than another); a peer that dies is noticed by the heartbeat well before.
BARRIER_TIMEOUT_MS = 24 * 3600 * 1000


def _jax_job() -> tuple[int, int, object] | None:
    """(this process's id, the process count, the coordination service's client) of the
    running jax.distributed job, or None where none was started.

    It reads JAX's private state, here and nowhere else in jgraph.partition: JAX has
    no public way to the coordination client (its key-value store and barriers, which
    `Group` is built on): `jax.distributed` exports only initialize, is_initialized and
    shutdown, in 0.10 and in 0.11 alike, and JAX's own `multihost_utils` and array
    serialization read this same `global_state`. The public `jax.process_index()` and
    `jax.process_count()` would start the backends, which partitioning never uses.
    """
    import jax
    if not jax.distributed.is_initialized():
        return None
    from jax._src import distributed  # private: see above
    state = distributed.global_state
    return state.process_id, state.num_processes or 1, state.client


class Group:
    """`size` processes, this one `rank`; `client`: jax.distributed's coordination
    client (None for one process); `scratch`: a folder every process sees, for the
    per-node slices `share` exchanges (set with `use_scratch`)."""

    def __init__(self, rank: int = 0, size: int = 1, client=None):
        self.rank, self.size, self.client = rank, size, client
        self.scratch: str | None = None
        self._count = 0

    @classmethod
    def single(cls) -> Group:
        return cls()

    @classmethod
    def from_jax(cls) -> Group:
        """The running jax.distributed job's processes (one if none was started)."""
        job = _jax_job()
        if job is None or job[1] == 1:
            return cls.single()
        return cls(*job)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def use_scratch(self, folder: str) -> None:
        self.scratch = folder

    def nodes(self, n: int, rank: int | None = None) -> tuple[int, int]:
        """The node ids [lo, hi) of process `rank` (this one by default): n split in
        `size` contiguous, near-equal ranges."""
        rank = self.rank if rank is None else rank
        return n * rank // self.size, n * (rank + 1) // self.size

    def mine(self, i: int) -> bool:
        """Whether this process takes the i-th of a sequence of equal shares (edge
        blocks, partitions): every size-th, from its rank."""
        return i % self.size == self.rank

    def _key(self, name: str) -> str:
        self._count += 1
        return f"jgraph-partition/{self._count}/{name}"

    def barrier(self, name: str) -> None:
        """Wait until every process reaches this barrier (each calls the same sequence
        of barriers and gathers)."""
        if self.size > 1:
            self.client.wait_at_barrier(self._key(name), BARRIER_TIMEOUT_MS)

    def gather(self, value, name: str = "gather") -> list:
        """Every process's `value` (a numpy array or anything `np.save` takes with
        pickling off: numbers, lists of numbers), in rank order."""
        if self.size == 1:
            return [value]
        key = self._key(name)
        buf = io.BytesIO()
        np.save(buf, np.asarray(value), allow_pickle=False)
        self.client.key_value_set_bytes(f"{key}/{self.rank}", buf.getvalue())
        out = []
        for r in range(self.size):
            raw = self.client.blocking_key_value_get_bytes(f"{key}/{r}", BARRIER_TIMEOUT_MS)
            out.append(np.load(io.BytesIO(raw), allow_pickle=False))
        # Nobody deletes a key another may still read: the next barrier ends its use.
        self.barrier(name + " read")
        self.client.key_value_delete(f"{key}/{self.rank}")
        return out

    def sum(self, value, name: str = "sum"):
        """The sum over processes of `value` (an array or number), added in rank order,
        so every process gets the same bits."""
        if self.size == 1:
            return value
        parts = self.gather(np.asarray(value), name)
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        return total

    def share(self, full: np.ndarray, bounds, name: str) -> np.ndarray:
        """Fill `full` (a per-node array of which this process has written its own rows
        [bounds[rank], bounds[rank + 1])) with every other process's rows, through a
        file per process in the scratch folder. Returns `full`."""
        if self.size == 1:
            return full
        if self.scratch is None:
            raise RuntimeError("Group.share needs a scratch folder (use_scratch)")
        path = lambda r: os.path.join(self.scratch, f"{name}.{r}.npy")
        lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
        np.save(path(self.rank) + ".tmp.npy", full[lo:hi])
        os.replace(path(self.rank) + ".tmp.npy", path(self.rank))
        self.barrier(name + " written")
        for r in range(self.size):
            if r != self.rank:
                full[int(bounds[r]):int(bounds[r + 1])] = np.load(path(r))
        self.barrier(name + " read")
        os.remove(path(self.rank))
        return full

    def exchange(self, outgoing: list[dict[str, np.ndarray]] | Callable[[int], dict],
                 name: str, each: Callable[[dict], None] | None = None
                 ) -> list[dict[str, np.ndarray]]:
        """What each process sends each other: `outgoing[r]` (named arrays) goes to
        process r; returns, in rank order, what every process sent this one (this
        process's own `outgoing[rank]` as it is), through a file for each pair.
        `outgoing` may be a function of r, called once for each process in turn, so
        that only one process's arrays are made and held at a time; with `each`, what
        each process sent is handed to each(arrays) in rank order instead, one at a
        time, and nothing is returned."""
        make = outgoing if callable(outgoing) else outgoing.__getitem__
        incoming: list = []
        take = incoming.append if each is None else each
        if self.size == 1:
            take(make(0))
            return incoming
        if self.scratch is None:
            raise RuntimeError("Group.exchange needs a scratch folder (use_scratch)")
        path = lambda src, dst: os.path.join(self.scratch, f"{name}.{src}-{dst}.npz")
        for r in range(self.size):
            if r != self.rank:
                with open(path(self.rank, r) + ".tmp", "wb") as f:
                    np.savez(f, **make(r))
                os.replace(path(self.rank, r) + ".tmp", path(self.rank, r))
        own = make(self.rank)
        self.barrier(name + " written")
        for r in range(self.size):
            if r == self.rank:
                take(own)
                own = None
                continue
            with np.load(path(r, self.rank), allow_pickle=False) as f:
                got = {key: f[key] for key in f.files}
            os.remove(path(r, self.rank))
            take(got)
            got = None
        self.barrier(name + " read")
        return incoming

    def add_at_owners(self, ids: np.ndarray, values, bounds, name: str) -> np.ndarray:
        """float64[hi - lo, C]: for the ids [lo, hi) = [bounds[rank], bounds[rank + 1])
        this process owns, the sum over every process of `values` at `ids` [m] (ids
        anywhere in [0, bounds[-1])); `values`: [m] or [m, C], or a sequence of C
        columns [m] (each in its own dtype: not widened together).

        Each process sums its values a column and an owner at a time, into an array
        over that owner's ids, and sends the owner those sums (`exchange`, one owner's
        made at a time, and those received added one at a time): what it holds beyond
        its ids and values is a few arrays over one owner's share of the id range,
        never the whole range nor a copy of the values."""
        bounds = np.asarray(bounds, np.int64)
        lo, hi = int(bounds[self.rank]), int(bounds[self.rank + 1])
        if isinstance(values, np.ndarray):
            values = [values] if values.ndim == 1 else [values[:, c]
                                                        for c in range(values.shape[1])]

        def sums(r: int) -> dict[str, np.ndarray]:
            a, b = int(bounds[r]), int(bounds[r + 1])
            inside = (ids >= a) & (ids < b)
            local = (ids[inside] - a).astype(np.intp)
            return {f"c{c}": np.bincount(local, weights=column[inside], minlength=b - a)
                    for c, column in enumerate(values)}
        out = np.zeros((hi - lo, len(values)))

        def add(got: dict[str, np.ndarray]) -> None:     # one process's sums at a time
            for c in range(len(values)):
                out[:, c] += got[f"c{c}"]
        self.exchange(sums, name, each=add)
        return out

    def look_up(self, ids: np.ndarray, own: np.ndarray, bounds, name: str) -> np.ndarray:
        """values[ids] of an array over [0, bounds[-1]) that each process holds only its
        part of: `own` = values[lo:hi] for the ids [lo, hi) = [bounds[rank],
        bounds[rank + 1]) this process owns; `ids` anywhere. Each id is asked of its
        owner (`exchange`, twice: the ids, then their values), so a process holds its
        own part, its ids and those asked of it, never the whole array. Every process
        calls it, with no ids where it has none to ask."""
        ids = np.asarray(ids)
        if self.size == 1:
            return own[ids]
        bounds = np.asarray(bounds, np.int64)
        lo = int(bounds[self.rank])
        order, firsts = segments.group_by(segments.segment_of(bounds, ids), self.size)
        asked = self.exchange(lambda r: {"ids": ids[order[firsts[r]:firsts[r + 1]]]},
                              name + " asked")
        answers = self.exchange(lambda r: {"values": own[asked[r]["ids"] - lo]},
                                name + " answered")
        out = np.empty(ids.shape, own.dtype)
        for r, got in enumerate(answers):
            out[order[firsts[r]:firsts[r + 1]]] = got["values"]
        return out
