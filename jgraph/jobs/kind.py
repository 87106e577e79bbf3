"""What a kind of job is: the one object that builds, evaluates and plans a run of it.

A job's kind is chosen by its config's task, `train.mode` and `train.sampler`
(`jgraph.jobs.table` registers one `JobKind` per combination). The kind owns:

- `build`: the run from a partitioned graph (model, optimizer, loader, the step's job);
- `build_abstract`: the same run's programs from a graph's counts (`jgraph compile
  --abstract`);
- `programs`: a built run's programs (training step, sampled evaluation, full-graph
  inference) for `jgraph compile`;
- `validation` and `evaluate`: how the run scores a split per epoch and at the end,
  and how those scores become the epoch's log row and the result's fields.

Its step is its job class's (`NodeClassification.train_step`, the template every job
class fills in). `NodeKind` is what node classification's kinds share: labels,
accuracy and macro-F1, sampled or full-graph evaluation.
"""
from __future__ import annotations

from jgraph.jobs.evaluate import SampledEvaluator
from jgraph.jobs.experiment import Experiment, Inference, Mode, Sampler, Task
from jgraph.jobs.inference import full_graph_scores, split_masks
from jgraph.jobs.programs import Programs
from jgraph.jobs.run import Run
from jgraph.progress import Progress
from jgraph.sharded import DistGraph


class JobKind:
    """One kind of job (task x mode x sampler); see the module."""

    task: Task
    mode: Mode = Mode.SAMPLED
    sampler: Sampler = Sampler.NEIGHBOR
    rate: str = "seeds_per_s"
    """The result's throughput field: what the loader deals, per second."""
    validation_key: str = "val_acc"
    """The epoch row's validation score (None where there is no validation split)."""

    @property
    def key(self) -> tuple[Task, Mode, Sampler]:
        return self.task, self.mode, self.sampler

    @property
    def name(self) -> str:
        return f"task {self.task.value}, train.mode {self.mode.value}, " \
               f"train.sampler {self.sampler.value}"

    # -- building ----------------------------------------------------------------------

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        """The run of `config` on `dg`; platform: the one its program is built for
        (default: the mesh's), which chooses the exchange's AUTO strategy."""
        raise NotImplementedError

    def build_abstract(self, config: Experiment, counts, mesh, platform: str) -> Programs:
        """The run's programs from `counts` (`jgraph.jobs.abstract.Counts`), every array
        a shape struct placed on `mesh`."""
        raise NotImplementedError

    def programs(self, run: Run) -> Programs:
        """The programs of a run built from a partitioned graph."""
        raise NotImplementedError

    def end_epoch(self, run: Run, job, state, epoch: int):
        """(the state the next epoch starts from, fields for the epoch's row) after
        epoch `epoch`'s steps: the state as it is, and nothing, unless the kind keeps
        something it renews between epochs (control variates' histories)."""
        return state, {}

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

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        """(the epoch row's validation fields, the score the best epoch is chosen by) of
        what the validation evaluator returned."""
        raise NotImplementedError

    def final_scores(self, final: dict, config: Experiment) -> dict:
        """The result's score fields from `evaluate`'s {split: scores or None}."""
        raise NotImplementedError


class NodeKind(JobKind):
    """Node classification: scored by accuracy and macro-F1 of the labelled node type,
    sampled with the evaluation fanouts or by full-graph inference."""

    task = Task.NODE

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
        training one), full-graph inference of both."""
        splits = [s for s in ("val", "test") if run.has_split(s)] or ["train"]
        return Programs(run.job, run.dg.graph, run.params,
                        SampledEvaluator(run, splits[0]).job, split_masks(run, splits))

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

    def epoch_scores(self, scores: dict) -> tuple[dict, float]:
        return ({"val_acc": scores["acc"], "val_macro_f1": scores["macro_f1"],
                 "val_loss": scores["loss"]}, scores["acc"])

    def final_scores(self, final: dict, config: Experiment) -> dict:
        def pick(split, key):
            return None if final[split] is None else final[split][key]
        return {"val_acc": pick("val", "acc"), "test_acc": pick("test", "acc"),
                "val_macro_f1": pick("val", "macro_f1"),
                "test_macro_f1": pick("test", "macro_f1")}
