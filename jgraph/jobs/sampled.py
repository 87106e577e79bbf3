"""Node classification on sampled blocks (`task: node`, `train.mode: sampled`,
`train.sampler: neighbor`): the kind whose step (`NodeClassification`) is the
template the others fill in."""
from __future__ import annotations

from jgraph.jobs.experiment import Experiment
from jgraph.jobs.kind import NodeKind
from jgraph.jobs.run import Run, job_fields, node_parts, seed_loader, with_caches
from jgraph.jobs.step import NodeClassification
from jgraph.jobs.table import register
from jgraph.sharded import DistGraph


class SampledNodes(NodeKind):
    """Sampled node classification; its job class (`job_class`) is a kind's to change:
    a kind that only changes the step (its loss, say) subclasses this with its own."""

    job_class: type[NodeClassification] = NodeClassification

    def build(self, config: Experiment, dg: DistGraph, platform: str | None = None) -> Run:
        t = config.train
        p = node_parts(config, dg)
        job = self.job_class(
            p.graphdef, loader=seed_loader(config, dg, p.target, t.batch_size, t.drop_last),
            labels=p.labels,
            **job_fields(config, dg.exchange(config.exchange, platform), p.inputs))
        return Run(config, dg, p.target, p.num_classes, with_caches(config, dg, job),
                   p.params, self)


register(SampledNodes())
