"""`jgraph bench` settings are the experiment's sections: one config system, one default
per setting, and no invalid settings (the dataclasses refuse them when built)."""
import dataclasses

import pytest

from jgraph.bench.config import WORKLOAD_TRAIN, ExchangeBench, SampleBench, TrainBench
from jgraph.cli.bench import _settings
from jgraph.cli.main import build_parser
from jgraph.config import ConfigError
from jgraph.exchange import ExchangeConfig
from jgraph.jobs.experiment import Experiment, ModelConfig, TrainConfig


def settings(argv, name):
    return _settings(build_parser().parse_args(["bench", *argv]), name)


def test_every_bench_runs_with_the_experiment_s_exchange_defaults():
    for bench in (ExchangeBench(), SampleBench(), TrainBench()):
        assert bench.exchange == Experiment().exchange == ExchangeConfig()


def test_bench_train_trains_the_experiment_its_sections_make():
    bench = settings(["train", "cora", "--hidden", "32", "--fanouts", "5,5"], "TrainBench")
    experiment = bench.experiment("parts")
    assert experiment.data.path == "parts" and experiment.data.num_parts == 1
    assert (experiment.model, experiment.train, experiment.exchange) == (
        bench.model, bench.train, bench.exchange)
    assert experiment.model.num_layers == 2 and experiment.train.eval_fanouts == (5, 5)


def test_a_flag_sets_its_key_and_every_other_setting_keeps_its_default():
    bench = settings(["sample", "g.npz", "--growth", "1.5", "--replace", "--devices", "4"],
                     "SampleBench")
    assert bench.exchange == dataclasses.replace(ExchangeConfig(), growth=1.5)
    assert bench.data.path == "g.npz" and bench.data.num_parts == 4
    assert bench.train == WORKLOAD_TRAIN and bench.impl == "auto" and bench.replace


def test_set_reaches_keys_that_have_no_flag():
    bench = settings(["train", "--set", "exchange.max_rungs=2", "--set", "model.norm=true"],
                     "TrainBench")
    assert bench.exchange.max_rungs == 2 and bench.model.norm
    assert bench.data.path == "cora"


def test_the_help_shows_each_flag_s_key_and_the_dataclass_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"[exchange.growth; default: {ExchangeConfig.growth}]" in help_text
    assert "[train.fanouts; default: 15,10,5]" in help_text
    assert "[model.aggregator: one of mean, gcn, pool; default: mean]" in help_text


@pytest.mark.parametrize("build, message", [
    (lambda: TrainConfig(fanouts=(5, 0)), "train.fanouts = [5, 0]"),
    (lambda: ModelConfig(hidden=0), "model.hidden must be >= 1"),
    (lambda: ExchangeConfig(growth=1.0), "exchange.growth must be > 1"),
    (lambda: TrainBench(model=ModelConfig(num_layers=2)),
     "train.fanouts has 3 hops but model.num_layers is 2"),
    (lambda: Experiment(train=TrainConfig(fanouts=(5,), eval_fanouts=(5,))),
     "train.fanouts has 1 hops but model.num_layers is 2"),
    (lambda: ExchangeBench(batches=0), "batches must be >= 1"),
])
def test_an_invalid_setting_cannot_be_built(build, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        build()
