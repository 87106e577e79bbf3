"""Label propagation as a model (`model.kind: label_propagation`, node classification):
the training nodes' labels spread over the graph (Zhou et al., 2004; PyG's
`LabelPropagation`), `model.num_layers` steps with `model.alpha`, on the mesh
(`jgraph.jobs.propagation.label_propagation`: symmetric normalisation; a heterogeneous
graph's relations alike, every in-edge carrying its source's scores).

It learns nothing, so its run has no steps: `jgraph train` propagates once and scores
the splits as any node classification run does (accuracy, macro-F1, the majority
baseline beside them), and `jgraph eval`, `jgraph embed --what
predictions|probabilities`, `jgraph.load_run` and `jgraph smooth` propagate again from
the run's config (the labels and the graph are the whole model). A labelled node that
no training label reaches predicts the class prior.
"""
from __future__ import annotations

import dataclasses

from jgraph.config import ConfigError
from jgraph.jobs.experiment import (
    LABEL_PROPAGATION,
    Experiment,
    Inference,
    Task,
)
from jgraph.jobs.kind import NodeKind
from jgraph.jobs.metrics import probability_scores
from jgraph.jobs.propagation import label_propagation, rows_summing_to_one
from jgraph.jobs.run import Run, check_labels, target_type
from jgraph.jobs.table import register
from jgraph.progress import Progress
from jgraph.sharded import DistGraph
from jgraph.sharded.tensor import DistTensor


@dataclasses.dataclass(frozen=True)
class Propagation:
    """Label propagation's job: the labelled type's labels (a `DistTensor`), its
    training mask, and the propagation's steps and alpha."""

    labels: DistTensor
    train: DistTensor
    steps: int
    alpha: float

    @property
    def mesh(self):
        return self.labels.mesh


class LabelPropagationKind(NodeKind):
    """`model.kind: label_propagation` (see the module)."""

    task = Task.NODE
    model = LABEL_PROPAGATION
    title = "label propagation"
    learns = False
    samples = False
    timed_by_phase = False

    def check(self, config: Experiment) -> None:
        """Nothing of train.* applies (it trains nothing; train.mode and train.sampler
        say how a model would train, so a config written for one may name any), but
        control variates' history refresh, which asks for histories it does not keep."""
        t = config.train
        if t.history_refresh is not None:
            raise ConfigError(f"train.history_refresh={t.history_refresh}: model.kind "
                              f"{LABEL_PROPAGATION} keeps no histories to refresh")

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        if dg.abstract:
            raise ConfigError(f"model.kind {LABEL_PROPAGATION} has no compiled training "
                              f"step to build for other hardware")
        target = target_type(config, dg)
        train = sum(p.splits[target].get("train", 0) for p in dg.meta.parts)
        if not train:
            raise ConfigError(f"{config.data.path}: node type {target!r} has no training "
                              f"nodes, whose labels label propagation spreads")
        labels = dg.ndata(config.data.label, target)
        num_classes = check_labels(config, dg, target, labels)
        job = Propagation(labels, dg.split_mask("train", target), config.model.num_layers,
                          config.model.alpha)
        return Run(config, dg, target, num_classes, job, None, self)

    def describe(self, run: Run) -> str:
        job = run.job
        return (f"{run.num_classes} classes, label propagation: {job.steps} steps, alpha "
                f"{job.alpha:g}")

    def programs(self, run: Run):
        raise ConfigError(f"model.kind {LABEL_PROPAGATION} has no compiled training step")

    def validation(self, run: Run, on_trace=None, progress: Progress | None = None):
        return None

    def class_scores(self, run: Run, params, embeddings) -> DistTensor:
        """The propagated scores, each row divided by its sum (the class prior where no
        label arrived)."""
        job = run.job
        scores = label_propagation(run.dg, job.labels, job.train, run.num_classes,
                                   steps=job.steps, alpha=job.alpha)
        return rows_summing_to_one(scores)

    def evaluate(self, run: Run, params, embeddings, splits, inference: Inference,
                 evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
        out = dict.fromkeys(splits)
        present = [s for s in splits if run.has_split(s)]
        if present:
            probs = self.class_scores(run, params, embeddings)
            for split in present:
                out[split] = probability_scores(probs.array, run.job.labels.array,
                                                run.dg.split_mask(split, run.target).array)
        return out



register(LabelPropagationKind())
