"""`train_and_evaluate` end to end: a small GraphSAGE-on-Cora run on 4 simulated devices
learns (test accuracy >= 0.75), writes metrics.jsonl, result.json, config.yaml and
curves.png, compiles its train step once for all epochs, and the model it saves
reproduces its scores under `evaluate_run`. Config errors name the field."""
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from jgraph.config import ConfigError, load, to_dict
from jgraph.data import load_dataset
from jgraph.jobs.experiment import Experiment, Inference
from jgraph.progress import Progress
from jgraph.train.events import read_scalars
from jgraph.train.loop import train_and_evaluate
from jgraph.train.model import evaluate_run

pytestmark = pytest.mark.slow     # a whole training run

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
TRAIN_SEEDS = 140                 # Cora's Planetoid split
EPOCHS = 10
# sage_cora.yaml, made quicker: 4 devices, one step per epoch (35 seeds per device),
# a larger learning rate, and a one-rung exchange ladder (one compiled branch: the
# same numbers, half the compile time). Seed 0 reaches test accuracy 0.79 in 10 epochs
# (0.81 in 20; each epoch's validation at level 0 costs 1.9 s here).
SMALL = ["data.num_parts=4", f"train.epochs={EPOCHS}", "train.batch_size=64",
         "train.lr=0.03", "exchange.max_rungs=1", "train.profile=trace",
         "train.profile_steps=3"]
ROW_FIELDS = {"epoch", "step", "loss", "train_acc", "val_acc", "epoch_seconds", "seeds_per_s",
              "compile_seconds"}
RESULT_FIELDS = {"val_acc", "test_acc", "val_macro_f1", "test_macro_f1", "best_epoch",
                 "final_loss", "compiles", "compiles_by_step", "seconds", "seeds_per_s",
                 "devices", "graph", "inference", "config", "compile_seconds",
                 "eval_compile_seconds"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config, workdir, returned result, progress output) of one small run, shared by
    the tests."""
    workdir = tmp_path_factory.mktemp("sage_cora")
    config = load(Experiment, EXPERIMENT, SMALL)
    said = io.StringIO()
    result = train_and_evaluate(config, str(workdir), Progress(enabled=True, stream=said))
    return config, workdir, result, said.getvalue()


def metrics(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_small_cora_run_on_4_devices_reaches_test_accuracy_0_75(trained):
    _, _, result, _ = trained
    assert result["devices"] == 4 and result["graph"] == "cora"
    assert result["test_acc"] >= 0.75, result
    assert result["val_acc"] >= 0.7, result
    assert 0 < result["test_macro_f1"] <= 1 and 0 < result["val_macro_f1"] <= 1


def test_the_result_sets_the_majority_baseline_beside_the_model(trained):
    """The most frequent class of the training nodes (cora's Planetoid split: 20 of
    each, so the lowest, 0), predicted everywhere, scored on val and test from the
    dataset's own labels and splits; the model is well above it."""
    _, _, result, _ = trained
    cora = load_dataset("cora")
    (ntype,) = cora.num_nodes
    labels, splits = cora.node_data[ntype]["label"], cora.splits[ntype]
    majority = int(np.argmax(np.bincount(labels[splits["train"]])))
    assert result["majority_class"] == majority == 0
    for split in ("val", "test"):
        want = float(np.mean(labels[splits[split]] == majority))
        assert result[f"majority_{split}_acc"] == pytest.approx(want, abs=1e-12)
        assert result[f"{split}_acc"] > result[f"majority_{split}_acc"] + 0.4


def test_metrics_jsonl_has_one_line_per_epoch_with_the_logged_fields(trained):
    _, workdir, _, _ = trained
    rows = metrics(workdir)
    assert [r["epoch"] for r in rows] == list(range(EPOCHS))
    steps_per_epoch = rows[0]["step"]
    assert steps_per_epoch == 1                   # 35 seeds a device, a batch of 64
    for r in rows:
        assert set(r) >= ROW_FIELDS, sorted(r)
        assert r["step"] == (r["epoch"] + 1) * steps_per_epoch    # steps counted on device
        assert math.isfinite(r["loss"]) and r["loss"] > 0
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["val_acc"] <= 1
        assert r["epoch_seconds"] > 0 and r["seeds_per_s"] > 0
        # The step was compiled before epoch 0 (its seconds are the steps' own).
        assert r["compile_seconds"] == rows[0]["compile_seconds"] > 0
        # Every training seed once per epoch, padding excluded.
        assert r["seeds_per_s"] * r["epoch_seconds"] == pytest.approx(TRAIN_SEEDS)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["train_acc"] > rows[0]["train_acc"]


def test_result_json_holds_the_result_and_one_train_step_compilation(trained):
    config, workdir, result, _ = trained
    saved = json.loads((workdir / "result.json").read_text())
    assert saved == json.loads(json.dumps(result))          # what was returned, on disk
    assert set(saved) >= RESULT_FIELDS, sorted(saved)
    assert saved["compiles"] == 1                            # one program for all epochs
    # Block sizes measured from cora: the second hop's below the worst case (every
    # node, 2708), and large enough that no step had to grow them (one compile).
    assert saved["capacity_growths"] == []
    assert len(saved["capacities"]) == 2 and saved["capacities"][1] < 2708
    # One evaluation program: the per-epoch val evaluator's, reused at the end for val
    # and test (their batches are shaped alike).
    assert saved["compiles_by_step"] == {"train_step": 1, "eval_step": 1}
    rows = metrics(workdir)
    # The best epoch by validation accuracy (the first of equals), whose parameters the
    # final evaluation scores: the full-neighbourhood evaluation is deterministic.
    best = max(range(EPOCHS), key=lambda e: (rows[e]["val_acc"], -e))
    assert saved["best_epoch"] == best
    assert saved["val_acc"] == rows[best]["val_acc"]
    assert saved["final_loss"] == rows[-1]["loss"]
    # The run's seconds hold its setup (the step's compile in it: no capacity grew) and
    # every epoch's steps, besides the evaluations and checkpoints.
    assert saved["compile_seconds"] < saved["setup_seconds"]
    assert saved["setup_seconds"] + sum(r["epoch_seconds"] for r in rows) < saved["seconds"]
    assert saved["config"] == to_dict(config)
    assert saved["config"]["train"]["epochs"] == EPOCHS


def test_config_yaml_in_the_workdir_loads_back_to_the_run_config(trained):
    config, workdir, _, _ = trained
    assert load(Experiment, str(workdir / "config.yaml")) == config


def test_train_profile_writes_a_profiler_trace_in_the_workdir(trained):
    _, workdir, _, _ = trained
    assert list((workdir / "trace").glob("plugins/profile/*/*.xplane.pb"))


def test_curves_png_is_written(trained):
    _, workdir, _, _ = trained
    assert (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_run_on_the_saved_model_reproduces_result_json(trained):
    _, workdir, _, _ = trained
    saved = json.loads((workdir / "result.json").read_text())
    got = evaluate_run(str(workdir), progress=Progress(enabled=False))
    assert set(got) == {"val", "test"}
    assert got["val"]["acc"] == saved["val_acc"]
    assert got["test"]["acc"] == saved["test_acc"]
    assert got["val"]["macro_f1"] == saved["val_macro_f1"]
    assert got["test"]["macro_f1"] == saved["test_macro_f1"]
    assert got["val"]["count"] == 500 and got["test"]["count"] == 1000


def test_full_graph_inference_agrees_with_sampling_every_neighbour(trained):
    # The config's eval_fanouts are [-1, -1]: the sampled evaluation already sees each
    # node's whole in-neighbourhood, so layer-wise full-graph inference scores the same
    # (to a node or two where float order flips an argmax).
    config, workdir, result, _ = trained
    assert config.train.eval_fanouts == (-1, -1)
    got = evaluate_run(str(workdir), inference=Inference.FULL, progress=Progress(enabled=False))
    assert got["val"]["count"] == 500 and got["test"]["count"] == 1000
    assert got["val"]["acc"] == pytest.approx(result["val_acc"], abs=2 / 500)
    assert got["test"]["acc"] == pytest.approx(result["test_acc"], abs=2 / 1000)


@pytest.mark.parametrize("key, value", [("train.fanouts", "[5]"),
                                        ("train.fanouts", "[5, 5, 5]"),
                                        ("train.eval_fanouts", "[-1]")])
def test_fanouts_whose_length_differs_from_num_layers_make_no_config(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + " has .* but "
                                          r"model\.num_layers is 2"):
        load(Experiment, EXPERIMENT, [f"{key}={value}"])


def test_one_hot_inputs_on_a_graphsage_config_are_rejected_naming_the_field():
    with pytest.raises(ConfigError, match=r"model\.one_hot_inputs is an R-GCN input layer; "
                                          r"model\.kind is 'sage'"):
        load(Experiment, EXPERIMENT, ["model.one_hot_inputs=true"])


def test_one_hot_inputs_on_a_graph_with_features_fail_naming_the_way_out(tmp_path):
    config = load(Experiment, EXPERIMENT, ["data.num_parts=2", "model.kind=rgcn",
                                           "model.one_hot_inputs=true"])
    with pytest.raises(ConfigError, match=r"model\.one_hot_inputs: node type '_N' of .*cora "
                                          r"has 'feat' features.*model\.learnable_inputs=true"):
        train_and_evaluate(config, str(tmp_path), Progress(enabled=False))


def test_target_type_that_is_not_a_node_type_fails_naming_it(tmp_path):
    config = load(Experiment, EXPERIMENT, ["data.num_parts=2", "data.target_type=paper"])
    with pytest.raises(ConfigError, match=r"data\.target_type 'paper' is not a node type"):
        train_and_evaluate(config, str(tmp_path), Progress(enabled=False))


def test_the_run_says_it_is_compiling_before_the_first_step_and_for_how_long(trained):
    """Users see the compilation (on the progress stream: stderr, which pipes and logs
    keep), and epoch 0's seconds are the steps' own."""
    _, workdir, result, said = trained
    lines = said.splitlines()
    start = lines.index("  compiling the training step for 4 device(s) ...")
    done = next(i for i, line in enumerate(lines)
                if line.startswith("  compiling the training step for 4 device(s): "))
    first_epoch = next(i for i, line in enumerate(lines) if line.startswith("  epoch 0 "))
    assert start < done < first_epoch
    seconds = float(lines[done].rsplit(": ", 1)[1].rstrip("s"))
    assert result["compile_seconds"] == pytest.approx(seconds, abs=0.06)
    assert metrics(workdir)[0]["compile_seconds"] == result["compile_seconds"]
    assert "  compiling the val evaluation step for 4 device(s) ..." in lines


def test_tensorboard_events_hold_the_losses_and_metrics_of_the_jsonl_files(trained):
    config, workdir, _, _ = trained
    assert len(list(workdir.glob("events.out.tfevents.*"))) == 1
    events = read_scalars(str(workdir))
    steps = [json.loads(line) for line in (workdir / "steps.jsonl").read_text().splitlines()]
    assert sorted(events["train/loss"]) == [s["step"] for s in steps]
    for s in steps:
        assert events["train/loss"][s["step"]] == pytest.approx(s["loss"], rel=1e-6)
    rows = metrics(workdir)
    assert len(rows) == EPOCHS
    for tag, key in (("train/loss_epoch", "loss"), ("train/acc", "train_acc"),
                     ("val/acc", "val_acc"), ("time/seeds_per_s", "seeds_per_s")):
        assert {r["step"]: pytest.approx(r[key], rel=1e-6) for r in rows} == events[tag], tag
    assert list(events["train/lr"].values()) == pytest.approx([config.train.lr] * EPOCHS)
    assert events["compiles/train_step"][rows[-1]["step"]] == 1
    # The step's exchanges and sampler: every step asked for ids and sampled edges.
    for tag in ("exchange/requested", "sampler/sampled_edges"):
        assert sorted(events[tag]) == [s["step"] for s in steps]
        assert min(events[tag].values()) > 0
