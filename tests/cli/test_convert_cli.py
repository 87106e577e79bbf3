"""`jgraph convert`: a graph written as a chunked directory, its summary and JSON line, and
inputs refused with exit status 2 and one line naming what is wrong (in-process)."""
import gzip
import json
import resource

import numpy as np
import pytest

from jgraph.cli import main
from jgraph.data import load_chunked, load_dataset, open_chunked

from .test_bad_inputs import one_clear_line as clear_line
from .test_bad_inputs import run


def one_clear_line(err: str, *words: str) -> None:
    """The error is one `jgraph convert: error:` line holding every word, no traceback."""
    clear_line(err, *words)
    assert next(line for line in err.splitlines() if ": error: " in line).startswith(
        "jgraph convert: error: ")


def test_convert_writes_cora_in_chunks_and_prints_a_summary(tmp_path, capsys):
    out = tmp_path / "cora"
    code, printed, err = run(capsys, "convert", "cora", out, "--edges-per-chunk", 3000,
                             "--rows-per-chunk", 1000)
    assert code == 0, err
    assert "cora: 2,708 nodes, 10,556 edges in 4 edge chunks" in printed
    assert "peak memory" in printed and "jgraph convert cora" in err
    graph, back = load_dataset("cora"), load_chunked(out)
    assert back.num_nodes == graph.num_nodes
    np.testing.assert_array_equal(next(iter(back.edges.values())),
                                  next(iter(graph.edges.values())))
    np.testing.assert_array_equal(back.node_data["_N"]["feat"], graph.node_data["_N"]["feat"])


def high_water_bytes() -> int:
    """This process's peak resident memory so far (Linux's ru_maxrss, in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_convert_json_prints_one_line_of_results(tmp_path, capsys):
    before = high_water_bytes()
    code, printed, _ = run(capsys, "convert", "cora", tmp_path / "cora", "--json")
    after = high_water_bytes()
    assert code == 0
    row = json.loads(printed)
    assert set(row) == {"input", "out", "num_nodes", "num_edges", "edge_chunks", "seconds",
                        "peak_rss_bytes"}
    assert (row["input"], row["num_nodes"], row["num_edges"], row["edge_chunks"]) == (
        "cora", 2708, 10556, 1)
    # This process's high-water mark when the line was written: between the marks read
    # before and after the command (in bytes, not ru_maxrss's KiB).
    assert before <= row["peak_rss_bytes"] <= after


def test_convert_with_a_preparation_writes_into_a_folder_not_made_yet(tmp_path, capsys):
    """Prepared from a scratch folder beside OUT: OUT's parent is made for it, and
    only OUT is left there."""
    out = tmp_path / "new" / "deeper" / "cora"
    code, _, err = run(capsys, "convert", "cora", out, "--symmetrize", "--self-loops")
    assert code == 0, err
    assert open_chunked(out).num_edges == 10556 + 2708
    assert sorted(p.name for p in out.parent.iterdir()) == ["cora"]


def test_convert_streams_an_ogb_directory_reporting_its_progress(tmp_path, capsys):
    rng = np.random.default_rng(0)
    raw = tmp_path / "ogbn_tiny" / "raw"
    raw.mkdir(parents=True)
    label = rng.integers(0, 5, size=(40, 1)).astype(np.float64)
    label[::3] = np.nan
    np.savez_compressed(raw / "data.npz", edge_index=rng.integers(40, size=(2, 90)),
                        node_feat=rng.random((40, 3)).astype(np.float32),
                        num_nodes_list=np.array([40]), num_edges_list=np.array([90]))
    np.savez_compressed(raw / "node-label.npz", node_label=label)
    split = tmp_path / "ogbn_tiny" / "split" / "time"
    split.mkdir(parents=True)
    for name, ids in (("train", [5, 1, 9]), ("valid", [2]), ("test", [30, 31])):
        with gzip.open(split / f"{name}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    code, printed, err = run(capsys, "convert", tmp_path / "ogbn_tiny", tmp_path / "out",
                             "--edges-per-chunk", 20, "--json")
    assert code == 0, err
    assert "(streamed)" in err and "5 edge chunks, 90 edges" in err
    assert json.loads(printed)["edge_chunks"] == 5
    graph = open_chunked(tmp_path / "out")
    np.testing.assert_array_equal(graph.split("_N", "train"), [1, 5, 9])
    assert sorted(graph.splits["_N"]) == ["test", "train", "val"]


def test_a_misspelt_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    code, _, err = run(capsys, "convert", tmp_path / "cora.nzp", tmp_path / "out")
    assert code == 2
    one_clear_line(err, "cora.nzp")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_an_existing_out_exits_2_naming_overwrite_and_is_replaced_with_it(tmp_path, capsys):
    out = tmp_path / "cora"
    assert run(capsys, "convert", "cora", out)[0] == 0
    code, _, err = run(capsys, "convert", "cora", out, "--edges-per-chunk", 5000)
    assert code == 2
    one_clear_line(err, str(out), "--overwrite")
    assert open_chunked(out).num_edge_chunks == 1
    code, _, err = run(capsys, "convert", "cora", out, "--edges-per-chunk", 5000, "--overwrite")
    assert code == 0, err
    assert open_chunked(out).num_edge_chunks == 3


def test_a_non_positive_chunk_size_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["convert", "cora", str(tmp_path / "out"), "--edges-per-chunk", "0"])
    assert e.value.code == 2
    assert "--edges-per-chunk" in capsys.readouterr().err
