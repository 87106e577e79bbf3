"""The job table: every config the settings accept names exactly one kind of job, and
that kind is the one the run, the planner and the loop then use."""
import itertools

import pytest

from jgraph.config import ConfigError
from jgraph.jobs import KINDS, kind_of
from jgraph.jobs.experiment import (
    Experiment,
    Mode,
    ModelConfig,
    Sampler,
    Task,
    TrainConfig,
)


def config_of(task: Task, mode: Mode, sampler: Sampler) -> Experiment:
    # Control variates' estimator needs two layers of mean GraphSAGE without dropout.
    model = ModelConfig(num_layers=2, dropout=0.0, input_dropout=0.0)
    train = TrainConfig(mode=mode, sampler=sampler, fanouts=(2, 2))
    return Experiment(task=task, model=model, train=train)


@pytest.mark.parametrize("task,mode,sampler", list(itertools.product(Task, Mode, Sampler)))
def test_every_accepted_combination_has_its_own_kind(task, mode, sampler):
    try:
        config = config_of(task, mode, sampler)
    except ConfigError:
        assert (task, mode, sampler) not in KINDS      # refused where nothing trains it
        return
    kind = kind_of(config)
    assert kind.key == (task, mode, sampler)
    assert KINDS[kind.key] is kind


def test_the_table_has_one_kind_per_key_and_each_its_own_build():
    kinds = list(KINDS.values())
    # Sampled, full-batch and control-variate node classification, link prediction,
    # and label propagation (keyed by its model.kind).
    assert len({k.key for k in kinds}) == len(kinds) == 5
    assert [k.key for k in kinds if k.model is not None] == [
        ("node", "model.kind", "label_propagation")]
    # Every kind builds its own runs (none inherits a stub), from partitions and from
    # counts alike: there is no second constructor to keep equal.
    for kind in kinds:
        assert type(kind).build is not type(kind).__mro__[-2].build
        assert not hasattr(kind, "build_abstract")


def test_a_combination_no_kind_trains_is_refused_naming_the_settings():
    config = config_of(Task.NODE, Mode.SAMPLED, Sampler.NEIGHBOR)
    object.__setattr__(config, "task", Task.LINK)
    object.__setattr__(config.train, "mode", Mode.FULL)
    with pytest.raises(ConfigError, match="task link.*train.mode full"):
        kind_of(config)
