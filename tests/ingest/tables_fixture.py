"""A small heterogeneous graph as a user brings it: tables in CSV or Parquet, several
files a type, described by a schema; and the same graph built in Python (`expected`).

author (string ids, some with commas, quotes or non-ASCII; integer labels, a few
missing; split drawn by fractions), paper (int64 ids far from 0..n-1, in no order;
four feature columns, or one list column in Parquet, a `year`; string labels with a
`classes` list, a few missing; a split column), venue (no node table: its nodes are
the distinct ids of the edge files, sorted). Relations: author writes paper, paper
cites paper, paper appears_in venue; every edge has a `weight`.
"""
from __future__ import annotations

import csv
import gzip
import itertools
import json
from pathlib import Path

import numpy as np

from jgraph.data import Graph
from jgraph.data.links import mix64

CLASSES = ("ml", "db", "theory")
FRACTIONS, SEED = (0.5, 0.25, 0.125), 3
# Rows of each file: authors in 2 files, papers in 3, each relation's edges in 3.
AUTHOR_FILES, PAPER_FILES, EDGE_FILES = (9, 14), (10, 12, 9), (20, 25, 15)


def _data() -> dict:
    """The tables' columns, as the user holds them (ids, strings, None for missing)."""
    rng = np.random.default_rng(7)
    authors = [f"a{k:03d}" for k in rng.permutation(sum(AUTHOR_FILES) - 4)]
    authors += ["Zoë, J.", "0042", 'say "hi"', "李"]
    authors = [authors[k] for k in rng.permutation(len(authors))]
    n_papers = sum(PAPER_FILES)
    papers = [int(x) for x in rng.choice(10**12, n_papers, replace=False)]
    venues = ["KDD", "WWW", "ICML", "NeurIPS", "VLDB", "Ågora"]
    level = [None if k % 5 == 2 else int(rng.integers(0, 4)) for k in range(len(authors))]
    field = [None if k % 7 == 3 else CLASSES[int(rng.integers(0, 3))] for k in range(n_papers)]
    split = [("train", "val", "test", None)[int(rng.integers(0, 4))] for _ in range(n_papers)]
    feat = rng.integers(-40, 40, size=(n_papers, 4)) / 8          # exact in CSV and float32
    year = rng.integers(1990, 2024, size=n_papers)

    def edges(sources, targets, count):
        return ([sources[k] for k in rng.integers(0, len(sources), count)],
                [targets[k] for k in rng.integers(0, len(targets), count)],
                list(rng.integers(1, 16, count) / 4))
    e = sum(EDGE_FILES)
    return {"authors": authors, "level": level, "papers": papers, "field": field,
            "split": split, "feat": feat, "year": year,
            "writes": edges(authors, papers, e), "cites": edges(papers, papers, e),
            "appears_in": edges(papers, venues, e)}


def expected() -> Graph:
    """The graph the tables hold, numbered as jgraph numbers it: node files' order,
    and venue's distinct ids sorted (by UTF-8 bytes)."""
    d = _data()
    venues = sorted(set(d["appears_in"][1]), key=lambda v: v.encode())
    index = {"author": {a: i for i, a in enumerate(d["authors"])},
             "paper": {p: i for i, p in enumerate(d["papers"])},
             "venue": {v: i for i, v in enumerate(venues)}}
    relations = {("author", "writes", "paper"): d["writes"],
                 ("paper", "cites", "paper"): d["cites"],
                 ("paper", "appears_in", "venue"): d["appears_in"]}
    edges = {r: np.array([[index[r[0]][s] for s in src], [index[r[2]][t] for t in dst]])
             for r, (src, dst, _) in relations.items()}
    author_label = np.array([-1 if v is None else v for v in d["level"]])
    paper_label = np.array([-1 if v is None else CLASSES.index(v) for v in d["field"]])
    # Fractions: node i's u = the top 53 bits of mix64(seed, i), labelled nodes only.
    u = (mix64(SEED, np.arange(len(d["authors"]))) >> np.uint64(11)) * 2.0 ** -53
    drawn = np.searchsorted(np.cumsum(FRACTIONS), u, side="right")
    drawn[author_label < 0] = 3
    paper_split = np.array([("train", "val", "test", None).index(s) for s in d["split"]])
    splits = {t: {name: np.flatnonzero(codes == i)
                  for i, name in enumerate(("train", "val", "test"))}
              for t, codes in (("author", drawn), ("paper", paper_split))}
    return Graph(
        name="library", num_nodes={"author": len(d["authors"]), "paper": len(d["papers"]),
                                   "venue": len(venues)},
        edges=edges,
        node_data={"author": {"label": author_label},
                   "paper": {"feat": d["feat"].astype(np.float32),
                             "year": d["year"].astype(np.float32), "label": paper_label}},
        edge_data={r: {"weight": np.array(w, np.float32)} for r, (_, _, w) in relations.items()},
        splits=splits,
        ids={"author": np.array(d["authors"]), "paper": np.array(d["papers"], np.int64),
             "venue": np.array(venues)})


def _pieces(rows: list, sizes) -> list[list]:
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [rows[a:b] for a, b in itertools.pairwise(starts)]


def _tables() -> dict[str, tuple[list[str], list[list]]]:
    """{file stem: (header, rows per file)} of every table."""
    d = _data()
    author_rows = [[a, v] for a, v in zip(d["authors"], d["level"])]
    paper_rows = [[p, *f, y, c, s] for p, f, y, c, s in
                  zip(d["papers"], d["feat"].tolist(), d["year"].tolist(), d["field"],
                      d["split"])]
    out = {"authors": (["name", "level"], _pieces(author_rows, AUTHOR_FILES)),
           "papers": (["paper_id", "f0", "f1", "f2", "f3", "year", "field", "split"],
                      _pieces(paper_rows, PAPER_FILES))}
    for rel in ("writes", "cites", "appears_in"):
        rows = [list(r) for r in zip(*d[rel])]
        out[rel] = (["from", "to", "w"], _pieces(rows, EDGE_FILES))
    return out


def schema(fmt: str) -> dict:
    """The schema of the tables `write_tables(root, fmt)` writes."""
    ext = "csv" if fmt == "csv" else "parquet"
    features = ({"feat": ["f0", "f1", "f2", "f3"], "year": "year"} if fmt == "csv"
                else {"feat": "feat", "year": "year"})

    def relation(name, src, dst):
        return {"relation": [src, name, dst], "files": f"{name}-*", "source": "from",
                "destination": "to", "data": {"weight": "w"}}
    return {"name": "library",
            "nodes": [{"type": "author", "files": [f"authors-*.{ext}"], "id": "name",
                       "label": "level",
                       "split": {"fractions": list(FRACTIONS), "seed": SEED}},
                      # A CSV's ids are strings unless the schema says otherwise.
                      {"type": "paper", "files": f"papers-*.{ext}", "id": "paper_id",
                       **({"id_type": "int"} if fmt == "csv" else {}),
                       "features": features,
                       "label": {"column": "field", "classes": list(CLASSES)},
                       "split": "split"}],
            "edges": [relation("writes", "author", "paper"), relation("cites", "paper", "paper"),
                      relation("appears_in", "paper", "venue")]}


def write_tables(root: Path, fmt: str) -> Path:
    """Write the tables under `root` as CSV (a schema.yaml; one file gzipped) or
    Parquet (a schema.json; row groups of 4 rows, paper features as one list column);
    returns the schema file's path."""
    root.mkdir(parents=True, exist_ok=True)
    for stem, (header, files) in _tables().items():
        for k, rows in enumerate(files):
            if fmt == "csv":
                _write_csv(root / f"{stem}-{k}.csv{'.gz' if stem == 'cites' and k else ''}",
                           header, rows)
            else:
                _write_parquet(root / f"{stem}-{k}.parquet", header, rows)
    if fmt == "csv":
        import yaml
        path = root / "schema.yaml"
        path.write_text(yaml.safe_dump(schema(fmt), sort_keys=False, allow_unicode=True))
    else:
        path = root / "schema.json"
        path.write_text(json.dumps(schema(fmt), indent=1))
    return path


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(header)
        out.writerows([["" if v is None else v for v in row] for row in rows])


def _write_parquet(path: Path, header: list[str], rows: list[list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    if "f0" in columns:          # paper features as one list column of float32
        columns = {"paper_id": columns["paper_id"],
                   "feat": pa.array([[columns[f"f{j}"][i] for j in range(4)]
                                     for i in range(len(rows))], pa.list_(pa.float32())),
                   **{k: columns[k] for k in ("year", "field", "split")}}
    if "level" in columns:
        columns["level"] = pa.array(columns["level"], pa.int64())
    pq.write_table(pa.table(columns), path, row_group_size=4)
