"""Reading the tables a schema names: CSV and Parquet files, a batch of rows at a
time with pyarrow (`Table`), and their columns as checked numpy arrays (ids, numbers,
list rows, labels, split codes).

pyarrow is imported when a conversion starts (`import_pyarrow`), never when jgraph is.
CSV columns are read as strings and converted here, so that each bad value is named:
errors in the data are `DatasetError`s naming the file, the column and the row
(counted from 0, a CSV's header not counted).
"""
from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from jgraph.data.npz import DatasetError
from jgraph.ingest.schema import Label

CSV_BLOCK_BYTES = 1 << 24       # bytes of a CSV file parsed at a time
SPLITS = ("train", "val", "test")
# The names a split column may hold, and the split each one means (an index of SPLITS).
_SPLIT_VALUES = {"train": 0, "val": 1, "valid": 1, "validation": 1, "test": 2}
_EXTENSIONS = (".csv", ".tsv", ".parquet", ".pq")


# -- reading tables -----------------------------------------------------------------------


def import_pyarrow(csv: bool = True):
    """pyarrow, with the modules of it used here, or a DatasetError naming the extra.
    `csv=False` leaves out its CSV reader, for callers that read only Parquet."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
        if csv:
            import pyarrow.csv
    except ImportError:
        raise DatasetError('reading CSV and Parquet tables needs pyarrow: pip install '
                           '"jgraph[tables]"') from None
    return pyarrow


def table_files(patterns: Iterable[str], where: str) -> list[str]:
    """The files `patterns` name, each glob's matches sorted; a DatasetError naming
    `where` for a pattern that matches none."""
    files = []
    for pattern in patterns:
        found = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
        if not found:
            raise DatasetError(f"{where}: {pattern}: no such file")
        files += [f for f in found if f not in files]
    return files


class Column(NamedTuple):
    """A column of one batch of a file: its values (a pyarrow Array) and where they
    come from (`at(i)` names value i's file, column and row)."""

    values: Any
    path: str
    name: str
    start: int

    def at(self, i: int) -> str:
        return f"{self.path}: column {self.name!r} row {self.start + int(i)}"


class Table:
    """One CSV (.csv, .tsv, optionally compressed: .csv.gz) or Parquet file, read in
    batches of the columns asked. Its `fmt` ("csv" or "parquet") and a CSV's `delimiter`
    are told by the file's name unless given; a CSV without a `header` row has its
    columns named f0, f1, ... (DGL's edge files: no header, a space between ids)."""

    def __init__(self, pa, path: str, *, fmt: str | None = None,
                 delimiter: str | None = None, header: bool = True):
        self.pa, self.path, self.header = pa, path, header
        bare = path.lower()
        for suffix in (".gz", ".bz2", ".zst", ".lz4"):
            bare = bare.removesuffix(suffix)
        if fmt is None and not bare.endswith(_EXTENSIONS):
            raise DatasetError(f"{path}: not a table file jgraph reads (by its name: "
                               f"{', '.join(_EXTENSIONS)}; CSV may be compressed, .csv.gz)")
        self.parquet = bare.endswith((".parquet", ".pq")) if fmt is None else fmt == "parquet"
        self.delimiter = delimiter or ("\t" if bare.endswith(".tsv") else ",")

    def _csv(self, columns: list[str] | None):
        pa = self.pa
        convert = (pa.csv.ConvertOptions(column_types={c: pa.string() for c in columns},
                                         include_columns=columns, strings_can_be_null=False)
                   if columns is not None else None)
        return pa.csv.open_csv(self.path,
                               read_options=pa.csv.ReadOptions(
                                   block_size=CSV_BLOCK_BYTES,
                                   autogenerate_column_names=not self.header),
                               parse_options=pa.csv.ParseOptions(delimiter=self.delimiter),
                               convert_options=convert)

    def _schema(self):
        """The file's columns and their types (a CSV's as inferred from its first block)."""
        try:
            if self.parquet:
                with self.pa.parquet.ParquetFile(self.path) as f:
                    return f.schema_arrow
            return self._csv(None).schema
        except (self.pa.ArrowException, OSError) as e:
            raise DatasetError(f"{self.path}: cannot be read ({e})") from None

    def _check(self, schema, columns: Iterable[str]) -> None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise DatasetError(f"{self.path}: no column {missing[0]!r}; its columns are "
                               f"{schema.names}")

    def columns(self) -> list[str]:
        """The file's column names (a CSV's from its first block)."""
        return self._schema().names

    def id_kind(self, column: str) -> str:
        """"i" where `column` of a Parquet file is typed as integers, else "S" (strings).
        A CSV file's ids are strings unless the schema says `id_type: int`: text such as
        "0042" is an id as written, and inferring integers would answer 42."""
        schema = self._schema()
        self._check(schema, [column])
        typed = self.parquet and self.pa.types.is_integer(schema.field(column).type)
        return "i" if typed else "S"

    def batches(self, columns: Iterable[str], rows: int) -> Iterator[dict[str, Column]]:
        """{column: Column} of at most `rows` rows at a time, in file order."""
        columns = list(dict.fromkeys(columns))
        start = 0
        for batch in self._record_batches(columns, rows):
            for a in range(0, batch.num_rows, rows):
                part = batch.slice(a, rows)
                yield {c: Column(part.column(c), self.path, c, start + a) for c in columns}
            start += batch.num_rows

    def _record_batches(self, columns: list[str], rows: int):
        pa = self.pa
        try:
            if self.parquet:
                with pa.parquet.ParquetFile(self.path) as f:
                    self._check(f.schema_arrow, columns)
                    # A reader keeps every row group it decoded until it ends (pyarrow 26:
                    # 3 GiB by the end of 100M string-id edges): a reader per run of
                    # about `rows` rows.
                    for run in _row_group_runs(f.metadata, rows):
                        yield from f.iter_batches(batch_size=rows, row_groups=run,
                                                  columns=columns)
                return
            try:
                reader = self._csv(columns)
            except pa.ArrowKeyError:            # a column not in the header
                self._check(self._schema(), columns)
                raise
            yield from reader
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{self.path}: cannot be read ({e})") from None


def _row_group_runs(metadata, rows: int) -> Iterator[list[int]]:
    """A Parquet file's row groups in runs of consecutive ones of `rows` rows at most
    (or one larger group)."""
    run, count = [], 0
    for group in range(metadata.num_row_groups):
        size = metadata.row_group(group).num_rows
        if run and count + size > rows:
            yield run
            run, count = [], 0
        run.append(group)
        count += size
    if run:
        yield run


# -- columns as numpy ---------------------------------------------------------------------


def _plain(pa, values):
    """`values` with dictionary encoding undone, and string views as plain strings."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if getattr(pa.types, "is_string_view", lambda _: False)(values.type):
        values = values.cast(pa.large_string())
    return values


def _is_text(pa, kind) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _parsed(pa, col: Column, values, to, what: str):
    """Strings `values` cast to `to` (a pyarrow Array; nulls stay null), or a
    DatasetError naming the first value that is not `what`."""
    try:
        return pa.compute.cast(values, to)
    except pa.ArrowInvalid:
        for i, v in enumerate(values.to_pylist()):
            try:
                pa.compute.cast(pa.array([v], values.type), to)
            except pa.ArrowInvalid:
                raise DatasetError(f"{col.at(i)}: {v!r} is not {what}") from None
        raise


def fixed_bytes(pa, values) -> np.ndarray:
    """A pyarrow string Array as numpy fixed-width UTF-8 bytes (S<k>), its bytes placed by
    one vectorised scatter, without a Python object per value."""
    values = values.cast(pa.large_binary())
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], np.int64)[values.offset:values.offset + n + 1]
    lengths = np.diff(offsets)
    width = max(int(lengths.max(initial=0)), 1)
    out = np.zeros((n, width), np.uint8)            # NUL past each value's end
    if lengths.any():
        data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        # Row-major order of the cells below each value's length is the data's order.
        out[np.arange(width) < lengths[:, None]] = data
    return out.view(f"S{width}").reshape(n)


def user_ids(pa, col: Column, kind: str) -> np.ndarray:
    """A column of ids as a type whose ids are of `kind` stores them: int64 ("i") or
    UTF-8 bytes ("S"); a DatasetError naming the first empty or unusable one."""
    values = _plain(pa, col.values)
    if values.null_count:
        raise DatasetError(f"{col.at(_first(values.is_null().to_numpy(False)))}: no id "
                           f"(an empty value)")
    integers = pa.types.is_integer(values.type)
    if not (integers or _is_text(pa, values.type)):
        raise DatasetError(f"{col.at(0)}: ids are integers or strings; the column holds "
                           f"{values.type}")
    if kind == "i":
        if not integers:
            values = _parsed(pa, col, values, pa.int64(), "an integer id (the type's ids are "
                                                          "integers; id_type: string reads "
                                                          "them as strings)")
        return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ids = fixed_bytes(pa, values.cast(pa.string()) if integers else values)
    if (ids == b"").any():
        raise DatasetError(f"{col.at(_first(ids == b''))}: no id (an empty value)")
    return ids


def numbers(pa, col: Column, per_row: int = 1) -> np.ndarray:
    """A column of numbers as float32; a DatasetError naming the row of the first value
    missing, not a number, or not finite (`per_row` values a row, for list columns)."""
    values = _plain(pa, col.values)
    if values.null_count:
        bad = _first(values.is_null().to_numpy(False)) // per_row
        raise DatasetError(f"{col.at(bad)}: no value (features and edge data are numbers)")
    if _is_text(pa, values.type):
        values = _parsed(pa, col, values, pa.float32(), "a number")
    elif not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
              or pa.types.is_boolean(values.type)):
        raise DatasetError(f"{col.at(0)}: holds {values.type}, not numbers")
    out = values.to_numpy(zero_copy_only=False).astype(np.float32)
    if not np.isfinite(out).all():
        at = _first(~np.isfinite(out))
        raise DatasetError(f"{col.at(at // per_row)}: {out[at]} is not a finite number")
    return out


def list_rows(pa, col: Column) -> np.ndarray:
    """A list-typed column (k numbers a row, k the same in every row) as float32[n, k]."""
    values = col.values
    if values.null_count:
        raise DatasetError(f"{col.at(_first(values.is_null().to_numpy(False)))}: no value")
    lengths = pa.compute.list_value_length(values).to_numpy(zero_copy_only=False)
    width = int(lengths[0]) if lengths.size else 0
    if (lengths != width).any():
        at = _first(lengths != width)
        raise DatasetError(f"{col.at(at)}: holds {int(lengths[at])} values, row "
                           f"{col.start} holds {width}; feature rows are of one width")
    flat = numbers(pa, col._replace(values=values.flatten()), per_row=max(width, 1))
    return flat.reshape(len(values), width)


def labels(pa, col: Column, label: Label) -> np.ndarray:
    """A label column as int64 classes, -1 where null or empty; a DatasetError naming
    the first value that is no class."""
    values = _plain(pa, col.values)
    if pa.types.is_null(values.type):
        return np.full(len(values), -1, np.int64)
    missing = values.is_null().to_numpy(False)
    if _is_text(pa, values.type):
        missing |= pa.compute.equal(values, "").fill_null(False).to_numpy(False)
    if label.classes is not None:
        text = values.cast(pa.string())
        index = pa.compute.index_in(text, value_set=pa.array(label.classes, pa.string()))
        out = index.fill_null(-1).to_numpy(False).astype(np.int64)
        unknown = (out < 0) & ~missing
        if unknown.any():
            at = _first(unknown)
            raise DatasetError(f"{col.at(at)}: {text[at].as_py()!r} is not one of the classes "
                               f"{list(label.classes)}")
        return np.where(missing, -1, out)
    if _is_text(pa, values.type):
        blank = pa.compute.if_else(pa.array(missing), pa.scalar(None, values.type), values)
        values = _parsed(pa, col, blank, pa.int64(),
                         "an integer class (a column of class names needs classes: [...] "
                         "under label in the schema)")
    elif pa.types.is_floating(values.type):       # integers with nulls, as pandas writes them
        raw = values.to_numpy(zero_copy_only=False)
        missing |= np.isnan(raw)
        odd = ~missing & (raw != np.round(raw))
        if odd.any():
            raise DatasetError(f"{col.at(_first(odd))}: {raw[_first(odd)]} is not an integer "
                               f"class")
        values = pa.array(np.where(missing, -1, raw).astype(np.int64))
    elif not pa.types.is_integer(values.type):
        raise DatasetError(f"{col.at(0)}: holds {values.type}; labels are integer classes")
    out = np.where(missing, -1, values.fill_null(-1).to_numpy(False)).astype(np.int64)
    if (out < -1).any():
        raise DatasetError(f"{col.at(_first(out < -1))}: {int(out[_first(out < -1)])} is no "
                           f"class; labels are 0..C-1, or -1 (or empty) for unlabelled")
    return out


def split_codes(pa, col: Column) -> np.ndarray:
    """A split column as int8 indices of SPLITS, -1 where null or empty."""
    values = _plain(pa, col.values)
    if pa.types.is_null(values.type):
        return np.full(len(values), -1, np.int8)
    if not _is_text(pa, values.type):
        raise DatasetError(f"{col.at(0)}: holds {values.type}; a split column holds train, "
                           f"val or test")
    values = values.cast(pa.string())
    names = list(_SPLIT_VALUES)
    index = pa.compute.index_in(values, value_set=pa.array(names)).fill_null(-1)
    index = index.to_numpy(False)
    missing = values.is_null().to_numpy(False) | pa.compute.equal(values, "").fill_null(
        False).to_numpy(False)
    if ((index < 0) & ~missing).any():
        at = _first((index < 0) & ~missing)
        raise DatasetError(f"{col.at(at)}: {values[at].as_py()!r} is not train, val or test "
                           f"(or empty, for none)")
    codes = np.array(list(_SPLIT_VALUES.values()), np.int8)[index]
    return np.where(index < 0, -1, codes).astype(np.int8)
