"""`convert_tables`: the user's CSV and Parquet tables become the chunked graph that the
same tables built in Python give (ids kept), read in small batches and written in
small chunks; bad tables and schemas are refused naming the file, column and row (or
the key), and nothing is left at the output."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from jgraph.cli import main
from jgraph.config import ConfigError
from jgraph.data import DatasetError, Graph, load_chunked, open_chunked, save_chunked
from jgraph.ingest import convert_tables, load_schema, table_reader
from jgraph.ingest import tables as tables_module
from jgraph.ingest.tables import fraction_codes

from .tables_fixture import expected, schema, write_tables

pytest.importorskip("pyarrow")


def assert_same_graph(got: Graph, want: Graph) -> None:
    """Equal in every field, orders included (types, relations, edges within each)."""
    assert got.name == want.name
    assert list(got.num_nodes.items()) == list(want.num_nodes.items())
    assert list(got.edges) == list(want.edges)
    for rel, index in want.edges.items():
        np.testing.assert_array_equal(got.edges[rel], index, err_msg=str(rel))
        assert sorted(got.edge_data.get(rel, {})) == sorted(want.edge_data.get(rel, {}))
        for name, values in want.edge_data.get(rel, {}).items():
            assert got.edge_data[rel][name].dtype == values.dtype
            np.testing.assert_array_equal(got.edge_data[rel][name], values)
    assert sorted(got.node_data) == sorted(want.node_data)
    for t, named in want.node_data.items():
        assert sorted(got.node_data[t]) == sorted(named), t
        for name, values in named.items():
            assert got.node_data[t][name].dtype == values.dtype, (t, name)
            np.testing.assert_array_equal(got.node_data[t][name], values, err_msg=f"{t}.{name}")
    assert {t: sorted(s) for t, s in got.splits.items()} == {
        t: sorted(s) for t, s in want.splits.items()}
    for t, named in want.splits.items():
        for name, ids in named.items():
            np.testing.assert_array_equal(got.splits[t][name], ids, err_msg=f"{t}.{name}")
    assert sorted(got.ids) == sorted(want.ids)
    for t, ids in want.ids.items():
        assert got.ids[t].dtype.kind == ids.dtype.kind, t
        np.testing.assert_array_equal(got.ids[t], ids, err_msg=t)


@pytest.fixture
def small_batches(monkeypatch):
    """CSV parsed 200 bytes at a time (a few rows a block), as a large file would be."""
    monkeypatch.setattr(table_reader, "CSV_BLOCK_BYTES", 200)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tables_convert_to_the_graph_built_in_python_in_small_batches_and_chunks(
        fmt, tmp_path, small_batches):
    path = write_tables(tmp_path / "tables", fmt)
    convert_tables(path, tmp_path / "out", edges_per_chunk=7, rows_per_chunk=7)
    assert_same_graph(load_chunked(tmp_path / "out"), expected())
    graph = open_chunked(tmp_path / "out")
    # 60 edges a relation in chunks of 7: 9 chunks each; 31 papers in rows of 7: 5.
    assert graph.edges["src"].rows == (7,) * 8 + (4,) + (7,) * 8 + (4,) + (7,) * 8 + (4,)
    assert graph.node_data["paper"]["feat"].rows == (7, 7, 7, 7, 3)
    assert graph.node_ids("paper").dtype == np.int64
    assert graph.node_ids("author").dtype.kind == "S"
    # venue has no node table: its ids are those its edges name, sorted, as UTF-8 bytes.
    np.testing.assert_array_equal(graph.node_ids("venue"), expected().ids["venue"])


def test_chunk_sizes_change_the_chunks_not_the_graph(tmp_path):
    path = write_tables(tmp_path / "tables", "parquet")
    convert_tables(path, tmp_path / "out")
    assert open_chunked(tmp_path / "out").num_edge_chunks == 3       # one a relation
    assert_same_graph(load_chunked(tmp_path / "out"), expected())


def test_split_fractions_are_a_function_of_seed_and_position():
    positions = np.arange(100_000)
    codes = fraction_codes(positions, (0.6, 0.2, 0.1), seed=5)
    np.testing.assert_array_equal(codes[12_345:12_400],
                                  fraction_codes(positions[12_345:12_400], (0.6, 0.2, 0.1), 5))
    shares = np.bincount(codes + 1, minlength=4) / codes.size
    np.testing.assert_allclose(shares, [0.1, 0.6, 0.2, 0.1], atol=0.01)
    assert (fraction_codes(positions, (0.6, 0.2, 0.1), seed=6) != codes).mean() > 0.3


def test_string_ids_keep_their_leading_zeros_and_integer_ids_may_be_read_as_strings(tmp_path):
    (tmp_path / "nodes.csv").write_text("id,x\n007,1\n7,2\n")
    (tmp_path / "edges.csv").write_text("s,d\n007,7\n7,007\n")
    spec = {"nodes": [{"type": "n", "files": "nodes.csv", "id": "id", "id_type": "string"}],
            "edges": [{"relation": ["n", "e", "n"], "files": "edges.csv", "source": "s",
                       "destination": "d"}]}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    convert_tables(tmp_path / "s.json", tmp_path / "out")
    graph = load_chunked(tmp_path / "out")
    assert list(graph.ids["n"]) == [b"007", b"7"]
    np.testing.assert_array_equal(graph.edges[("n", "e", "n")], [[0, 1], [1, 0]])


def test_a_type_without_node_files_takes_its_edges_distinct_ids_sorted(tmp_path, monkeypatch):
    monkeypatch.setattr(tables_module, "READ_ROWS", 3)      # batches merged as they come
    (tmp_path / "likes.tsv").write_text("who\twhat\n"
                                        + "".join(f"u{i % 4}\t{(i * 37) % 11 * 1000}\n"
                                                  for i in range(20)))
    # Text ids are strings unless the schema says otherwise (no node files: a type entry).
    spec = {"nodes": [{"type": "item", "id_type": "int"}],
            "edges": [{"relation": ["user", "likes", "item"], "files": "likes.tsv",
                       "source": "who", "destination": "what"}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    convert_tables(tmp_path / "s.yaml", tmp_path / "out", edges_per_chunk=4)
    graph = load_chunked(tmp_path / "out")
    assert graph.name == "s" and graph.num_nodes == {"user": 4, "item": 11}
    np.testing.assert_array_equal(graph.ids["item"], np.arange(11) * 1000)
    assert list(graph.ids["user"]) == [b"u0", b"u1", b"u2", b"u3"]
    edges = graph.edges[("user", "likes", "item")]
    np.testing.assert_array_equal(edges[0], np.arange(20) % 4)
    np.testing.assert_array_equal(edges[1], (np.arange(20) * 37) % 11)


# -- refused, naming the file, the column and the row ---------------------------------------


def _refused(tmp_path, path, *words, error=DatasetError):
    with pytest.raises(error) as caught:
        convert_tables(path, tmp_path / "out", edges_per_chunk=7, rows_per_chunk=7)
    for word in words:
        assert str(word) in str(caught.value), (word, str(caught.value))
    # Nothing at the output, and no staging directory beside it.
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]
    return str(caught.value)


def _edit_csv(path: Path, edit) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")


def _rewrite_schema(path: Path, change) -> None:
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(spec)
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")


def test_a_missing_column_is_named_with_its_file(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, lambda s: s["edges"][1].update(destination="target"))
    _refused(tmp_path, path, "cites-0.csv", "no column 'target'", "['from', 'to', 'w']")


def test_an_edge_to_an_id_no_node_file_lists_is_named_by_file_column_and_row(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _edit_csv(tmp_path / "t" / "writes-1.csv", lambda lines: lines[:4] + ["a013,999,1.0"]
              + lines[4:])
    _refused(tmp_path, path, "writes-1.csv", "column 'to' row 3", "id 999",
             "not a node of type 'paper'")


def test_a_node_id_listed_twice_is_named_in_both_places(tmp_path):
    path = write_tables(tmp_path / "t", "parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq
    repeated = pq.read_table(tmp_path / "t" / "papers-0.parquet").column("paper_id")[2].as_py()
    table = pq.read_table(tmp_path / "t" / "papers-2.parquet")
    ids = table.column("paper_id").to_pylist()
    ids[5] = repeated
    pq.write_table(table.set_column(0, "paper_id", pa.array(ids, pa.int64())),
                   tmp_path / "t" / "papers-2.parquet")
    _refused(tmp_path, path, "papers-2.parquet: column 'paper_id' row 5", f"id {repeated}",
             "papers-0.parquet: column 'paper_id' row 2")


def test_a_string_label_without_classes_is_refused_naming_its_value(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, lambda s: s["nodes"][1].update(label="field"))
    _refused(tmp_path, path, "papers-0.csv", "column 'field' row 0", "is not an integer class",
             "classes")


def test_a_label_outside_the_classes_is_refused(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, lambda s: s["nodes"][1]["label"].update(classes=["ml", "db"]))
    message = _refused(tmp_path, path, "column 'field'", "'theory' is not one of the classes")
    assert "papers-" in message


def test_a_truncated_parquet_file_is_named(tmp_path):
    path = write_tables(tmp_path / "t", "parquet")
    victim = tmp_path / "t" / "cites-1.parquet"
    victim.write_bytes(victim.read_bytes()[:-100])
    _refused(tmp_path, path, "cites-1.parquet", "cannot be read")


def test_a_bad_split_value_and_a_bad_number_are_named(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    papers = tmp_path / "t" / "papers-1.csv"
    original = papers.read_text(encoding="utf-8")
    _edit_csv(papers, lambda lines: lines[:3] + [lines[3].rsplit(",", 1)[0] + ",holdout"]
              + lines[4:])
    _refused(tmp_path, path, "papers-1.csv", "column 'split' row 2", "'holdout'")
    papers.write_text(original, encoding="utf-8")

    def bad_f0(lines):
        cells = lines[2].split(",")         # row 1: its id, then f0
        cells[1] = "x"
        return lines[:2] + [",".join(cells)] + lines[3:]
    _edit_csv(papers, bad_f0)
    _refused(tmp_path, path, "papers-1.csv", "column 'f0' row 1", "'x' is not a number")


@pytest.mark.parametrize("change, key", [
    (lambda s: s["nodes"][0].update(labels="level"), "nodes[0].labels"),
    (lambda s: s["edges"][2].update(relation=["paper", "venue"]), "edges[2]"),
    (lambda s: s["nodes"][1].update(split={"fractions": [0.8, 0.3, 0.1]}), "fractions"),
    (lambda s: s["edges"][0].pop("data"), "same edge data"),
])
def test_a_bad_schema_is_refused_naming_the_key(change, key, tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, change)
    message = _refused(tmp_path, path, "schema.yaml", key, error=ConfigError)
    assert "Traceback" not in message


def test_a_glob_that_matches_nothing_is_named(tmp_path):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, lambda s: s["nodes"][0].update(files="writers-*.csv"))
    _refused(tmp_path, path, "writers-*.csv", "no such file")


def test_an_existing_output_is_kept_unless_overwrite(tmp_path):
    path = write_tables(tmp_path / "t", "parquet")
    convert_tables(path, tmp_path / "out")
    with pytest.raises(DatasetError, match="overwrite"):
        convert_tables(path, tmp_path / "out")
    convert_tables(path, tmp_path / "out", overwrite=True)
    assert_same_graph(load_chunked(tmp_path / "out"), expected())


def test_without_pyarrow_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(DatasetError, match=r'pip install "jgraph\[tables\]"'):
        table_reader.import_pyarrow()


def test_importing_the_ways_in_imports_neither_pyarrow_nor_jax(tmp_path):
    code = ("import sys, jgraph.data, jgraph.ingest, jgraph.cli.convert; "
            "print(sorted(m for m in ('pyarrow', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_schema_reads_yaml_and_json_alike(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(schema("csv")))
    (tmp_path / "a.json").write_text(json.dumps(schema("csv")))
    a, b = load_schema(tmp_path / "a.yaml"), load_schema(tmp_path / "a.json")
    assert a == b and a.node_types() == ["author", "paper", "venue"]
    assert a.nodes[1].files == (str(tmp_path / "papers-*.csv"),)


# -- the chunked directory's ids ------------------------------------------------------------


def test_the_chunked_format_keeps_ids_and_checks_their_file(tmp_path):
    graph = expected()
    save_chunked(graph, tmp_path / "g", edges_per_chunk=50)
    assert_same_graph(load_chunked(tmp_path / "g"), graph)
    meta = json.loads((tmp_path / "g" / "metadata.json").read_text())
    assert meta["ids"]["paper"] == {"file": "ids/paper.npy", "dtype": "int64"}
    assert meta["ids"]["author"]["dtype"].startswith("S")
    np.save(tmp_path / "g" / "ids" / "paper.npy", np.arange(5))
    with pytest.raises(DatasetError, match=r"ids/paper.npy: ids.paper hold int64\[5\]"):
        open_chunked(tmp_path / "g")


# -- the command ----------------------------------------------------------------------------


def test_jgraph_convert_takes_a_schema_file(tmp_path, capsys):
    path = write_tables(tmp_path / "t", "csv")
    code = main(["convert", str(path), str(tmp_path / "out"), "--edges-per-chunk", "20",
                 "--json"])
    printed, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(printed)
    assert (row["num_nodes"], row["num_edges"], row["edge_chunks"]) == (60, 180, 9)
    assert "from tables" in err
    assert_same_graph(load_chunked(tmp_path / "out"), expected())


def test_jgraph_convert_refuses_bad_tables_in_one_line(tmp_path, capsys):
    path = write_tables(tmp_path / "t", "csv")
    _rewrite_schema(path, lambda s: s["nodes"][0].update(id="author"))
    code = main(["convert", str(path), str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 2
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("jgraph convert: error: ") and "no column 'author'" in lines[0]
    assert not (tmp_path / "out").exists()


def test_csv_ids_are_kept_as_written_without_an_id_type(tmp_path):
    """Inferring integers would turn the user's "0042" into 42 without a word."""
    (tmp_path / "n.csv").write_text("id\n0042\n0043\n")
    (tmp_path / "e.csv").write_text("s,d\n0042,0043\n")
    spec = {"nodes": [{"type": "n", "files": "n.csv", "id": "id"}],
            "edges": [{"relation": ["n", "e", "n"], "files": "e.csv", "source": "s",
                       "destination": "d"}]}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    convert_tables(tmp_path / "s.json", tmp_path / "out")
    assert list(load_chunked(tmp_path / "out").ids["n"]) == [b"0042", b"0043"]
