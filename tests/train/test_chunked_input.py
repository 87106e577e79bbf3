"""A run whose data.path is a chunked graph directory: prepared (streamed) and
partitioned on the way in by the bounded-memory route (never loaded whole), and it
learns as a run on METIS partitions does; what needs the graph in memory is refused
naming the key."""
import os
from pathlib import Path

import pytest

from jgraph.config import ConfigError, load
from jgraph.data import load_dataset, save_chunked
from jgraph.jobs.experiment import Experiment
from jgraph.partition import open_partitions
from jgraph.progress import Progress
from jgraph.train.loop import train_and_evaluate

EXPERIMENT = str(Path(__file__).resolve().parents[2] / "experiments" / "sage_cora.yaml")
# As tests/train/test_loop.py's small run (seed 0 reaches 0.79 on METIS partitions).
# The config normalises the features: streamed on the way in.
SMALL = ["data.num_parts=4", "train.epochs=10", "train.batch_size=64", "train.lr=0.03",
         "exchange.max_rungs=1", "data.method=null"]


@pytest.mark.slow        # a whole training run
def test_a_chunked_directory_is_partitioned_in_bounded_memory_and_trains(tmp_path):
    save_chunked(load_dataset("cora"), tmp_path / "cora", edges_per_chunk=2000)
    config = load(Experiment, EXPERIMENT, [*SMALL, f"data.path={tmp_path / 'cora'}"])
    result = train_and_evaluate(config, str(tmp_path / "run"), Progress(enabled=False))
    meta = open_partitions(tmp_path / "run" / "partition").meta
    assert meta.method == "multilevel" and meta.num_parts == 4
    assert meta.preparation["normalize_features"] == "feat"
    assert not [f for f in os.listdir(tmp_path / "run") if "prepared" in f]   # removed
    assert set(meta.build["phases"]) >= {"scan", "assignment", "node data"}
    assert result["test_acc"] >= 0.75, result


def test_what_needs_the_graph_in_memory_is_refused_naming_the_key(tmp_path):
    """Link prediction's held-out edges are drawn in memory only (data.method: metis)."""
    save_chunked(load_dataset("cora"), tmp_path / "cora")
    config = load(Experiment, EXPERIMENT, [*SMALL, f"data.path={tmp_path / 'cora'}",
                                           "task=link"])
    with pytest.raises(ConfigError, match="task: link .* not drawn for a chunked"):
        train_and_evaluate(config, str(tmp_path / "run"), Progress(enabled=False))
