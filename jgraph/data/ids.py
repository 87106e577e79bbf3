"""The user's own node ids: from them to jgraph's, and back.

A graph built from the user's tables (`jgraph convert SCHEMA.yaml OUT`) numbers each node type
0..n-1 in the order its nodes were read, and keeps the user's id of every node
(`Graph.ids`, the chunked directory's and the partition directory's `ids/<type>.npy`):
int64, or UTF-8 strings stored as fixed-width bytes. `IdMap` answers "which node is the
user's id x" for a batch of ids at a time, in memory proportional to the node count:
integers by binary search over the sorted ids; strings by a 64-bit hash of their bytes,
searched the same way and then compared byte for byte (ids whose hashes collide fall
back to searching the bytes themselves).
"""
from __future__ import annotations

import numpy as np

from jgraph.data.graph import GraphError, shown_id

_BLOCK = 1 << 20                 # values hashed at a time: bounds the temporaries
_BASIS = np.uint64(0x9E3779B97F4A7C15)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64, each bit out moved by every bit in."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def hash_bytes(values: np.ndarray) -> np.ndarray:
    """uint64 hash of each fixed-width bytes value, the same at any width (numpy ignores
    trailing NULs: b"ab" == b"ab\\0"). A value is read as little-endian 64-bit words,
    NUL-padded to a whole word, and each word that is not all NUL is folded in as
    h = mix(h ^ word); a word of NULs leaves h as it was, so padding never counts.
    Values that differ in one word, not NUL in either, always hash apart (each fold is
    a bijection of h); a word of NULs inside a value is skipped too, a real collision
    that IdMap's exact fallback resolves."""
    values = np.ascontiguousarray(values).reshape(-1)
    width = values.dtype.itemsize
    words = -(-width // 8)
    out = np.empty(values.size, np.uint64)
    raw = values.view(np.uint8).reshape(values.size, width)
    with np.errstate(over="ignore"):
        for a in range(0, values.size, _BLOCK):
            block = raw[a:a + _BLOCK]
            padded = np.zeros((len(block), 8 * words), np.uint8)
            padded[:, :width] = block
            word = padded.view("<u8")
            h = np.full(len(block), _BASIS, np.uint64)
            for j in range(words):
                h = np.where(word[:, j] != 0, _mix(h ^ word[:, j]), h)
            out[a:a + _BLOCK] = h
    return out


def as_user_ids(values, kind: str) -> np.ndarray:
    """`values` in the stored form of a type whose ids are of `kind` ("i": int64, "S":
    UTF-8 bytes); GraphError where they cannot be (a string where ids are integers)."""
    values = np.asarray(values)
    if kind == "S":
        if values.dtype.kind == "U":
            return np.char.encode(values, "utf-8")
        if values.dtype.kind == "S":
            return values
        if values.dtype.kind in "iu" or values.dtype == object:
            return np.char.encode(values.astype(str), "utf-8")
        raise GraphError(f"ids of dtype {values.dtype} for a type whose ids are strings")
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.dtype.kind in "USO":
        try:
            return values.astype(np.int64)
        except ValueError:
            bad = next(v for v in values.reshape(-1) if not _is_int(v))
            raise GraphError(f"id {shown_id(bad) if isinstance(bad, bytes) else repr(bad)} is "
                             f"not an integer, and this type's ids are integers") from None
    raise GraphError(f"ids of dtype {values.dtype}: give integers or strings")


def _is_int(value) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def repeats(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, again): positions of each id listed more than once, its earlier and
    later place, sorted by id (empty where all are unique). Strings are compared by their
    hashes first and byte for byte only where hashes meet, so no sort of the strings
    themselves runs over every id."""
    keys = hash_bytes(ids) if ids.dtype.kind == "S" else ids
    order = np.argsort(keys, kind="stable")
    same = keys[order][1:] == keys[order][:-1]
    shared = np.zeros(ids.size, bool)           # ids whose key another id has too
    shared[order[1:][same]] = shared[order[:-1][same]] = True
    candidates = np.flatnonzero(shared)         # few: repeats, and hash collisions
    values = ids[candidates]
    by_value = np.argsort(values, kind="stable")   # equal ids: the earlier place first
    twice = np.flatnonzero(values[by_value][1:] == values[by_value][:-1])
    return candidates[by_value[twice]], candidates[by_value[twice + 1]]


def decoded(ids: np.ndarray) -> np.ndarray:
    """User ids as a caller sees them: int64, or numpy str (UTF-8 decoded)."""
    return np.char.decode(ids, "utf-8") if ids.dtype.kind == "S" else ids


class IdMap:
    """The user's ids of one node type and the lookup from them to node positions.

    ids: int64[n] or bytes_[n], unique (node i is the user's ids[i]).
    `positions(values, where)` gives int64 positions of `values` (any ids of the same
    kind), or raises GraphError naming `where` and the first id that is not a node;
    `find(values)` gives -1 for those instead.
    """

    def __init__(self, ids: np.ndarray):
        self.ids = np.asarray(ids).reshape(-1)
        self.kind = "S" if self.ids.dtype.kind == "S" else "i"
        keys = hash_bytes(self.ids) if self.kind == "S" else self.ids
        self._order = np.argsort(keys)
        self._sorted = keys[self._order]
        # Distinct strings whose hashes collide: search the bytes themselves instead.
        self._exact = self.kind == "S" and bool((self._sorted[1:] == self._sorted[:-1]).any())
        if self._exact:
            self._order = np.argsort(self.ids, kind="stable")
            self._sorted = self.ids[self._order]

    def __len__(self) -> int:
        return int(self.ids.size)

    def find(self, values) -> np.ndarray:
        """int64 positions of `values`, -1 where a value is no node's id."""
        values = as_user_ids(values, self.kind).reshape(-1)
        if not len(self):
            return np.full(values.size, -1, np.int64)
        keys = values if self.kind == "i" or self._exact else hash_bytes(values)
        # The queries in key order: the binary searches then walk the sorted keys one
        # way, their paths in cache (at 10M ids, 10x faster than in the callers' order).
        by_key = np.argsort(keys)
        at = np.minimum(np.searchsorted(self._sorted, keys[by_key]), len(self) - 1)
        pos = self._order[at]
        out = np.empty(values.size, np.int64)
        out[by_key] = np.where(self.ids[pos] == values[by_key], pos, -1)
        return out

    def positions(self, values, where: str) -> np.ndarray:
        """int64 positions of `values`; GraphError naming `where` and the first id that
        is no node's (with how many are not)."""
        pos = self.find(values)
        missing = np.flatnonzero(pos < 0)
        if missing.size:
            bad = as_user_ids(values, self.kind).reshape(-1)[missing[0]]
            raise GraphError(f"{where}: id {shown_id(bad)} (row {int(missing[0])}) is not a "
                             f"node of the type ({missing.size} unknown id(s))")
        return pos
