"""The schema file that describes a graph given as the user's own tables (CSV or
Parquet files): its frozen dataclasses, and `load_schema`, which reads and checks one.

Users bring a graph as tables, as GraphStorm's `gconstruct` takes them: node tables
(a row a node: its id, features, label, split) and edge tables (a row an edge: the ids
of its two ends, optional numbers). A schema file, YAML or JSON, names them:

    name: acm
    nodes:
      - type: paper
        files: papers/*.parquet         # globs relative to the schema file, each sorted
        id: paper_id                    # integers or strings (id_type: int | string)
        features: [f0, f1, f2]          # node data feat float32[n, 3]; or one list column
                                        #   (features: emb), or {feat: emb, year: year}
        label: {column: field, classes: [ml, db, theory]}   # or an integer column
        split: split                    # a column of train / val / test / empty, or
                                        #   {fractions: [0.8, 0.1, 0.1], seed: 0}
      - type: author
        files: [authors-0.csv, authors-1.csv]
        id: name
    edges:
      - relation: [author, writes, paper]
        files: writes/*.csv
        source: author
        destination: paper
        data: {weight: w}               # optional per-edge numbers, named alike in
                                        #   every relation
      - relation: [paper, appears_in, venue]   # venue has no node table: its nodes are
        files: venues.parquet                  #   the distinct ids these columns give
        source: paper
        destination: venue

Features and edge data are stored as float32. A label column holds integers 0..C-1, or
strings that `classes` lists (class i is classes[i]); null or empty is -1, unlabelled.
Split fractions put node i of a type in train if u < f_train, in val if u < f_train +
f_val, in test if u < their sum, where u in [0, 1) is a hash of (seed, i), so a split
does not depend on the batches; only labelled nodes, where the type has a label. Where
the schema gives no `id_type`, a type's ids are integers if its first file is Parquet
with an integer id column, else strings (a CSV file's ids are kept as written: "0042"
stays "0042"; give `id_type: int` to read them as integers).

Errors in the schema are `ConfigError`s naming the key. `jgraph.ingest.tables` converts
the tables a schema names.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Mapping
from typing import NamedTuple

import yaml

from jgraph.config import ConfigError, build
from jgraph.data.graph import Relation, check_name
from jgraph.data.npz import DatasetError


class IdType(enum.Enum):
    INT = "int"
    STRING = "string"


@dataclasses.dataclass(frozen=True)
class Label:
    """A node type's classes: `column` holds integers 0..C-1, or strings that `classes`
    lists (class i is classes[i]). Null or empty: -1, unlabelled."""

    column: str
    classes: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes {list(self.classes)} name a class more than once")


@dataclasses.dataclass(frozen=True)
class Split:
    """A node type's train / val / test sets: `column` holds train, val or test (or
    nothing), or `fractions` [train, val, test] draws each node's from `seed`."""

    column: str | None = None
    fractions: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        if (self.column is None) == (self.fractions is None):
            raise ValueError("give a column or fractions, one of the two")
        if self.fractions is not None and (len(self.fractions) != 3 or min(self.fractions) < 0
                                           or sum(self.fractions) > 1 + 1e-9):
            raise ValueError(f"fractions {list(self.fractions)}: give three shares "
                             f"[train, val, test], each >= 0, adding up to at most 1")


class Feature(NamedTuple):
    """One node array from a node table: `columns` side by side as float32[n, len]
    where `matrix`, else one column as it is (a list column [n, k], numbers [n])."""

    name: str
    columns: tuple[str, ...]
    matrix: bool


@dataclasses.dataclass(frozen=True)
class NodeTable:
    """One node type. files: globs of its CSV / Parquet files, read in the order given,
    each glob's matches sorted (none: the type's nodes come from the edge tables). id:
    the ids' column; id_type: int or string where the files should not decide.
    features: [columns] or one list column (stored as `feat`, float32[n, k]), or
    {name: column or [columns]} (a number column: [n], but `feat` [n, 1]). label,
    split: see `Label`, `Split`; a string names the column."""

    type: str
    files: str | tuple[str, ...] = ()
    id: str | None = None
    id_type: IdType | None = None
    features: str | tuple[str, ...] | dict[str, str | tuple[str, ...]] | None = None
    label: Label | str | None = None
    split: Split | str | None = None

    def __post_init__(self):
        check_name("node type", self.type)
        object.__setattr__(self, "files", _patterns(self.files))
        if isinstance(self.label, str):
            object.__setattr__(self, "label", Label(self.label))
        if isinstance(self.split, str):
            object.__setattr__(self, "split", Split(column=self.split))
        if self.files and self.id is None:
            raise ValueError("id: name the column that holds the nodes' ids")
        needs_table = self.features is not None or self.label is not None or (
            self.split is not None and self.split.column is not None)
        if needs_table and not self.files:
            raise ValueError("features, label and split columns need the type's files")
        names = [f.name for f in self.arrays()]
        if self.label is not None and "label" in names:
            raise ValueError("features: 'label' is the name of the label's array")

    def arrays(self) -> tuple[Feature, ...]:
        """The node arrays `features` names, checked."""
        features = self.features
        if features is None:
            return ()
        if isinstance(features, str):
            return (Feature("feat", (features,), False),)
        if isinstance(features, tuple):
            if not features:
                raise ValueError("features: an empty list of columns")
            return (Feature("feat", features, True),)
        if not isinstance(features, Mapping) or not features:
            raise ValueError(f"features: expected columns, or {{name: columns}}, got "
                             f"{features!r}")
        out = []
        for name, columns in features.items():
            check_name("node data", name)
            if isinstance(columns, str):
                out.append(Feature(name, (columns,), False))
            elif (isinstance(columns, (list, tuple)) and columns
                  and all(isinstance(c, str) for c in columns)):
                out.append(Feature(name, tuple(columns), True))
            else:
                raise ValueError(f"features.{name}: expected a column or a list of columns, "
                                 f"got {columns!r}")
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class EdgeTable:
    """One relation. relation: [source type, name, destination type]; files: as a node
    table's; source, destination: the columns of the ends' ids; data: per-edge number
    columns (stored under their names), or {name: column}."""

    relation: tuple[str, ...]
    files: str | tuple[str, ...]
    source: str
    destination: str
    data: str | tuple[str, ...] | dict[str, str] | None = None

    def __post_init__(self):
        if len(self.relation) != 3:
            raise ValueError(f"relation: expected [source type, name, destination type], got "
                             f"{list(self.relation)}")
        for t in (self.relation[0], self.relation[2]):
            check_name("node type", t)
        object.__setattr__(self, "files", _patterns(self.files))
        if not self.files:
            raise ValueError("files: a relation needs its edge files")
        self.columns()

    @property
    def rel(self) -> Relation:
        return Relation(*self.relation)

    def columns(self) -> tuple[tuple[str, str], ...]:
        """(name, column) of each edge data array, checked."""
        data = self.data
        if data is None:
            return ()
        if isinstance(data, str):
            data = (data,)
        if isinstance(data, tuple):
            data = {c: c for c in data}
        if not isinstance(data, Mapping) or not all(isinstance(c, str) for c in data.values()):
            raise ValueError(f"data: expected columns, or {{name: column}}, got {self.data!r}")
        for name in data:
            check_name("edge data", name)
        return tuple(data.items())


@dataclasses.dataclass(frozen=True)
class Schema:
    """A graph's tables. name: the graph's (default: the schema file's name); nodes:
    the node types that have tables (or an `id_type`); edges: the relations, in the
    order the chunked directory stores them. Node types are numbered in `nodes` order,
    then in the order relations name the others."""

    edges: tuple[EdgeTable, ...]
    nodes: tuple[NodeTable, ...] = ()
    name: str | None = None

    def __post_init__(self):
        if not self.edges:
            raise ConfigError("edges: a graph needs at least one relation")
        declared = [t.type for t in self.nodes]
        for kind, names in (("node type", declared),
                            ("relation name", [e.relation[1] for e in self.edges])):
            twice = sorted({x for x in names if names.count(x) > 1})
            if twice:
                raise ConfigError(f"{kind}s are unique; {twice} appear more than once")
        used = {t for e in self.edges for t in (e.relation[0], e.relation[2])}
        for i, table in enumerate(self.nodes):
            if not table.files and table.type not in used:
                raise ConfigError(f"nodes[{i}]: type {table.type!r} has no files and no "
                                  f"relation names it: it would have no nodes")
        data = {e.relation[1]: sorted(name for name, _ in e.columns()) for e in self.edges}
        if len({tuple(names) for names in data.values()}) > 1:
            raise ConfigError(f"edges: every relation names the same edge data (the chunked "
                              f"format keeps one set of edge arrays for all edges), got {data}")

    def node_types(self) -> list[str]:
        types = [t.type for t in self.nodes]
        for e in self.edges:
            types += [t for t in (e.relation[0], e.relation[2]) if t not in types]
        return types

    def table(self, ntype: str) -> NodeTable | None:
        return next((t for t in self.nodes if t.type == ntype), None)

    def relative_to(self, base: str) -> Schema:
        """The schema with its file patterns joined to `base` (absolute ones kept)."""
        join = lambda files: tuple(os.path.join(base, os.path.expanduser(f)) for f in files)
        return dataclasses.replace(
            self, nodes=tuple(dataclasses.replace(t, files=join(t.files)) for t in self.nodes),
            edges=tuple(dataclasses.replace(e, files=join(e.files)) for e in self.edges))


def _patterns(files) -> tuple[str, ...]:
    files = (files,) if isinstance(files, str) else tuple(files)
    if not all(isinstance(f, str) and f for f in files):
        raise ValueError(f"files: expected file names or globs, got {list(files)}")
    return files


def is_schema_file(path: str | os.PathLike) -> bool:
    """Whether `path` is a file that `load_schema` reads (.yaml, .yml or .json)."""
    path = os.fspath(path)
    return os.path.isfile(path) and path.lower().endswith((".yaml", ".yml", ".json"))


def load_schema(path: str | os.PathLike) -> Schema:
    """The schema of a YAML or JSON file, checked; unknown keys and wrong values are
    ConfigErrors naming the file and the key. File patterns become relative to the
    schema file's directory."""
    path = os.fspath(path)
    as_json = path.lower().endswith(".json")
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f) if as_json else yaml.safe_load(f)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the schema ({e.strerror})") from None
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not valid {'JSON' if as_json else 'YAML'}: {e}") from None
    if not isinstance(values, Mapping):
        raise ConfigError(f"{path}: the schema is a mapping of ['name', 'nodes', 'edges']")
    try:
        schema = build(Schema, values)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if schema.name is None:
        stem = os.path.basename(path).rsplit(".", 1)[0]
        schema = dataclasses.replace(schema, name=stem)
    return schema.relative_to(os.path.dirname(os.path.abspath(path)))
