"""The command line as a user meets it: the JSON contract, summaries, and clear errors."""
import json

import numpy as np
import pytest

from jgraph.cli import main
from jgraph.partition import open_partitions

CONTRACT = ["num_parts", "method", "num_nodes", "num_edges", "edge_cut_fraction", "balance",
            "seconds"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_partition_json_line_has_the_contract_fields(tmp_path, capsys):
    code, out, _ = run(capsys, "partition", "cora", "--num-parts", "3", "--method", "random",
                       "--out", str(tmp_path / "p"), "--json")
    assert code == 0
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert all(k in row for k in CONTRACT)
    meta = open_partitions(tmp_path / "p").meta
    assert row["num_parts"] == 3 and row["method"] == "random"
    assert row["num_nodes"] == 2708 and row["num_edges"] == 10556
    assert row["edge_cut_fraction"] == meta.edge_cut_fraction
    assert set(row["balance"]) == {"nodes", "train", "val", "test", "edges"}
    assert sum(row["part_nodes"]) == 2708


def test_partition_summary_and_info_agree(tmp_path, capsys):
    code, out, err = run(capsys, "partition", "cora", "--num-parts", "2", "--out",
                         str(tmp_path / "p"))
    assert code == 0 and "edge cut" in out and "balance" in out
    assert "assigning nodes (metis)" in err          # progress goes to stderr
    code, info, _ = run(capsys, "info", str(tmp_path / "p"), "--check")
    assert code == 0 and "all partition files checked" in info
    assert out.splitlines()[2:6] == info.splitlines()[2:6]   # the same per-part table


def test_transform_flags_apply_before_partitioning(tmp_path, capsys, shared_data):
    code, out, _ = run(capsys, "partition", str(shared_data("facebook_musae.npz")),
                       "--num-parts", "2", "--symmetrize", "--out", str(tmp_path / "p"),
                       "--json")
    assert code == 0
    src = np.load(shared_data("facebook_musae.npz"))["src"]
    dst = np.load(shared_data("facebook_musae.npz"))["dst"]
    undirected = {(min(a, b), max(a, b)) for a, b in zip(src.tolist(), dst.tolist())}
    loops = sum(a == b for a, b in undirected)
    assert json.loads(out)["num_edges"] == 2 * len(undirected) - loops


def test_synthetic_spec_partitions(tmp_path, capsys):
    code, out, _ = run(capsys, "partition", "synthetic:nodes=3000,edges=20000,feat=8",
                       "--num-parts", "4", "--out", str(tmp_path / "p"), "--json")
    assert code == 0
    assert json.loads(out)["num_edges"] == 20000


@pytest.mark.parametrize("argv,message", [
    (["partition", "cora", "--num-parts", "0"], "num_parts must be a positive integer, got 0"),
    (["partition", "cora", "--num-parts", "9999"], "num_parts=9999 is more than the graph's 2708"),
    (["partition", "no_such_file.npz", "--num-parts", "2"], "no_such_file.npz: no such file"),
    (["partition", "coraa", "--num-parts", "2"], "dataset 'coraa' not found"),
    (["partition", "synthetic:nodes=10,edgez=5", "--num-parts", "2"], "valid keys"),
])
def test_bad_partition_input_exits_2_with_a_clear_message(tmp_path, capsys, argv, message):
    code, _, err = run(capsys, *argv, "--out", str(tmp_path / "p"))
    assert code == 2
    assert message in err and "Traceback" not in err


def test_an_assignment_made_elsewhere_is_partitioned_as_given(tmp_path, capsys):
    """--assignment (e.g. ParMETIS's output): a METIS partition's own assignment, given
    back, writes the same partition; a bad file is refused by name."""
    code, out, _ = run(capsys, "partition", "cora", "--num-parts", "4", "--out",
                       str(tmp_path / "metis"), "--json")
    assert code == 0
    first = open_partitions(tmp_path / "metis")
    owner = np.searchsorted(np.asarray(first.meta.offsets), np.arange(2708), side="right") - 1
    given = np.empty(2708, np.int64)
    given[np.load(tmp_path / "metis" / "node_map.npy")] = owner   # original id -> part
    np.save(tmp_path / "given.npy", given)
    code, again, _ = run(capsys, "partition", "cora", "--num-parts", "4", "--assignment",
                         str(tmp_path / "given.npy"), "--out", str(tmp_path / "given"), "--json")
    assert code == 0 and json.loads(again)["method"] == "given"
    assert json.loads(again)["edge_cut_fraction"] == json.loads(out)["edge_cut_fraction"]
    for name in ("node_map.npy", "part-2/indices.npy"):
        assert np.array_equal(np.load(tmp_path / "metis" / name),
                              np.load(tmp_path / "given" / name))

    np.save(tmp_path / "short.npy", given[:-1])
    bad = given.copy()
    bad[5] = 4
    np.save(tmp_path / "bad.npy", bad)
    np.save(tmp_path / "three.npy", given % 3)
    for argv, message in [
        (["--assignment", str(tmp_path / "short.npy")], "short.npy: expected one partition "
                                                        "per node, 2708 values"),
        (["--assignment", str(tmp_path / "bad.npy")], "bad.npy: node 5 is assigned partition "
                                                      "4, outside [0, 4)"),
        (["--assignment", str(tmp_path / "three.npy")], "partition 3 of 4 is given no node"),
        (["--assignment", str(tmp_path / "none.npy")], "none.npy: no such file"),
        (["--assignment", str(tmp_path / "given.npy"), "--method", "metis"],
         "--method given and --assignment FILE go together"),
        (["--method", "given"], "--method given and --assignment FILE go together"),
    ]:
        code, _, err = run(capsys, "partition", "cora", "--num-parts", "4", *argv, "--out",
                           str(tmp_path / "p"))
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)


def test_out_of_range_edge_in_npz_names_the_file_and_id(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    np.savez(bad, src=np.array([0, 1, 7]), dst=np.array([1, 2, 0]), num_nodes=np.int64(4))
    code, _, err = run(capsys, "partition", str(bad), "--num-parts", "2",
                       "--out", str(tmp_path / "p"))
    assert code == 2 and "bad.npz" in err and "id 7" in err


def test_unknown_method_is_rejected_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["partition", "cora", "--num-parts", "2", "--method", "nonsense",
              "--out", str(tmp_path / "p")])
    assert exc.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err


def test_info_on_a_corrupt_directory_names_the_file(tmp_path, capsys):
    run(capsys, "partition", "cora", "--num-parts", "2", "--out", str(tmp_path / "p"))
    (tmp_path / "p" / "part-1" / "etype.npy").write_bytes(b"\x93NUMPY garbage")
    code, _, err = run(capsys, "info", str(tmp_path / "p"), "--check")
    assert code == 2 and "part-1/etype.npy" in err
    code, _, err = run(capsys, "info", str(tmp_path / "missing"))
    assert code == 2 and "no such partition directory" in err


@pytest.mark.parametrize("argv", [[], ["partition"], ["info"]])
def test_help_everywhere(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--help"])
    assert exc.value.code == 0
    assert "usage: jgraph" in capsys.readouterr().out
