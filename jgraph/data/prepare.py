"""One data preparation: what is done to a graph between reading it and partitioning it.

`jgraph partition`, `jgraph train`, `jgraph bench` and the Python API all prepare a
graph through `Preparation`, in one order:

    remove_self_loops -> held_out (link prediction) -> symmetrize -> reverse_relations
    -> dedup -> self_loops -> normalize_features

Edges are held out before any is reversed, so the reverse of a held-out edge is never
made (`jgraph.data.links`). A graph in memory is prepared by `prepare`; a chunked graph
directory (larger than memory) by `jgraph.data.prepare_chunked.prepare_chunked`,
streamed, to the same edges and rows and the same held-out edges
(`jgraph.data.held_out`).

A config's `data.*` settings (and `task: link`) are the whole preparation of the graph
it trains on: a chunked directory that has some steps already (its metadata.json
records them) gets the rest (`Preparation.still_to_do`), and a step it has that the
config does not ask for is refused. `jgraph partition` and `jgraph convert` flags add
steps to what their input has (`Preparation.then`). The partition directory records the preparation
it was written with (`PartitionMeta.preparation`), so a run that asks for another one
over it is refused by name (`differences`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from jgraph.data.graph import Graph, GraphError
from jgraph.data.links import EdgeSet, is_symmetric, split_edges
from jgraph.data.transforms import (
    add_reverse_relations,
    add_self_loops,
    deduplicate,
    normalize_features,
    remove_self_loops,
    symmetrize,
)


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Link prediction's held-out edges (`jgraph.data.links.split_edges`): fractions of
    each relation's distinct edges (pairs where the graph is or is made undirected) for
    validation and test, with `eval_negatives` fixed negatives each, drawn from `seed`."""

    val_fraction: float = 0.1
    test_fraction: float = 0.1
    eval_negatives: int = 1000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Preparation:
    """What to do to a graph before partitioning it; each step when asked, in the
    order of the fields.

    remove_self_loops: drop edges from a node to itself.
    held_out: link prediction's validation and test edges, taken out of the graph.
    symmetrize: add every edge's reverse and keep one of each (same-type relations).
    reverse_relations: add an inverse relation rev_<name> per relation (R-GCN).
    dedup: keep one edge per (source, destination) in every relation.
    self_loops: give every node one self-loop in same-type relations.
    normalize_features: the node array scaled to rows summing to 1, or None.
    """

    remove_self_loops: bool = False
    held_out: HeldOut | None = None
    symmetrize: bool = False
    reverse_relations: bool = False
    dedup: bool = False
    self_loops: bool = False
    normalize_features: str | None = None

    @property
    def steps(self) -> list[str]:
        """The names of the steps asked for, in the order they run."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Preparation:
        raw = dict(raw)
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise GraphError(f"preparation: unknown step(s) {unknown}")
        if raw.get("held_out") is not None:
            raw["held_out"] = HeldOut(**raw["held_out"])
        return cls(**raw)

    def then(self, later: Preparation) -> Preparation:
        """This preparation followed by `later` (a graph prepared twice): each step done
        by either. Refused, as a graph prepared so would not be the one its record
        names: a step that cannot run twice (held-out edges, reverse relations, another
        array normalised), and a step that comes before one already done in the order
        above (self-loops then remove_self_loops would leave none)."""
        order = [f.name for f in dataclasses.fields(self)]
        done = self.steps
        for step in later.steps:
            if step in done:
                if step in ("held_out", "reverse_relations") or (
                        step == "normalize_features"
                        and later.normalize_features != self.normalize_features):
                    raise GraphError(f"the graph has {step} already "
                                     f"({_shown(getattr(self, step))}); it is done once")
                continue                # the same step again changes nothing
            after = [d for d in done if order.index(d) > order.index(step)]
            if after:
                raise GraphError(f"{step} cannot follow {after[0]}, which the graph has "
                                 f"already: jgraph prepares in the order {', '.join(order)}; "
                                 f"prepare the graph as it was before with both")
        return Preparation(**{f: getattr(self, f) or getattr(later, f) for f in order})

    def still_to_do(self, recorded: Preparation) -> Preparation:
        """The steps of this preparation (the whole of what a config asks) that a graph
        prepared by `recorded` does not have yet; GraphError naming a step the graph
        has that this one does not ask for, or has otherwise (a held-out split drawn
        with other settings, another array normalised)."""
        for step, what in differences(recorded, self):
            if getattr(recorded, step) and (not getattr(self, step) or step in
                                            ("held_out", "normalize_features")):
                raise GraphError(f"{step}: {what} (recorded in its metadata.json); ask for "
                                 f"the graph's, or prepare it from the graph as it was")
        todo = self.without(recorded)
        recorded.then(todo)             # in order after what the graph has
        return todo

    def without(self, done: Preparation) -> Preparation:
        """The steps of this preparation that `done` does not have."""
        return Preparation(**{f.name: getattr(self, f.name) if not getattr(done, f.name)
                              else f.default for f in dataclasses.fields(self)})


def differences(recorded: Preparation, asked: Preparation) -> list[tuple[str, str]]:
    """The steps on which a graph prepared by `recorded` differs from `asked`, each as
    (step, 'asked X, the graph has Y')."""
    out = []
    for f in dataclasses.fields(Preparation):
        want, have = getattr(asked, f.name), getattr(recorded, f.name)
        if want != have:
            out.append((f.name, f"asked {_shown(want)}, the graph has {_shown(have)}"))
    return out


def _shown(value) -> str:
    if isinstance(value, HeldOut):
        return (f"val {value.val_fraction:g}, test {value.test_fraction:g}, "
                f"{value.eval_negatives} negatives, seed {value.seed}")
    return {True: "yes", False: "no", None: "none"}.get(value, repr(value)) \
        if isinstance(value, (bool, type(None))) else repr(value)


def prepare(graph: Graph, preparation: Preparation
            ) -> tuple[Graph, dict[str, EdgeSet] | None]:
    """(the prepared graph, link prediction's edge sets by split or None)."""
    p = preparation
    edge_splits = None
    if p.remove_self_loops:
        graph = remove_self_loops(graph)
    if p.held_out is not None:
        h = p.held_out
        split = split_edges(graph, h.val_fraction, h.test_fraction,
                            eval_negatives=h.eval_negatives, seed=h.seed,
                            undirected=p.symmetrize or is_symmetric(graph))
        graph, edge_splits = split.graph, split.edges
    if p.symmetrize:
        graph = symmetrize(graph)
    if p.reverse_relations:
        graph = add_reverse_relations(graph)
    if p.dedup:
        graph = deduplicate(graph)
    if p.self_loops:
        graph = add_self_loops(graph)
    if p.normalize_features:
        graph = normalize_features(graph, p.normalize_features)
    return graph, edge_splits


def recorded_preparation(spec) -> Preparation:
    """What was done to the graph at `spec` before: a chunked graph directory records
    its preparation in metadata.json (`jgraph convert --symmetrize`, or one prepared on
    the way to the bounded partitioner); any other input records none."""
    from jgraph.data.chunked import METADATA, is_chunked_dir
    if not is_chunked_dir(spec):
        return Preparation()
    with open(os.path.join(spec, METADATA)) as f:
        raw = json.load(f).get("preparation") or {}
    try:
        return Preparation.from_json(raw)
    except (TypeError, GraphError) as e:
        raise GraphError(f"{os.path.join(spec, METADATA)}: preparation: {e}") from None
