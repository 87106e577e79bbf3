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

from jgraph.data.graph import GraphError, _shown

# FNV-1a's 64-bit offset basis and prime: one multiply and one xor a byte.
_FNV_BASIS, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def hash_bytes(values: np.ndarray) -> np.ndarray:
    """uint64 FNV-1a of each fixed-width bytes value (its trailing NULs excluded, as
    numpy compares them), one vectorised pass per byte column."""
    values = np.ascontiguousarray(values)
    width = values.dtype.itemsize
    raw = values.view(np.uint8).reshape(values.size, width)
    out = np.full(values.size, _FNV_BASIS, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            byte = raw[:, j].astype(np.uint64)
            # NUL padding ends a value: leave its hash as it was.
            out = np.where(byte != 0, (out ^ byte) * _FNV_PRIME, out)
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
            raise GraphError(f"id {_shown(bad) if isinstance(bad, bytes) else repr(bad)} is "
                             f"not an integer, and this type's ids are integers") from None
    raise GraphError(f"ids of dtype {values.dtype}: give integers or strings")


def _is_int(value) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


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
        self.ids = np.asarray(ids)
        self.kind = "S" if self.ids.dtype.kind == "S" else "i"
        self._keys = hash_bytes(self.ids) if self.kind == "S" else self.ids
        self._order = np.argsort(self._keys, kind="stable")
        sorted_keys = self._keys[self._order]
        self._sorted = sorted_keys
        # Distinct strings whose hashes collide: search the bytes themselves instead.
        self._exact = self.kind == "S" and bool((sorted_keys[1:] == sorted_keys[:-1]).any())
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
        at = np.minimum(np.searchsorted(self._sorted, keys), len(self) - 1)
        pos = self._order[at]
        found = self.ids[pos] == values
        return np.where(found, pos, -1).astype(np.int64)

    def positions(self, values, where: str) -> np.ndarray:
        """int64 positions of `values`; GraphError naming `where` and the first id that
        is no node's (with how many are not)."""
        pos = self.find(values)
        missing = np.flatnonzero(pos < 0)
        if missing.size:
            bad = as_user_ids(values, self.kind).reshape(-1)[missing[0]]
            raise GraphError(f"{where}: id {_shown(bad)} (row {int(missing[0])}) is not a "
                             f"node of the type ({missing.size} unknown id(s))")
        return pos
