"""A run built from a graph's counts, not its data: `jgraph compile --abstract`.

To plan a job too big for this machine (papers100M on 64 H100s), a run is built from
the counts a synthetic spec names (`synthetic:nodes=111M,edges=1.6B,feat=128,
classes=172`) by its kind's own `build`, over a graph of shapes
(`jgraph.sharded.abstract.AbstractGraph`): the same model, sampler, exchange and
loaders `jgraph train` would build on such a partitioning, every array a shape struct,
so its compiled memory is what each device would need.

Homogeneous graphs with features and fixed fanouts (a -1 fanout needs the graph's
largest in-degree, which counts do not give).
"""
from __future__ import annotations

from jax.sharding import Mesh

from jgraph.config import ConfigError
from jgraph.data.synthetic import parse_spec
from jgraph.jobs.experiment import Experiment
from jgraph.jobs.table import kind_of
from jgraph.sharded.abstract import AbstractGraph, Counts, Shapes


def counts_of(config: Experiment, parts: int) -> Counts:
    """The counts `config.data.path` (a synthetic spec) names. A kind that learns node
    splits has the spec's train, val and test fractions of the nodes; link prediction's
    training positives are the edges (pairs, when the graph is made undirected) not
    held out, and the held-out ones and their reverses leave the sampled graph."""
    path = config.data.path
    if not path.startswith("synthetic:"):
        raise ConfigError(f"jgraph compile --abstract builds shapes from counts: data.path "
                          f"must be synthetic:nodes=...,edges=...,feat=...,classes=..., "
                          f"got {path!r}")
    spec = parse_spec(path)
    if spec.feat < 1:
        raise ConfigError("jgraph compile --abstract needs node features (feat >= 1)")
    kind = kind_of(config)
    held = kind.preparation(config).held_out
    kept = 1.0 if held is None else 1.0 - held.val_fraction - held.test_fraction
    edges = spec.edges * (2 if config.data.symmetrize else 1) * kept
    splits = ({name: int(round(fraction * spec.nodes)) for name, fraction in
               (("train", spec.train), ("val", spec.val), ("test", spec.test))}
              if kind.node_splits else {})
    positives = 0 if kind.node_splits else int(round(kept * spec.edges))
    return Counts(spec.nodes, int(round(edges)), spec.feat, spec.classes, splits, positives,
                  parts)


def abstract_graph(config: Experiment, counts: Counts, mesh: Mesh) -> AbstractGraph:
    """The graph of shapes of `counts` on `mesh`, its node arrays named as `config`'s
    data section names them."""
    try:
        return AbstractGraph(Shapes.of(counts), mesh, config.data.path,
                             feature=config.data.feature, label=config.data.label)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_fanouts(name: str, fanouts) -> None:
    if -1 in fanouts:
        raise ConfigError(f"jgraph compile --abstract: {name} has -1 (every neighbour), "
                          f"whose width is the graph's largest in-degree; give fixed fanouts")
