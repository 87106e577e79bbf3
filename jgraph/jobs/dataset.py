"""The graph a run trains on: the preparation its config asks for (`jgraph.data.prepare`),
checked against a partition directory's record, and the dataset prepared and
partitioned on the way in (in memory, or streamed over a chunked graph in bounded
memory), opened on the run's mesh. Shared by training, evaluation, the planner and the
benchmarks."""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

import jax

from jgraph.config import ConfigError
from jgraph.data import GraphError, load_dataset
from jgraph.data.chunked import open_chunked
from jgraph.data.prepare import (
    Preparation,
    differences,
    prepare,
    recorded_preparation,
)
from jgraph.data.prepare_chunked import prepared
from jgraph.jobs.experiment import DataConfig, Experiment
from jgraph.jobs.table import kind_of
from jgraph.mesh import first_devices, host_sync
from jgraph.partition import Method, partition_graph
from jgraph.partition.chunked import ChunkedOptions, bounded_route, partition_chunked, train_nodes
from jgraph.partition.store import read_meta
from jgraph.progress import Progress
from jgraph.sharded import DistGraph, make_mesh

PARTITION_DIR = "partition"



def run_mesh(config: Experiment):
    """A mesh of data.num_parts devices; 0 means as many as a partition directory has
    partitions, or else every device."""
    count = config.data.num_parts
    if not count and is_partition_dir(config.data.path):
        count = read_meta(config.data.path).num_parts
    return make_mesh(None, first_devices(count or jax.device_count()))


def is_partition_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "meta.json"))


def preparation(config: Experiment) -> Preparation:
    """The preparation `config` asks of its graph (`jgraph.data.prepare`): its kind's
    (`JobKind.preparation`: data's steps, and link prediction's held-out edges)."""
    return kind_of(config).preparation(config)


def data_preparation(data: DataConfig) -> Preparation:
    """The steps the data section asks for (no held-out edges)."""
    return Preparation(remove_self_loops=data.remove_self_loops, symmetrize=data.symmetrize,
                       reverse_relations=data.reverse_relations, dedup=data.dedup,
                       self_loops=data.self_loops,
                       normalize_features=data.feature if data.normalize_features else None)


# The settings that ask for each step of a preparation, for messages.
_SETTINGS = {"remove_self_loops": "data.remove_self_loops", "symmetrize": "data.symmetrize",
             "reverse_relations": "data.reverse_relations", "dedup": "data.dedup",
             "self_loops": "data.self_loops",
             "normalize_features": "data.normalize_features (of data.feature)",
             "held_out": "task: link (link.val_fraction, test_fraction, eval_negatives, "
                         "split_seed)"}


def check_prepared(path: str, asked: Preparation) -> None:
    """Refuse a partition directory prepared otherwise than `asked`, naming each
    setting that differs: a setting is never ignored."""
    recorded = read_meta(path).preparation
    if not recorded:
        if asked.steps:
            raise ConfigError(f"{path} records no preparation (written before jgraph "
                              f"recorded it), and the config asks for "
                              f"{', '.join(_SETTINGS[s] for s in asked.steps)}; partition the "
                              f"graph again")
        return
    found = differences(Preparation.from_json(recorded), asked)
    if found:
        named = [f"{_SETTINGS[step]}: {what}" for step, what in found]
        raise ConfigError(f"{path} was partitioned with another preparation than the config "
                          f"asks: {'; '.join(named)}. Partition the graph with the config's "
                          f"settings (jgraph partition's flags of the same names), or set "
                          f"them to the graph's")


def open_graph(config: Experiment, mesh, workdir: str, progress: Progress,
               reuse: bool = False) -> DistGraph:
    """The graph of `config` on the mesh (`open_data`)."""
    kind = kind_of(config)
    return open_data(config.data, kind.preparation(config), mesh, workdir, progress,
                     seed=config.train.seed, reuse=reuse, check_seeds=kind.node_splits)


def open_data(data: DataConfig, asked: Preparation, mesh, workdir: str, progress: Progress,
              *, seed: int = 0, reuse: bool = False, check_seeds: bool = True) -> DistGraph:
    """The graph on the mesh: data.path itself when it is a partition directory
    (prepared as `asked`, else refused), else the dataset prepared as `asked` and
    partitioned into WORKDIR/partition by the first process (the others wait for it): a
    chunked graph directory streamed in bounded memory, any other input in memory.
    reuse: open WORKDIR/partition as it is when it exists (a resumed run must train on
    the partitioning it started with). check_seeds: refuse more devices than training
    nodes."""
    if is_partition_dir(data.path):
        check_prepared(data.path, asked)
        return DistGraph(data.path, mesh)
    root = os.path.join(workdir, PARTITION_DIR)
    if reuse and is_partition_dir(root):
        check_prepared(root, asked)
        return DistGraph(root, mesh)
    # What the config asks is the whole preparation; the input may have some of it.
    try:
        todo = asked.still_to_do(recorded_preparation(data.path))
    except GraphError as e:
        raise ConfigError(f"{data.path}: {e}") from None
    if bounded_route(data.path, data.method):
        return open_chunked_graph(data, todo, mesh, root, progress, seed=seed,
                                  check_seeds=check_seeds)
    if jax.process_index() == 0:
        if os.path.isdir(root) and not is_partition_dir(root):
            progress.note(f"removing {root}: an incomplete partition (a run was stopped "
                          f"while writing it)")
            shutil.rmtree(root)
        with progress.phase(f"loading {data.path}"):
            graph = load_dataset(data.path)
            check_normalized(data, todo, graph.node_data)
            graph, edge_splits = prepare(graph, todo)
        if check_seeds:
            train = [len(named["train"]) for named in graph.splits.values()
                     if "train" in named]
            check_mesh_fits(max(train, default=0), mesh.size, data.path)
        partition_graph(graph, mesh.size, data.method or Method.METIS, root, seed=seed,
                        overwrite=True, progress=progress, edge_splits=edge_splits,
                        preparation=asked)
    host_sync("jgraph partition written")
    return DistGraph(root, mesh)


def open_chunked_graph(data: DataConfig, todo: Preparation, mesh, root: str,
                       progress: Progress, *, seed: int, check_seeds: bool) -> DistGraph:
    """A chunked graph directory prepared (`todo`: what it does not have yet) and
    partitioned on the way in, in bounded memory, into `root` (by the first process;
    the others wait for it). The prepared graph is a scratch chunked directory beside
    `root`, removed once partitioned, or on failure."""
    if jax.process_index() == 0:
        check_normalized(data, todo, open_chunked(data.path).node_data)
        with prepared(data.path, todo, root, progress=progress) as source:
            if check_seeds:
                check_mesh_fits(train_nodes(open_chunked(source)), mesh.size, data.path)
            partition_chunked(source, root, ChunkedOptions(mesh.size, seed=seed),
                              overwrite=True, progress=progress)
    host_sync("jgraph partition written")
    return DistGraph(root, mesh)


def check_normalized(data: DataConfig, asked: Preparation, node_data: Mapping) -> None:
    """Refuse data.normalize_features of a data.feature that no node type holds."""
    name = asked.normalize_features
    if name and not any(name in arrays for arrays in node_data.values()):
        raise ConfigError(f"data.normalize_features: data.feature {name!r} is not a node "
                          f"array of {data.path}; its node arrays are "
                          f"{ {t: sorted(arrays) for t, arrays in node_data.items()} }")


def check_mesh_fits(train_nodes: int, devices: int, path: str) -> None:
    """Refuse, before partitioning and compiling, a mesh with more devices than training
    nodes: every device needs seeds to train on."""
    if train_nodes and devices > train_nodes:
        raise ConfigError(f"{devices} devices, but {path} has {train_nodes} training nodes: "
                          f"every device needs at least one; use at most {train_nodes} "
                          f"devices (--devices, data.num_parts)")
