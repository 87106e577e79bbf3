""".npy files read and written a block at a time, never memory-mapped.

A memory map's touched pages count in the process's resident memory until it is
closed, so the bounded-memory jobs go through plain file reads and writes instead: a
file written front to back (`NpyAppender`), or preallocated and written in place, in
any order and by any process (`preallocate`, `NpyRows`); a range of rows read
(`read_rows`), or a block at a time (`read_blocks`); rows gathered by id a block at a
time (`gather`); and the one reading of a header (`read_header`) that the chunked
graph, the `.npz` member stream and the partition directory's checks share.
"""
from __future__ import annotations

import os

import numpy as np


def read_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy header that `f` (a binary file, at its
    start) holds, `f` left at the first value; format 1.0, or 2.0 and later. Raises
    what numpy raises for a file that is not .npy (ValueError, EOFError)."""
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    return read(f)


class NpyAppender:
    """A .npy file of known shape written front to back, a block at a time, through a
    file rather than a memory map (a map's written pages count in the process's RSS
    until it is closed). `append` takes the next rows; `close` checks they filled it."""

    def __init__(self, path: str, dtype, shape: tuple[int, ...]):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), tuple(shape)
        self.rows = 0
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                        "fortran_order": False, "shape": self.shape})

    def append(self, values: np.ndarray, at: int | None = None) -> None:
        """The next rows; `at` (optional): the row they must start at."""
        if at is not None and at != self.rows:
            raise RuntimeError(f"{self.path}: rows from {at} written after {self.rows}")
        values = np.ascontiguousarray(values, self.dtype)
        self.file.write(values.tobytes())
        self.rows += values.shape[0] if values.ndim else 1

    def close(self) -> None:
        self.file.close()
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.path}: {self.rows} rows written of {self.shape[0]}")


def read_rows(path: str, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the .npy file at `path`, read into an array of their own (a
    slice of a memory map keeps the pages it touched resident while the map is open)."""
    with open(path, "rb") as f:
        shape, fortran, dtype = read_header(f)
        if fortran and len(shape) > 1:
            raise ValueError(f"{path}: rows of a Fortran-ordered array")
        if not 0 <= lo <= hi <= shape[0]:
            raise ValueError(f"{path}: rows [{lo}, {hi}) outside its {shape[0]}")
        row = int(np.prod(shape[1:], dtype=np.int64))
        f.seek(lo * row * dtype.itemsize, os.SEEK_CUR)
        out = np.fromfile(f, dtype, (hi - lo) * row)
    if out.size != (hi - lo) * row:
        raise ValueError(f"{path}: rows [{lo}, {hi}) past its end")
    return out.reshape(hi - lo, *shape[1:])


def read_blocks(path: str, lo: int, hi: int, rows: int):
    """(start, rows [start, start + rows) of the file) for the rows [lo, hi) of the
    .npy file at `path`, `rows` at a time (`read_rows`)."""
    for start in range(lo, hi, rows):
        yield start, read_rows(path, start, min(start + rows, hi))


def gather(path: str, ids: np.ndarray, rows_per_read: int = 1 << 20) -> np.ndarray:
    """values[ids] of the 1-D .npy file at `path`, `ids` ascending, read a block of rows
    at a time rather than memory-mapped: ids spread over the whole file would keep every
    page of a mapping resident (8 bytes a node of the graph for int64), a block holds
    `rows_per_read` rows."""
    ids = np.asarray(ids, np.int64)
    whole = np.load(path, mmap_mode="r")
    dtype, offset, total = whole.dtype, whole.offset, whole.shape[0]
    del whole
    out = np.empty(ids.size, dtype)
    cuts = np.searchsorted(ids, np.arange(0, total + rows_per_read, rows_per_read))
    with open(path, "rb") as f:
        for b in np.flatnonzero(np.diff(cuts)):
            first = int(b) * rows_per_read
            f.seek(offset + first * dtype.itemsize)
            block = np.fromfile(f, dtype, min(rows_per_read, total - first))
            out[cuts[b]:cuts[b + 1]] = block[ids[cuts[b]:cuts[b + 1]] - first]
    return out


def preallocate(path: str, dtype, shape: tuple[int, ...]) -> None:
    """A .npy file of `shape` whose rows are written later, in any order and by any
    process (`write_rows`): its header, then its full length unwritten (sparse)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                "fortran_order": False, "shape": tuple(shape)})
        f.truncate(f.tell() + np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))


class NpyRows:
    """A preallocated .npy file (`preallocate`) open for writing rows in place."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            shape, _, dtype = read_header(f)
            self.offset = f.tell()
        self.path, self.shape, self.dtype = path, shape, dtype
        self.row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        self.fd = os.open(path, os.O_WRONLY)

    def write(self, at: int, values: np.ndarray) -> None:
        """Rows [at, at + len(values))."""
        values = np.ascontiguousarray(values, self.dtype)
        rows = values.shape[0] if values.ndim else 1
        if at < 0 or at + rows > self.shape[0]:
            raise RuntimeError(f"{self.path}: rows [{at}, {at + rows}) past its "
                               f"{self.shape[0]}")
        data = memoryview(values.reshape(-1).view(np.uint8))
        offset = self.offset + at * self.row_bytes
        while data.nbytes:
            done = os.pwrite(self.fd, data, offset)
            data, offset = data[done:], offset + done

    def close(self) -> None:
        os.close(self.fd)
