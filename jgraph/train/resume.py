"""Where a run starts: afresh, or from the newest checkpoint of its workdir that belongs
to the same run (the same resolved config, but for `train.epochs` and `checkpoint.*`,
and the same partitioning), with every piece of loop state a checkpoint holds.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib

import jax
import numpy as np

from jgraph.config import to_dict
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.run import Run
from jgraph.jobs.step import TrainState
from jgraph.progress import Progress
from jgraph.sampling.loader import LoaderState
from jgraph.sharded import DistGraph
from jgraph.train.checkpoint import CheckpointError, Checkpoints, Restored, abstract

# Fields a resumed run may change: how long it trains and how it checkpoints.
RESUMABLE_CHANGES = ("name", "train.epochs", "train.profile", "checkpoint.")


class Resume(enum.Enum):
    """auto: continue from the workdir's newest checkpoint if it has one; require: the
    same, but fail without one (`--resume`); fresh: delete its checkpoints and start
    over (`--fresh`)."""

    AUTO = "auto"
    REQUIRE = "require"
    FRESH = "fresh"


@dataclasses.dataclass
class EpochSums:
    """The running totals of an epoch's steps (checkpointed mid-epoch, so a resumed
    epoch reports what the uninterrupted one would have)."""

    loss: float = 0.0          # sum over steps of mean loss x seeds
    correct: int = 0
    count: int = 0
    seconds: float = 0.0

    def add(self, m: dict) -> None:
        self.loss += float(m["loss"]) * int(m["count"])
        self.correct += int(m["correct"])
        self.count += int(m["count"])


@dataclasses.dataclass(frozen=True)
class Best:
    """The epoch with the best validation score so far.

    Fields:
      score: its validation score, the one the run selects by: accuracy, or MRR for
        link prediction (-1 before any).
      epoch: its index, None before any.
      state: (params, embeddings) copied at its end; None before any (the report then
        scores the last epoch's state).
      scores: what the validation evaluator returned for that state, where this
        process evaluated it (None before any, and after a restore): the report's
        validation scores, where it would evaluate them with the same program.
    """

    score: float = -1.0
    epoch: int | None = None
    state: tuple | None = None
    scores: dict | None = None


def state_dict(state: TrainState) -> dict:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def restore_targets(run: Run, mesh) -> tuple[dict, dict]:
    """Abstract (state, best) trees placed on this run's mesh, for orbax to restore into."""
    job = run.job
    state = abstract(state_dict(jax.eval_shape(job.init, run.params)),
                     state_dict(job.state_specs()), mesh)
    return state, {"params": state["params"], "embeddings": state["embeddings"]}


def run_identity(config: Experiment, dg: DistGraph) -> dict:
    """What a checkpoint must agree with to continue this run: the resolved config and
    the partitioning (a hash of its node map: the same ids on the same devices)."""
    resolved = dataclasses.replace(config, data=dataclasses.replace(
        config.data, num_parts=dg.mesh.size))
    node_map = dg.parts.node_map()
    return {"config": to_dict(resolved),
            "partition": {"graph": dg.meta.graph_name, "num_parts": dg.meta.num_parts,
                          "node_map_sha1": hashlib.sha1(np.ascontiguousarray(node_map))
                          .hexdigest()}}


def check_resumable(saved: dict, now: dict, path: str) -> None:
    """Raise `CheckpointError` naming the fields where checkpoint `path` was written by
    a different run than `now` describes."""
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out
    before, after = flat(saved), flat(now)
    # A setting added since the checkpoint was written held its default then.
    defaults = flat({"config": to_dict(Experiment())})
    before, after = {**defaults, **before}, {**defaults, **after}
    diffs = [f"{k}: {before.get(k)!r} there, {after.get(k)!r} now"
             for k in sorted(set(before) | set(after))
             if (k.startswith("config.") or k.startswith("partition."))
             and before.get(k) != after.get(k)
             and not k.removeprefix("config.").startswith(RESUMABLE_CHANGES)]
    if diffs:
        raise CheckpointError(
            f"checkpoint {path} belongs to another run: " + "; ".join(diffs[:6]) +
            ". Resume with the same config (only train.epochs and checkpoint.* may "
            "change), or start over with --fresh or another --workdir")


@dataclasses.dataclass(frozen=True)
class Start:
    """Where the loop begins. Fields: restored (the checkpoint, None when starting
    afresh); state (`TrainState`); best (`Best`); position (`LoaderState`: epoch and
    batch); sums (`EpochSums` of the epoch so far); rows (metrics.jsonl rows so far);
    step (steps applied so far)."""

    restored: Restored | None
    state: TrainState
    best: Best
    position: LoaderState
    sums: EpochSums
    rows: list
    step: int


def starting_point(run: Run, mesh, ckpts: Checkpoints, resume: Resume, identity: dict,
                   workdir: str, progress: Progress) -> Start:
    """The newest readable checkpoint of this run (`identity`, see `run_identity`), or
    a fresh start; `Resume.REQUIRE` raises `CheckpointError` when there is none."""
    restored = None
    if ckpts.steps():
        restored = ckpts.restore_latest(
            *restore_targets(run, mesh), check=lambda meta, path: check_resumable(
                {k: meta.get(k) for k in identity}, identity, path))
        if restored is None and resume is Resume.REQUIRE:
            raise CheckpointError(f"{workdir}: none of its checkpoints could be read")
    if restored is None:
        return Start(None, run.job.init(run.params), Best(), LoaderState(0, 0), EpochSums(),
                     [], 0)
    meta = restored.meta
    best = Best(meta["best"].get("score", meta["best"].get("val_acc")), meta["best"]["epoch"],
                None if meta["best"]["epoch"] is None else
                (restored.best["params"], restored.best["embeddings"]))
    begin = Start(restored, TrainState(**restored.state), best,
                  LoaderState(*meta["position"]), EpochSums(**meta["sums"]), meta["rows"],
                  meta["step"])
    progress.note(f"resuming from {ckpts.directory}/{restored.step}: step {begin.step}, "
                  f"epoch {begin.position.epoch} batch {begin.position.step} (restored in "
                  f"{ckpts.timings['restore_seconds']:.1f}s)")
    return begin
