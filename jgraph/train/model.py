"""The trained model on disk (WORKDIR/model) and `jgraph eval`: a run's model saved
with checksums, read back only when its values match, and scored again."""
from __future__ import annotations

import json
import os

import jax

from jgraph.config import ConfigError
from jgraph.jobs import build_run
from jgraph.jobs.dataset import PARTITION_DIR, is_partition_dir, open_graph, run_mesh
from jgraph.jobs.evaluate import evaluate_splits
from jgraph.jobs.experiment import Experiment, Inference
from jgraph.jobs.run import Run
from jgraph.mesh import all_processes, host_sync
from jgraph.progress import Progress
from jgraph.sharded import DistGraph
from jgraph.train.checkpoint import (
    ModelError,
    check_space,
    checksums,
    mismatched,
    quiet_abandoned_reads,
    read_failure,
    refused_writes,
)

# -- The trained model on disk (what `jgraph eval` reads) ------------------------------
#
# WORKDIR/model is an orbax checkpoint of {"params", "embeddings"} plus CHECKSUMS_FILE,
# {"format", "checksums": {leaf path: checksum}} (the checkpoints' checksums), written
# once the arrays are on disk. Orbax reads some damaged files without complaint and
# returns wrong numbers, so a model is only used once its values match.

MODEL_DIR = "model"
CHECKSUMS_FILE = "jgraph_checksums.json"
MODEL_FORMAT = 1


def save_model(workdir: str, params, embeddings) -> str:
    """Write the model's parameters and embedding tables to WORKDIR/model (orbax), then
    their checksums."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    tree = {"params": params, "embeddings": embeddings}
    record = {"format": MODEL_FORMAT, "checksums": checksums(tree)}
    check_space(path, tree, "the trained model")
    with refused_writes(path), ocp.StandardCheckpointer() as ckpt:   # leaving waits
        ckpt.save(path, tree, force=True)
    if jax.process_index() == 0:
        # tmp + rename: a crash leaves no checksums at all rather than half of them.
        tmp = os.path.join(path, CHECKSUMS_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(path, CHECKSUMS_FILE))
    host_sync("jgraph model saved")
    return path


def rewrite_hint(workdir: str) -> str:
    return (f"write it again with `jgraph train {os.path.join(workdir, 'config.yaml')} "
            f"--workdir {workdir}` (with the run's --devices): it resumes from the run's "
            f"last checkpoint and saves the model without training again")


def saved_checksums(workdir: str) -> dict[str, int]:
    """The checksums `save_model` wrote beside the model, or `ModelError`."""
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR, CHECKSUMS_FILE))
    if not os.path.exists(path):
        raise ModelError(f"{os.path.dirname(path)} has no checksums ({CHECKSUMS_FILE}: "
                         f"saved by an older jgraph, or its save was interrupted), so its "
                         f"values cannot be verified; {rewrite_hint(workdir)}")
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record, dict) or record.get("format") != MODEL_FORMAT:
            raise ValueError(f"not of format {MODEL_FORMAT}, the one this jgraph reads")
        sums = record.get("checksums")
        if not (isinstance(sums, dict) and all(isinstance(v, int) for v in sums.values())):
            raise ValueError("no table of checksums")
    except ValueError as e:         # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{path} is unreadable ({type(e).__name__}: {e}); "
                         f"{rewrite_hint(workdir)}") from None
    return sums


def load_model(workdir: str, run: Run):
    """(params, embeddings) saved by `save_model`, placed like a fresh run's; raises
    `ModelError` unless they can be read and match their checksums. Every process of a
    job raises, or none."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(workdir, MODEL_DIR))
    if not os.path.isdir(path):
        raise ConfigError(f"{workdir}: no trained model ({MODEL_DIR}/ is missing); "
                          f"train with `jgraph train CONFIG --workdir {workdir}` first")

    def agree(error: ModelError | None) -> None:
        if not all_processes(error is None):
            raise error or ModelError(f"{path} is unreadable on another process; "
                                      f"{rewrite_hint(workdir)}")

    saved, error = None, None
    try:
        saved = saved_checksums(workdir)
    except ModelError as e:
        error = e
    agree(error)
    fresh = run.job.init(run.params)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                          {"params": fresh.params, "embeddings": fresh.embeddings})
    try:
        with ocp.StandardCheckpointer() as ckpt:
            got = ckpt.restore(path, target)
    except Exception as e:
        error = ModelError(f"{path} is unreadable ({read_failure(e)}); {rewrite_hint(workdir)}")
        quiet_abandoned_reads()
    agree(error)
    bad = mismatched(saved, got)       # the same on every process (global arrays)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ModelError(f"{path} is damaged: the values of {bad[0]}{more} differ from "
                         f"those saved (checksums); {rewrite_hint(workdir)}")
    return got["params"], got["embeddings"]


def open_trained(workdir: str, progress: Progress | None = None):
    """(run, params, embeddings) of the model a run saved in `workdir`, on the mesh of
    its config (its partitions: as many devices as it trained on); params and
    embeddings are None for a kind that learns nothing."""
    from jgraph.config import load
    progress = progress or Progress()
    if not os.path.exists(os.path.join(workdir, "config.yaml")):
        raise ConfigError(f"{workdir}: not a trained run (no config.yaml); train with "
                          f"`jgraph train CONFIG --workdir {workdir}` first")
    config = load(Experiment, os.path.join(workdir, "config.yaml"))
    mesh = run_mesh(config)
    dg = open_graph(config, mesh, workdir, progress) if is_partition_dir(config.data.path) \
        else DistGraph(os.path.join(workdir, PARTITION_DIR), mesh)
    run = build_run(config, dg)
    if not run.kind.learns:
        return run, None, None          # its config is the whole model (label propagation)
    params, embeddings = load_model(workdir, run)
    return run, params, embeddings


def evaluate_run(workdir: str, splits=("val", "test"), inference: Inference | None = None,
                 progress: Progress | None = None) -> dict:
    """Scores of the model a run saved, on `splits`, with the run's config (its
    inference unless `inference` is given)."""
    progress = progress or Progress()
    run, params, embeddings = open_trained(workdir, progress)
    for split in splits:
        if not run.has_split(split):
            raise ConfigError(f"split {split!r} is not in the graph; it has "
                              f"{sorted(run.dg.meta.splits.get(run.target, []))}")
    return evaluate_splits(run, params, embeddings, splits,
                           inference or run.config.train.inference, progress=progress)
