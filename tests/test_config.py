"""Config loading: YAML into typed frozen dataclasses, --set overrides, clear errors."""
import dataclasses
import enum

import pytest

from jgraph.config import ConfigError, load, override, to_dict


class Agg(enum.Enum):
    MEAN = "mean"
    POOL = "pool"


@dataclasses.dataclass(frozen=True)
class Model:
    hidden: int = 16
    aggregator: Agg = Agg.MEAN
    dropout: float = 0.5
    norm: bool = False


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str = "x"
    fanouts: tuple[int, ...] = (15, 10)
    partition: str | None = None
    model: Model = Model()


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_values_are_converted_to_the_field_types(tmp_path):
    cfg = load(Experiment, write(tmp_path, "fanouts: [5, 3]\nmodel:\n  aggregator: pool\n"
                                           "  hidden: 32\n"))
    assert cfg == Experiment(fanouts=(5, 3), model=Model(hidden=32, aggregator=Agg.POOL))


def test_set_overrides_any_field_and_parses_values_as_yaml():
    cfg = override(Experiment(), ["model.hidden=256", "fanouts=[4,4]", "model.norm=true",
                                  "partition=parts/cora8", "model.dropout=0"])
    assert cfg.model == Model(hidden=256, norm=True, dropout=0.0)
    assert cfg.fanouts == (4, 4) and cfg.partition == "parts/cora8"
    assert to_dict(cfg)["model"]["aggregator"] == "mean"


@pytest.mark.parametrize("assignment, message", [
    ("model.hiden=3", "unknown config key model.hiden; valid keys under model: "
                      "['hidden', 'aggregator', 'dropout', 'norm']"),
    ("modle.hidden=3", "unknown config key modle.hidden; valid keys: "
                       "['name', 'fanouts', 'partition', 'model']"),
    ("model.aggregator=max", "model.aggregator: 'max' is not one of ['mean', 'pool']"),
    ("model.hidden=big", "model.hidden: expected int, got 'big'"),
    ("model.hidden=2.5", "model.hidden: expected an integer, got 2.5"),
    ("model.norm=3", "model.norm: expected true or false, got 3"),
    ("fanouts=[5, x]", "fanouts[1]: expected int, got 'x'"),
    ("name.first=a", "name is a value, not a section"),
    ("hidden", "expected key=value"),
])
def test_bad_overrides_name_the_key(assignment, message):
    with pytest.raises(ConfigError) as err:
        override(Experiment(), [assignment])
    assert message in str(err.value)


def test_unknown_key_in_a_file_names_the_file_and_the_valid_keys(tmp_path):
    path = write(tmp_path, "model:\n  hidden: 8\n  layers: 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown config key model.layers; valid "
                                          r"keys under model: \['hidden'"):
        load(Experiment, path)


def test_missing_and_malformed_files_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: cannot read the config"):
        load(Experiment, str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(Experiment, write(tmp_path, "model: [1, \n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(Experiment, write(tmp_path, "- 1\n- 2\n"))


@pytest.mark.parametrize("settings, message", [
    (["model.aggregator=pool"], "model.aggregator mean or gcn"),
    (["model.kind=gat"], "model.kind: sage"),
    (["model.attn_dropout=0.2"], "no attention to drop"),
    (["model.num_layers=1", "train.fanouts=[2]", "train.eval_fanouts=[-1]"],
     "model.num_layers >= 2"),
    # No kind of job trains these: the table's refusal lists the kinds that exist.
    (["train.mode=full"], "no kind of job trains task node with train.mode full and "
                          "train.sampler control_variate"),
    (["task=link"], "no kind of job trains task link with train.mode sampled and "
                    "train.sampler control_variate"),
])
def test_control_variates_refuse_what_their_estimator_cannot_do_naming_the_key(settings,
                                                                                 message):
    from jgraph.jobs.experiment import Experiment as Run
    base = ["train.sampler=control_variate", "model.dropout=0"]
    with pytest.raises(ConfigError) as err:
        override(Run(), base + settings)
    assert message in str(err.value)
    assert "control_variate" in str(err.value)
    override(Run(), base)          # mean GraphSAGE without dropout is accepted
    override(Run(), base + ["model.dropout=0.5", "model.input_dropout=0.2",
                            "train.history_refresh=3"])          # and with it (CVD)


@pytest.mark.parametrize("settings, message", [
    (["train.sampler=control_variate", "train.history_refresh=0"],
     "train.history_refresh: a period of at least 1 epoch"),
    (["train.sampler=control_variate", "train.history_refresh=-2"],
     "train.history_refresh: a period of at least 1 epoch"),
    (["train.history_refresh=2"], "only train.sampler: control_variate keeps histories"),
    (["train.sampler=control_variate", "train.history_precision=int8"],
     "train.history_precision: 'int8' is not one of"),
])
def test_history_settings_are_refused_by_name(settings, message):
    from jgraph.jobs.experiment import Experiment as Run
    with pytest.raises(ConfigError, match=message):
        override(Run(), settings)
