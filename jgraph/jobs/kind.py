"""What a kind of job is: the one object that owns all of a run of it.

A job's kind is chosen by its config's task, `train.mode` and `train.sampler`; each
kind's module registers it (`jgraph.jobs.table.register`). The kind owns:

- `check`: its settings' rules (an `Experiment` hands itself to them as it is made);
- `preparation`: what it asks of the graph (link prediction's held-out edges);
- `build`: the run from a partitioned graph (model, optimizer, loader, the step's job),
  or from a graph of shapes made from counts (`jgraph compile --abstract`:
  `jgraph.sharded.abstract`), and `sized`: its capacities, restored from a checkpoint
  or measured; `output_width`;
- `programs`: a built run's programs (training step, sampled evaluation, full-graph
  inference) for `jgraph compile`;
- `validation`, `evaluate`, `epoch_fields`, `epoch_scores`, `final_scores`: how the
  run scores a split per epoch and at the end, and how those scores become the
  epoch's log row and the result's fields; `baselines`: what a model that learns
  nothing scores, beside them (node classification's majority class);
- `bench_fields`: what `jgraph bench train` reports of it;
- `end_epoch` and its job's `TrainState.extra`: state of its own (control variates'
  histories).

Its step is its job class's (`Job.train_step`, the template every job
class fills in). `NodeKind` is what node classification's kinds share: labels,
accuracy and macro-F1, sampled or full-graph evaluation.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jgraph.config import ConfigError
from jgraph.data.outputs import What
from jgraph.data.prepare import Preparation
from jgraph.jobs.dataset import data_preparation
from jgraph.jobs.evaluate import SampledEvaluator, evaluation
from jgraph.jobs.experiment import Experiment, Inference, Mode, Sampler, Task
from jgraph.jobs.inference import full_graph_rows_program, full_graph_scores, split_masks
from jgraph.jobs.programs import Programs
from jgraph.jobs.propagation import labelled_rows
from jgraph.jobs.run import Run, calibrated_exchange, calibrated_sampler, split_labels
from jgraph.jobs.signal import host_signal, signal_of
from jgraph.progress import Progress
from jgraph.sharded import DistGraph
from jgraph.sharded.tensor import DistTensor


class JobKind:
    """One kind of job (task x mode x sampler); see the module."""

    task: str
    mode: str = Mode.SAMPLED
    sampler: str = Sampler.NEIGHBOR
    model: str | None = None
    """The model.kind that is a job of its own (None: the kind trains any model)."""
    title: str
    """What it trains, in words ("node classification"), for messages."""
    samples: bool = True
    """Its step samples blocks around seeds: the run measures the sampler's and the
    exchange's capacities from its first batches (full-batch training samples nothing)."""
    node_splits: bool = True
    """Its graph's nodes carry the train/val/test splits it learns and scores (link
    prediction's splits are edges)."""
    classifies: bool = True
    """Its model's last layer gives classes (logits, predictions); else embeddings."""
    histories: bool = False
    """It keeps histories of layers' rows (train.history_refresh renews them)."""
    timed_by_phase: bool = True
    """`jgraph bench train --breakdown` can time its step's phases (`jgraph.bench.profile`)."""
    rate: str = "seeds_per_s"
    """The result's throughput field: what the loader deals, per second."""
    train_key: str = "train_acc"
    """The epoch row's training score: the step's correct / count."""
    validation_key: str = "val_acc"
    """The epoch row's validation score (None where there is no validation split)."""

    learns: bool = True
    """It trains parameters (label propagation does not: its run evaluates at once)."""

    @property
    def key(self) -> tuple[str, str, str]:
        if self.model is not None:
            return self.task, "model.kind", self.model
        return self.task, self.mode, self.sampler

    @property
    def name(self) -> str:
        if self.model is not None:
            return f"task {self.task}, model.kind {self.model}"
        return f"task {self.task}, train.mode {self.mode}, train.sampler {self.sampler}"

    # -- settings and graph ------------------------------------------------------------

    def check(self, config: Experiment) -> None:
        """Raise ConfigError (naming the key) where `config`'s settings do not fit this
        kind: one fanout per layer (training's where it samples, evaluation's), and no
        setting another kind owns."""
        m, t = config.model, config.train
        for key, fanouts in (("train.fanouts", t.fanouts), ("train.eval_fanouts",
                                                             t.eval_fanouts)):
            if key == "train.fanouts" and not self.samples:
                continue
            if len(fanouts) != m.num_layers:
                raise ConfigError(f"{key} has {len(fanouts)} hops but model.num_layers is "
                                  f"{m.num_layers}: give one fanout per layer")
        if t.history_refresh is not None and not self.histories:
            raise ConfigError(f"train.history_refresh={t.history_refresh}: only "
                              f"train.sampler: control_variate keeps histories")
        if config.smooth.after_training and not self.classifies:
            raise ConfigError(f"smooth.after_training: Correct & Smooth corrects class "
                              f"predictions; a {self.title} run has none")

    def preparation(self, config: Experiment) -> Preparation:
        """What the run asks of its graph (`jgraph.data.prepare`): the data section's
        steps."""
        return data_preparation(config.data)

    # -- building ----------------------------------------------------------------------

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        """The run of `config` on `dg` (a partitioned graph, or an `AbstractGraph` of
        shapes: whatever the build reads of values it asks `dg.abstract` for); platform:
        the one its program is built for (default: the mesh's), which chooses the
        exchange's AUTO strategy."""
        raise NotImplementedError

    def output_width(self, config: Experiment, num_classes: int) -> int:
        """The model's last layer's width: the classes (a kind that embeds: its own)."""
        return num_classes

    def programs(self, run: Run) -> Programs:
        """The programs of a run built from a partitioned graph."""
        raise NotImplementedError

    def sized(self, run: Run, job, restored: dict, embeddings=None,
              progress: Progress | None = None):
        """`job` with the capacities a checkpoint's run had grown to (`restored`: its
        meta, {} for none), else with those measured from the graph and the first
        batches (train.calibrate_capacities: the sampler's; the exchange's where it is
        calibrated), so a resumed run computes with the same shapes."""
        progress = progress or Progress(enabled=False)
        if restored.get("capacities"):
            job = dataclasses.replace(job, sampler=dataclasses.replace(
                job.sampler, capacities=tuple(restored["capacities"])))
        elif self.samples and run.config.train.calibrate_capacities:
            job = calibrated_sampler(dataclasses.replace(run, job=job), progress)
        if "exchange_capacities" in restored:
            job = dataclasses.replace(job, exchange=job.exchange.calibrated(
                restored["exchange_capacities"]))
        elif self.samples:
            job = calibrated_exchange(job, run.dg.graph, embeddings, progress)
        return job

    def end_epoch(self, run: Run, job, state, epoch: int):
        """(the state the next epoch starts from, fields for the epoch's row) after
        epoch `epoch`'s steps: the state as it is, and nothing, unless the kind keeps
        something it renews between epochs (control variates' histories)."""
        return state, {}

    def bench_fields(self, run: Run, job, state) -> dict:
        """What `jgraph bench train` reports of this kind's run besides the step's
        time: what it samples and how, and the state it keeps."""
        t = run.config.train
        worst = job.sampler.worst_case(run.dg.graph, job.seeds_per_step)
        return {"fanouts": list(t.fanouts), "batch_size": t.batch_size,
                "capacities": list(job.sampler.capacities or worst),
                "worst_case_capacities": worst, "seeds_per_epoch": job.loader.num_seeds}

    # -- evaluating --------------------------------------------------------------------

    def describe(self, run: Run) -> str:
        """What one epoch goes over, for the run's first line."""
        raise NotImplementedError

    def has_split(self, run: Run, split: str) -> bool:
        raise NotImplementedError

    def validation(self, run: Run, on_trace=None, progress: Progress | None = None):
        """The per-epoch validation's evaluator ((params, embeddings) -> scores), or None
        without a validation split."""
        raise NotImplementedError

    def evaluate(self, run: Run, params, embeddings, splits, inference: Inference,
                 evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
        """{split: scores, or None where the graph has no such split}; evaluators:
        compiled ones to reuse, by split, where they evaluate as asked (the run's
        validation evaluator, say)."""
        raise NotImplementedError

    def validated_splits(self, scores, evaluator, inference: Inference) -> dict:
        """{split: final scores} that `scores` already holds: what the per-epoch
        validation's `evaluator` returned for the best epoch's parameters, where
        `evaluate` under `inference` would compute them with that evaluator's program
        again (the report takes them and evaluates the other splits). None here."""
        return {}

    def epoch_fields(self, correct: int, count: int) -> dict:
        """The epoch row's training fields from its steps' correct and count sums."""
        return {self.train_key: correct / max(count, 1)}

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        """(the epoch row's validation fields, the score the best epoch is chosen by) of
        what the validation evaluator returned."""
        raise NotImplementedError

    def final_scores(self, final: dict, config: Experiment) -> dict:
        """The result's score fields from `evaluate`'s {split: scores or None}."""
        raise NotImplementedError

    def baselines(self, run: Run) -> dict:
        """The result's fields of what a model that learns nothing scores (none)."""
        return {}

    def reach(self, run: Run, embeddings) -> dict:
        """The result's fields of the labelled items no signal reaches with the trained
        `embeddings` (none)."""
        return {}

    def class_scores(self, run: Run, params, embeddings) -> DistTensor:
        """What the run predicts for every labelled node, over the whole graph: float32
        [rows, classes] class probabilities, a `DistTensor` in the labels' layout (what
        Correct & Smooth corrects). A kind whose model gives no classes raises."""
        raise ConfigError(f"a {self.title} run predicts no classes")


class NodeKind(JobKind):
    """Node classification: scored by accuracy and macro-F1 of the labelled node type,
    sampled with the evaluation fanouts or by full-graph inference."""

    task = Task.NODE
    title = "node classification"

    def describe(self, run: Run) -> str:
        return (f"{run.job.loader.num_seeds:,} training seeds, {run.num_classes} classes")

    def has_split(self, run: Run, split: str) -> bool:
        return split in run.dg.meta.splits.get(run.target, [])

    def validation(self, run: Run, on_trace=None, progress: Progress | None = None):
        if not run.has_split("val"):
            return None
        return SampledEvaluator(run, "val", on_trace, progress)

    def programs(self, run: Run) -> Programs:
        """Sampled evaluation of the validation split (else the test split, else the
        training one), full-graph inference of both, Correct & Smooth."""
        splits = [s for s in ("val", "test") if run.has_split(s)] or ["train"]
        return Programs(run.job, run.dg.graph, run.params, evaluation(run, splits[0]),
                        split_masks(run, splits), run.config.smooth, run.num_classes)

    def evaluate(self, run: Run, params, embeddings, splits, inference: Inference,
                 evaluators=None, on_trace=None, progress: Progress | None = None) -> dict:
        present = [s for s in splits if run.has_split(s)]
        out = dict.fromkeys(splits)
        if inference is Inference.FULL:
            if present:
                out.update(full_graph_scores(run, params, embeddings, present))
            return out
        # Reused where they evaluate as asked: a full-batch run validates full-graph.
        known = {s: e for s, e in (evaluators or {}).items()
                 if isinstance(e, SampledEvaluator)}
        for split in present:
            evaluator = known.get(split)
            if evaluator is None:
                # Another split's compiled program evaluates this one where they share
                # shapes.
                compiled = next((e for e in known.values()
                                 if isinstance(e, SampledEvaluator)), None)
                evaluator = (compiled.of(run, split, on_trace) if compiled is not None
                             else SampledEvaluator(run, split, on_trace, progress))
                known[split] = evaluator
            out[split] = evaluator(params, embeddings)
        return out

    def validated_splits(self, scores, evaluator, inference: Inference) -> dict:
        """Sampled: `evaluate` scores val with the validation's `SampledEvaluator`."""
        if inference is Inference.SAMPLED and isinstance(evaluator, SampledEvaluator):
            return {"val": scores}
        return {}

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        return ({"val_acc": scores["acc"], "val_macro_f1": scores["macro_f1"],
                 "val_loss": scores["loss"]}, scores["acc"])

    def baselines(self, run: Run) -> dict:
        """The majority baseline: the most frequent class of the training nodes (the
        lowest of those tied), predicted for every node; its accuracy on val and test
        (None without the split), beside the model's."""
        labels = run.job.labels.to_numpy()
        train = split_labels(run.dg, run.target, "train", labels)
        majority = int(np.argmax(np.bincount(train, minlength=run.num_classes)))
        out = {"majority_class": majority}
        for split in ("val", "test"):
            held = (split_labels(run.dg, run.target, split, labels) if run.has_split(split)
                    else None)
            out[f"majority_{split}_acc"] = (None if held is None or not held.size else
                                            float(np.mean(held == majority)))
        return out

    def reach(self, run: Run, embeddings) -> dict:
        """`unreached_val`, `unreached_test`: how many of the split's nodes no signal
        reaches (they predict the class prior: `jgraph.jobs.signal`), where the labelled
        type has no features (else every node is reached and there are no fields)."""
        got = host_signal(run, signal_of(run, embeddings))
        if got is None:
            return {}
        reached = got[0]
        return {f"unreached_{split}": (int(np.sum(~reached[run.dg.split_mask(
                    split, run.target).to_numpy().astype(bool)]))
                    if run.has_split(split) else None)
                for split in ("val", "test")}

    def class_scores(self, run: Run, params, embeddings) -> DistTensor:
        """The model's softmax for every labelled node by layer-wise full-graph
        inference."""
        # Nodes no signal reaches give the prior (`jgraph.jobs.signal`).
        rows, lost = full_graph_rows_program(run.job, run.dg.graph, What.PROBABILITIES,
                                             None)(params, embeddings,
                                                   run.job.data(run.dg.graph),
                                                   signal=signal_of(run, embeddings))
        if int(lost):
            raise RuntimeError(f"full-graph inference: {int(lost)} id(s) were lost by the "
                               f"exchange")
        return labelled_rows(run.dg, run.job.labels.layout, rows)

    def final_scores(self, final: dict, config: Experiment) -> dict:
        def pick(split, key):
            return None if final[split] is None else final[split][key]
        return {"val_acc": pick("val", "acc"), "test_acc": pick("test", "acc"),
                "val_macro_f1": pick("val", "macro_f1"),
                "test_macro_f1": pick("test", "macro_f1")}
