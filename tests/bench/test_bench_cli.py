"""`jgraph bench exchange` and `jgraph bench sample` as a user runs them: the JSON
contract fields, figures that are consistent with each other, and clear usage errors."""
import json

import pytest

from jgraph.cli import main

EXCHANGE_FIELDS = ["bench", "strategy", "method", "devices", "seconds_per_call", "wire_bytes",
                   "min_bytes", "wire_bytes_ratio"]
SAMPLE_FIELDS = ["bench", "devices", "seeds_per_s", "sampled_edges_per_s", "compile_seconds",
                 "epochs"]


def json_lines(capsys):
    out, _ = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_bench_exchange_prints_a_line_per_strategy_and_per_table(capsys):
    code = main(["bench", "exchange", "cora", "--num-parts", "2", "--batch-size", "32",
                 "--batches", "2", "--fanouts", "5,5", "--strategy", "all_to_all",
                 "--strategy", "ppermute", "--embedding-rows", "1000", "--embedding-batch",
                 "64", "--json"])
    assert code == 0
    rows = json_lines(capsys)
    exchange = [r for r in rows if r["bench"] == "exchange"]
    assert [r["strategy"] for r in exchange] == ["all_to_all", "ppermute"]
    for r in exchange:
        assert set(EXCHANGE_FIELDS) <= set(r)
        assert r["devices"] == 2 and r["method"] == "metis"
        assert r["wire_bytes_ratio"] == pytest.approx(r["wire_bytes"] / r["min_bytes"])
        assert r["wire_bytes"] >= r["min_bytes"] > 0        # no cache: at least the minimum
    (emb,) = [r for r in rows if r["bench"] == "embedding"]
    assert emb["rows"] == 1000 and emb["seconds_per_step"] > 0


def test_bench_sample_counts_every_training_seed_once_per_epoch(capsys):
    code = main(["bench", "sample", "cora", "--devices", "2", "--fanouts", "5,5",
                 "--batch-size", "64", "--epochs", "2", "--json"])
    assert code == 0
    (row,) = json_lines(capsys)
    assert set(SAMPLE_FIELDS) <= set(row)
    assert row["devices"] == 2 and row["epochs"] == 2
    assert row["seeds_per_epoch"] == 140                    # cora's Planetoid train split
    seconds = row["seconds"]
    assert row["seeds_per_s"] * seconds == pytest.approx(2 * 140)
    # Each seed has at most 5 neighbours, each of those at most 5 more.
    edges = row["sampled_edges_per_s"] * seconds
    assert 0 < edges <= 2 * 140 * (5 + 5 * 5)


@pytest.mark.parametrize("argv, message", [
    (["bench", "sample", "cora", "--fanouts", "15,x"], "comma-separated list of ints"),
    (["bench", "sample", "cora", "--fanouts", "15,0"], "fanouts must be positive or -1"),
    (["bench", "sample", "cora", "--devices", "0"], "must be >= 1"),
    (["bench", "exchange", "cora", "--cache", "1.5"], "--cache is a fraction"),
    (["bench", "sampel", "cora"], "invalid choice: 'sampel'"),
])
def test_bad_bench_arguments_exit_2_naming_the_value(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as exit:          # argparse rejects before jgraph runs
        code = exit.code
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
