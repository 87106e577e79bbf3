"""`jgraph bench train` as a user runs it: one JSON line whose figures are consistent
with each other (every training seed counted once per measured epoch), and a clear
error, exit status 2, for a graph it cannot train on."""
import json
import resource

import numpy as np
import pytest

from jgraph.cli import main
from jgraph.data import load_dataset
from jgraph.partition import partition_graph

pytestmark = pytest.mark.slow     # benchmark runs

TRAIN_FIELDS = ["bench", "graph", "devices", "method", "model", "layers", "hidden",
                "fanouts", "batch_size", "epochs", "steps", "seeds_per_epoch", "seconds",
                "seeds_per_s", "step_seconds", "compile_seconds", "lower_seconds", "final_loss",
                "backend"]
CORA_TRAIN = 140            # Planetoid split
EPOCHS = 2                  # measured epochs (one warm-up epoch runs before them)
# A small model; a coarse exchange ladder (fewer compiled branches: compiles faster).
SMALL = ["--devices", "2", "--fanouts", "5,5", "--batch-size", "64", "--hidden", "32",
         "--growth", "16", "--json"]


@pytest.fixture(scope="module")
def cora_train_seeds_per_part(tmp_path_factory):
    """Cora's train seeds on each of 2 METIS parts, partitioned as the bench does."""
    meta = partition_graph(load_dataset("cora"), 2, "metis",
                           str(tmp_path_factory.mktemp("cora2")), seed=0)
    return [p.splits["_N"]["train"] for p in meta.parts]


def test_bench_train_prints_one_json_line_counting_every_seed_once_per_epoch(
        capsys, cora_train_seeds_per_part):
    code = main(["bench", "train", "cora", "--epochs", str(EPOCHS), *SMALL])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1                                  # --json: nothing else on stdout
    row = json.loads(lines[0])
    assert set(TRAIN_FIELDS) <= set(row), sorted(row)
    assert row["bench"] == "train" and row["graph"] == "cora"
    assert row["devices"] == 2 and row["epochs"] == EPOCHS
    assert row["layers"] == 2 and row["fanouts"] == [5, 5]
    assert row["hidden"] == 32 and row["batch_size"] == 64
    assert row["seeds_per_s"] > 0 and row["step_seconds"] > 0 and row["compile_seconds"] > 0
    assert 0 < row["lower_seconds"] < row["compile_seconds"]
    assert row["seeds_per_epoch"] == CORA_TRAIN
    # The loader's steps per epoch: the busiest device's train seeds over the batch size.
    steps_per_epoch = -(-max(cora_train_seeds_per_part) // 64)
    assert row["steps"] == EPOCHS * steps_per_epoch
    assert row["seeds_per_s"] * row["seconds"] == pytest.approx(EPOCHS * CORA_TRAIN)
    assert row["step_seconds"] * row["steps"] == pytest.approx(row["seconds"])
    assert np.isfinite(row["final_loss"]) and row["final_loss"] > 0


def test_bench_train_steps_times_that_many_steps_not_epochs(capsys,
                                                            cora_train_seeds_per_part):
    """--steps 5: five steps of one epoch's order, wrapping around past its last step,
    each counting the seeds it trains; the peak memory reported."""
    before = high_water_bytes()
    code = main(["bench", "train", "cora", "--steps", "5", *SMALL])
    after = high_water_bytes()
    out, _ = capsys.readouterr()
    assert code == 0
    row = json.loads(out.strip().splitlines()[-1])
    assert row["steps"] == 5 and row["epochs"] == 0
    assert row["step_seconds"] * 5 == pytest.approx(row["seconds"])
    per_epoch = -(-max(cora_train_seeds_per_part) // 64)
    # The loader spreads an epoch's seeds evenly over its steps (cora's 2 parts hold
    # 70 train seeds each: 2 steps of 35 per device), so 5 steps train 2.5 epochs'.
    assert per_epoch == 2 and all(seeds % per_epoch == 0
                                  for seeds in cora_train_seeds_per_part)
    assert row["seeds_per_s"] * row["seconds"] == pytest.approx(5 / per_epoch * CORA_TRAIN)
    # This process's high-water mark when the row was made: between the marks read
    # before and after the command (in bytes, not ru_maxrss's KiB).
    assert before <= row["peak_rss_bytes"] <= after


def test_bench_train_full_mode_takes_one_step_an_epoch_over_every_training_seed(capsys):
    code = main(["bench", "train", "cora", "--epochs", str(EPOCHS), "--mode", "full",
                 *SMALL])
    out, _ = capsys.readouterr()
    assert code == 0
    row = json.loads(out.strip().splitlines()[-1])
    assert row["mode"] == "full" and row["steps"] == EPOCHS and row["fanouts"] is None
    assert row["seeds_per_epoch"] == CORA_TRAIN and row["layers"] == 2
    assert row["seeds_per_s"] * row["seconds"] == pytest.approx(EPOCHS * CORA_TRAIN)
    assert row["step_seconds"] * row["steps"] == pytest.approx(row["seconds"])
    assert np.isfinite(row["final_loss"]) and row["final_loss"] > 0


def high_water_bytes() -> int:
    """This process's peak resident memory so far (Linux's ru_maxrss, in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_graph_without_train_split(path):
    rng = np.random.default_rng(0)
    np.savez(path, src=rng.integers(0, 200, 1000), dst=rng.integers(0, 200, 1000),
             num_nodes=np.int64(200), feat=rng.standard_normal((200, 8)).astype(np.float32),
             label=rng.integers(0, 3, 200))
    return str(path)


@pytest.mark.parametrize("graph, names", [
    (lambda tmp: "synthetic:nodes=500,edges=3000,feat=0", "feat"),
    (lambda tmp: write_graph_without_train_split(tmp / "nosplit.npz"), "train"),
    (lambda tmp: "synthetic:nodes=500,edges=3000,feat=8,train=0", "train"),
], ids=["no_features", "no_train_split", "empty_train_split"])
def test_bench_train_on_a_graph_it_cannot_train_exits_2_naming_what_is_missing(
        tmp_path, capsys, graph, names):
    code = main(["bench", "train", graph(tmp_path), "--epochs", "1", *SMALL])
    out, err = capsys.readouterr()
    assert code == 2
    assert names in err and "Traceback" not in err
    assert not out.strip()


@pytest.mark.parametrize("argv, message", [
    (["--fanouts", "5,0"], "train.fanouts = [5, 0]: a fanout is a neighbour count"),
    (["--hidden", "0"], "model.hidden must be >= 1"),
    (["--growth", "1"], "exchange.growth must be > 1"),
    (["--steps", "-1"], "steps is -1"),
    (["--precision", "f16"], "train.precision: 'f16' is not one of ['f32', 'bf16']"),
])
def test_bad_bench_train_arguments_exit_2_naming_the_value(capsys, argv, message):
    try:
        code = main(["bench", "train", "cora", *argv])
    except SystemExit as exit:          # argparse rejects before jgraph runs
        code = exit.code
    _, err = capsys.readouterr()
    assert code == 2 and message in err


def test_bench_train_profile_writes_a_trace_and_a_breakdown_that_adds_up_to_the_step(
        tmp_path, capsys):
    from jgraph.bench.profile import PHASES
    trace = tmp_path / "trace"
    # One device: the breakdown compiles the step's prefixes, a few seconds each.
    code = main(["bench", "train", "cora", "--epochs", "1", "--profile", str(trace), *SMALL,
                 "--devices", "1"])
    out, _ = capsys.readouterr()
    assert code == 0
    row = json.loads(out.strip().splitlines()[-1])
    phases = row["phase_seconds"]
    assert list(phases) == list(PHASES)
    assert all(np.isfinite(v) for v in phases.values())
    # The phases are differences of the cumulative programs, ending in the loop's
    # measured time per step: together they are the step.
    assert sum(phases.values()) == pytest.approx(row["step_seconds"])
    assert row["profile"] == str(trace)
    assert list(trace.glob("plugins/profile/*/*.xplane.pb"))
    assert "HloModule" in (trace / "train_step.hlo.txt").read_text()


def test_the_hot_node_cache_in_training_moves_fewer_bytes_and_trains_the_same(capsys):
    rows = {}
    for cache, by in (("0", "degree"), ("0.25", "degree"), ("0.25", "frequency")):
        code = main(["bench", "train", "cora", "--epochs", "1", "--cache", cache,
                     "--cache-by", by, *SMALL])
        out, _ = capsys.readouterr()
        assert code == 0
        rows[cache, by] = json.loads(out.strip().splitlines()[-1])
    off = rows["0", "degree"]
    assert off["cache_rows"] == 0 and off["cached_per_step"] == 0
    for by in ("degree", "frequency"):
        on = rows["0.25", by]
        assert on["cache_rows"] == round(0.25 * 2708)
        assert on["cached_per_step"] > 0
        assert on["wire_bytes_per_step"] < off["wire_bytes_per_step"]
        # The cache answers the same rows: the same training, step for step.
        assert on["final_loss"] == off["final_loss"]


def test_bench_train_reads_a_partition_directory_or_a_chunked_graph_as_training_does(
        tmp_path, capsys):
    from jgraph.data import save_chunked
    save_chunked(load_dataset("cora"), tmp_path / "chunked", edges_per_chunk=3000)
    partition_graph(load_dataset("cora"), 2, "metis", str(tmp_path / "parts"), seed=0)
    rows = {}
    for name in ("parts", "chunked"):
        code = main(["bench", "train", str(tmp_path / name), "--epochs", "1", *SMALL])
        out, _ = capsys.readouterr()
        assert code == 0
        rows[name] = json.loads(out.strip().splitlines()[-1])
        assert rows[name]["seeds_per_epoch"] == CORA_TRAIN and rows[name]["devices"] == 2
    assert rows["parts"]["method"] == "metis" and rows["chunked"]["method"] == "multilevel"
    # A partition directory of another part count is refused, naming both counts.
    code = main(["bench", "train", str(tmp_path / "parts"), "--epochs", "1",
                 *[a if a != "2" else "4" for a in SMALL]])
    assert code == 2 and "holds 2 partitions" in capsys.readouterr().err
