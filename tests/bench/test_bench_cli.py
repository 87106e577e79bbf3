"""`jgraph bench exchange` and `jgraph bench sample` as a user runs them: the JSON
contract fields, figures that are consistent with each other, clear usage errors, and
cases that would not fit in memory skipped before they allocate, naming the bytes."""
import json

import jax
import jax.numpy as jnp
import pytest

from jgraph.bench import common
from jgraph.cli import main

EXCHANGE_FIELDS = ["bench", "strategy", "method", "devices", "seconds_per_call", "wire_bytes",
                   "min_bytes", "wire_bytes_ratio"]
SAMPLE_FIELDS = ["bench", "devices", "seeds_per_s", "sampled_edges_per_s", "compile_seconds",
                 "epochs"]


def json_lines(capsys):
    out, _ = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow      # every strategy
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


@pytest.mark.slow        # 7 s of compiles
def test_bench_exchange_skips_what_would_not_fit_naming_the_bytes_needed_and_available(
        capsys, monkeypatch):
    monkeypatch.setattr(common, "available_memory_bytes", lambda: 1000)
    code = main(["bench", "exchange", "cora", "--num-parts", "2", "--batch-size", "32",
                 "--batches", "2", "--fanouts", "5,5", "--strategy", "all_gather",
                 "--embedding-rows", "1000", "--embedding-batch", "64", "--json"])
    assert code == 0
    exchange, table = json_lines(capsys)
    assert exchange["strategy"] == "all_gather" and table["bench"] == "embedding"
    # At least each device's answers for its 32 seeds; at least the table and its state.
    assert exchange["need_bytes"] >= 2 * 32 * exchange["row_bytes"]
    assert table["need_bytes"] >= table["table_bytes"]
    for row in (exchange, table):
        assert row["available_bytes"] == 1000
        assert not {"seconds_per_call", "seconds_per_step"} & set(row)       # nothing ran
        assert f"({row['need_bytes']:,} bytes) of this host's memory" in row["skipped"]
        assert "but only 1000 B (1,000 bytes) is available" in row["skipped"]
    assert "2 simulated device(s)" in exchange["skipped"]


def test_a_program_fits_when_each_simulated_device_s_temporaries_and_outputs_do(
        monkeypatch):
    devices = jax.devices()[:2]
    mesh = jax.sharding.Mesh(devices, ("parts",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("parts"))
    x = jax.ShapeDtypeStruct((1024, 64), jnp.float32, sharding=rows)
    compiled = jax.jit(lambda a: jnp.tanh(a) @ a.T, out_shardings=rows).lower(x).compile()
    per_device = common.device_bytes(compiled, arguments_allocated=True)
    assert per_device >= 512 * 1024 * 4                   # its block of the [1024, 1024] output
    assert (common.device_bytes(compiled, arguments_allocated=False)
            == per_device + 512 * 64 * 4)                 # and its block of x
    need = 2 * per_device + 100
    monkeypatch.setattr(common, "available_memory_bytes", lambda: need)
    assert common.memory_shortage(compiled, devices, arguments_allocated=True,
                                  host_extra=100) is None
    monkeypatch.setattr(common, "available_memory_bytes", lambda: need - 1)
    shortage = common.memory_shortage(compiled, devices, arguments_allocated=True,
                                      host_extra=100)
    assert shortage == (need, need - 1, "this host's memory for 2 simulated device(s)")


def test_available_memory_is_what_the_kernel_can_still_give_within_a_container_limit(
        tmp_path, monkeypatch):
    with open("/proc/meminfo") as f:
        meminfo = dict(line.split(":") for line in f)
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < common.available_memory_bytes() < total
    # A cgroup limit of 2 GiB with 1.5 GiB used, a quarter of it file cache: 0.75 GiB left.
    limit, usage, stat = (tmp_path / name for name in ("max", "current", "stat"))
    limit.write_text(f"{2 << 30}\n")
    usage.write_text(f"{3 << 29}\n")
    stat.write_text(f"anon {1 << 30}\ninactive_file {1 << 28}\n")
    monkeypatch.setattr(common, "_CGROUP_LIMITS", ((limit, usage, stat, "inactive_file"),))
    assert common.available_memory_bytes() == 3 << 28          # below MemAvailable here


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
    (["bench", "sample", "cora", "--fanouts", "15,x"], "train.fanouts[1]: expected int, got 'x'"),
    (["bench", "sample", "cora", "--fanouts", "15,0"], "a fanout is a neighbour count >= 1, "
                                                       "or -1 for every neighbour; got 0"),
    (["bench", "sample", "cora", "--devices", "0"], "data.num_parts (the devices, one "
                                                    "partition each) must be >= 1"),
    (["bench", "sample", "cora", "--impl", "cuda"], "impl must be one of"),
    (["bench", "exchange", "cora", "--cache", "1.5"], "exchange.cache is a fraction"),
    (["bench", "exchange", "cora", "--fanouts", "5,-1"], "samples a neighbour count >= 1"),
    (["bench", "exchange", "cora", "--strategy", "ring"], "strategies[0]: 'ring' is not one of"),
    (["bench", "exchange", "cora", "--embedding-rows", "1M,0"], "embedding_rows must be >= 1"),
    (["bench", "train", "cora", "--set", "model.hiden=3"], "unknown config key model.hiden"),
    (["bench", "train", "cora", "--set", "train.fanouts=[5,5]"],
     "train.fanouts has 2 hops but model.num_layers is 3"),
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
