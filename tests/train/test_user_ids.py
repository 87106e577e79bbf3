"""The user's own ids to the very end: a heterogeneous graph written as Parquet and as
CSV tables with string and int64 ids, converted (`jgraph convert SCHEMA OUT`),
partitioned on both routes, trained, embedded and read back. Every id the user wrote
comes back once, with the row that a run on the same graph built in Python gives; a run
answers `load_run(...).predict` and `jgraph embed --nodes` in those ids."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from jgraph.cli.main import main
from jgraph.config import ConfigError
from jgraph.data import read_embeddings, save_chunked
from jgraph.data.ids import decoded
from jgraph.partition import open_partitions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingest"))
from tables_fixture import expected, write_tables

CONFIG = """\
name: library
data:
  path: {path}
  num_parts: 2
  method: {method}
  reverse_relations: true
  target_type: author
model:
  kind: rgcn
  hidden: 8
  num_layers: 2
  dropout: 0.0
  embedding_dim: 8
train:
  fanouts: [4, 4]
  eval_fanouts: [-1, -1]
  epochs: 2
  batch_size: 8
  seed: 0
"""


def train_and_embed(tmp_path: Path, name: str, path, method: str, capsys
                    ) -> tuple[dict, Path, Path]:
    """({type: (ids, logits)}, workdir, outputs) of a run on `path` (partitioned with
    `method`)."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(CONFIG.format(path=path, method=method))
    workdir, out = tmp_path / f"run-{name}", tmp_path / f"out-{name}"
    assert main(["train", str(config), "--workdir", str(workdir), "--devices", "2",
                 "--quiet"]) == 0
    assert main(["embed", str(workdir), "--out", str(out), "--what", "logits",
                 "--quiet"]) == 0
    capsys.readouterr()
    graph = expected()
    return {t: tuple(read_embeddings(out, t)) for t in graph.node_types}, workdir, out


@pytest.mark.slow       # three conversions, three training runs
def test_tables_reach_training_and_come_back_in_the_users_ids(tmp_path, capsys):
    graph = expected()
    # The same graph built in Python, trained in jgraph's own ids.
    save_chunked(graph.replace(ids={}), tmp_path / "library")
    python_rows, _, _ = train_and_embed(tmp_path, "python", tmp_path / "library",
                                        "metis", capsys)
    for fmt in ("parquet", "csv"):
        schema = write_tables(tmp_path / fmt, fmt)
        assert main(["convert", str(schema), str(tmp_path / f"{fmt}-chunked")]) == 0
    capsys.readouterr()

    # In memory (metis), from the Parquet tables: the Python run's rows, in user ids.
    rows, _, _ = train_and_embed(tmp_path, "parquet", tmp_path / "parquet-chunked",
                                 "metis", capsys)
    for t in graph.node_types:
        ids, logits = rows[t]
        want = decoded(graph.ids[t])
        assert ids.dtype.kind == want.dtype.kind and len(ids) == len(set(ids.tolist()))
        assert sorted(ids.tolist()) == sorted(want.tolist())          # each once
        position = {v: i for i, v in enumerate(want.tolist())}
        py_ids, py_logits = python_rows[t]
        by_id = dict(zip(py_ids.tolist(), np.asarray(py_logits)))
        got = np.stack([by_id[position[v]] for v in ids.tolist()])
        np.testing.assert_allclose(np.asarray(logits), got, rtol=1e-5, atol=1e-6)

    # The bounded route, from the CSV tables: every id once; answers in user ids.
    rows, workdir, _ = train_and_embed(tmp_path, "csv", tmp_path / "csv-chunked",
                                       "multilevel", capsys)
    import jgraph
    trained = jgraph.load_run(str(workdir))
    for t in graph.node_types:
        ids, logits = rows[t]
        assert sorted(ids.tolist()) == sorted(decoded(graph.ids[t]).tolist())
    ids, logits = rows["author"]          # string ids, some with commas, quotes, non-ASCII
    asked = ids[::5]
    np.testing.assert_array_equal(
        trained.predict(asked, "author", fanouts=[-1, -1]),
        np.asarray(logits)[::5].argmax(1))
    authors = rows["author"][0]
    node_list = tmp_path / "authors.txt"
    node_list.write_text("\n".join(authors[:3].tolist()) + "\n")
    assert main(["embed", str(workdir), "--out", str(tmp_path / "some"), "--node-type",
                 "author", "--nodes", str(node_list), "--quiet"]) == 0
    assert sorted(read_embeddings(tmp_path / "some", "author").ids.tolist()) == \
        sorted(authors[:3].tolist())
    with pytest.raises(ConfigError, match="'nobody'.*not a node"):
        trained.predict(["nobody"], "author")
    # The partition the bounded route wrote holds each node's row under its user id.
    parts = open_partitions(workdir / "partition")
    node_map, meta = parts.node_map(), parts.meta
    t = meta.node_types.index("paper")
    position = {v: i for i, v in enumerate(decoded(graph.ids["paper"]).tolist())}
    for k in range(meta.num_parts):
        new = np.arange(meta.ntype_offsets[k][t], meta.ntype_offsets[k][t + 1])
        orig = node_map[new] - meta.orig_type_offsets[t]
        users = decoded(np.asarray(parts.user_ids("paper")[orig])).tolist()
        want = graph.node_data["paper"]["feat"][[position[u] for u in users]]
        np.testing.assert_array_equal(parts.part(k).node_data["paper"]["feat"], want)
