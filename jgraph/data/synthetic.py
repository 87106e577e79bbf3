"""Synthetic graphs with a learnable signal, deterministic by seed, up to 10^7+ edges.

A spec string names one: `synthetic:nodes=200k,edges=4M,kind=powerlaw,feat=100,classes=47`
(keys in any order, all optional; sizes accept `k`, `M`, `G` (or `B`) and `1e6` forms).

Kinds:
- `powerlaw`: a degree-corrected stochastic block model. Node weights follow a Zipf
  law with exponent `alpha`, so degrees are heavy-tailed; each edge picks its
  destination by weight and, with probability `homophily`, a source of the same class
  (otherwise any source), again by weight.
- `uniform`: the same with equal weights (an Erdős-Rényi graph with classes).
- `rmat`: R-MAT recursive quadrant sampling (a, b, c, d) = (0.57, 0.19, 0.19, 0.05),
  which gives skewed in-degrees; R-MAT alone carries no label signal, so with
  probability `homophily` an edge's source is replaced by a uniformly chosen node of
  the destination's class. Ids are then shuffled so that id order reveals nothing.

Every kind gives a simple directed graph (no self-loops, no duplicate edges) with
exactly `edges` edges. Features are a class centroid plus unit Gaussian noise, scaled
so that a node's own features are a weak signal and its neighbourhood a stronger one.
"""
from __future__ import annotations

import dataclasses
import enum
import re

import numpy as np

from jgraph.data.graph import Graph
from jgraph.data.npz import DatasetError


class Kind(enum.Enum):
    POWERLAW = "powerlaw"
    UNIFORM = "uniform"
    RMAT = "rmat"


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic graph; `parse_spec` reads them from a string."""

    nodes: int = 100_000
    """Number of nodes."""
    edges: int = 1_000_000
    """Number of directed edges, exactly."""
    kind: Kind = Kind.POWERLAW
    """Generator: powerlaw, uniform or rmat."""
    classes: int = 10
    """Number of label classes."""
    feat: int = 64
    """Feature dimension (0 for a featureless graph)."""
    homophily: float = 0.7
    """Probability that an edge's source is drawn from its destination's class."""
    alpha: float = 2.2
    """powerlaw: exponent of the degree distribution's tail."""
    signal: float = 1.0
    """Scale of the class centroids relative to the unit feature noise."""
    train: float = 0.1
    """Fraction of nodes in the training split."""
    val: float = 0.1
    """Fraction of nodes in the validation split."""
    test: float = 0.2
    """Fraction of nodes in the test split."""
    seed: int = 0
    """Random seed; the same spec always gives the same graph."""

    def __post_init__(self):
        if self.nodes < 2:
            raise DatasetError(f"synthetic: nodes={self.nodes} must be at least 2")
        if not 0 <= self.edges <= self.nodes * (self.nodes - 1):
            raise DatasetError(f"synthetic: edges={self.edges} must be between 0 and "
                               f"nodes*(nodes-1)={self.nodes * (self.nodes - 1)}")
        if self.classes < 1 or self.feat < 0:
            raise DatasetError("synthetic: classes must be >= 1 and feat >= 0")
        if not 0 <= self.homophily <= 1 or self.alpha <= 1:
            raise DatasetError("synthetic: homophily must be in [0, 1] and alpha > 1")
        if min(self.train, self.val, self.test) < 0 or self.train + self.val + self.test > 1:
            raise DatasetError("synthetic: train, val, test must be >= 0 and sum to <= 1")

    @property
    def name(self) -> str:
        return f"synthetic-{self.kind.value}-n{self.nodes}-e{self.edges}-s{self.seed}"


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def _parse_number(key: str, text: str, kind: type):
    m = re.fullmatch(r"([0-9.eE+-]+)([kKmMgGbB]?)", text.strip())
    try:
        value = float(m[1]) * _SUFFIX.get(m[2].lower(), 1) if m else None
    except ValueError:
        value = None
    if value is None or (kind is int and value != int(value)):
        raise DatasetError(f"synthetic: {key}={text!r} is not a valid {kind.__name__}")
    return kind(value)


def parse_spec(spec: str) -> SyntheticSpec:
    """`synthetic[:key=value,...]` -> SyntheticSpec; unknown keys are an error."""
    head, _, body = spec.partition(":")
    if head != "synthetic":
        raise DatasetError(f"{spec!r} is not a synthetic spec (synthetic:key=value,...)")
    fields = {f.name: f for f in dataclasses.fields(SyntheticSpec)}
    values = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, text = item.partition("=")
        if not eq or key not in fields:
            raise DatasetError(f"synthetic: unknown or malformed entry {item!r}; valid keys: "
                               f"{', '.join(fields)}")
        if key == "kind":
            try:
                values[key] = Kind(text)
            except ValueError:
                raise DatasetError(f"synthetic: kind={text!r}; choose one of "
                                   f"{[k.value for k in Kind]}") from None
        else:
            values[key] = _parse_number(key, text, type(fields[key].default))
    return SyntheticSpec(**values)


def generate(spec: SyntheticSpec | str) -> Graph:
    """The graph a spec describes (same spec, same graph)."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    rng = np.random.default_rng(spec.seed)
    n = spec.nodes
    label = rng.integers(spec.classes, size=n)
    if spec.kind is Kind.RMAT:
        scale = int(np.ceil(np.log2(n)))
        draw = lambda m: _same_class_sources(rng, *_rmat_edges(rng, m, scale, n), label,
                                             spec.classes, spec.homophily)
    else:
        if spec.kind is Kind.POWERLAW:
            weight = np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / (spec.alpha - 1.0))
            weight = weight[rng.permutation(n)]
        else:
            weight = np.ones(n)
        draw = lambda m: _block_edges(rng, m, weight, label, spec.classes, spec.homophily)
    src, dst = _simple_edges(rng, draw, spec.edges, n)
    if spec.kind is Kind.RMAT:
        # R-MAT puts the hubs at low ids; shuffle so that id order reveals nothing.
        perm = rng.permutation(n)          # old id -> new id
        src, dst = perm[src], perm[dst]
        label = label[np.argsort(perm)]    # label of new id

    node_data = {"label": label.astype(np.int64)}
    if spec.feat:
        centroids = rng.standard_normal((spec.classes, spec.feat)) * (
            spec.signal * np.sqrt(2.0 / spec.feat))
        noise = rng.standard_normal((n, spec.feat))
        node_data["feat"] = (centroids[label] + noise).astype(np.float32)
    order = rng.permutation(n)
    sizes = np.cumsum([0] + [int(round(f * n)) for f in (spec.train, spec.val, spec.test)])
    splits = {k: np.sort(order[sizes[i]:sizes[i + 1]])
              for i, k in enumerate(("train", "val", "test"))}
    return Graph.homogeneous(src, dst, n, name=spec.name, node_data=node_data, splits=splits)


def _simple_edges(rng, draw, num_edges: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw edges until `num_edges` distinct non-loop ones exist, then pick that many."""
    keys = np.zeros(0, np.int64)
    while keys.size < num_edges:
        src, dst = draw(int((num_edges - keys.size) * 1.2) + 16)
        keys = _sorted_unique(np.concatenate([keys, (src * n + dst)[src != dst]]))
    # A uniform choice among the distinct edges, so trimming favours no id range.
    keys = keys[np.sort(rng.choice(keys.size, num_edges, replace=False))]
    return keys // n, keys % n


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """np.unique by sorting (numpy's hash-based unique is several times slower here)."""
    a = np.sort(a)
    return a[np.concatenate([[True], a[1:] != a[:-1]])] if a.size else a


class _Sampler:
    """Draws indices with probability proportional to `weight`, vectorised.

    Inverse-CDF sampling with a guide table (the cutpoint method): the table gives,
    for each of K equal slices of the CDF, the first index that can fall in it, so a
    draw walks only a step or two from there instead of binary-searching all n.
    """

    def __init__(self, weight: np.ndarray):
        self.cdf = np.cumsum(weight, dtype=np.float64)
        self.total = self.cdf[-1]
        self.slices = 4 * weight.size
        self.guide = np.searchsorted(self.cdf, np.arange(self.slices) * (self.total / self.slices),
                                     side="right")

    def __call__(self, target: np.ndarray) -> np.ndarray:
        """For each target mass t in [0, total), the index i with cdf[i-1] <= t < cdf[i]."""
        target = np.minimum(target, np.nextafter(self.total, 0))
        slot = np.minimum((target * (self.slices / self.total)).astype(np.int64), self.slices - 1)
        idx = self.guide[slot]
        active = np.flatnonzero(self.cdf[idx] <= target)
        while active.size:   # walk forward the few draws not yet at their index
            idx[active] += 1
            active = active[self.cdf[idx[active]] <= target[active]]
        return idx


def _block_edges(rng, m: int, weight, label, classes: int, homophily: float):
    """Degree-corrected SBM: dst by weight; src of dst's class w.p. homophily."""
    anyone = _Sampler(weight)
    by_class = np.argsort(label, kind="stable")
    in_class = _Sampler(weight[by_class])
    class_mass = np.bincount(label, weights=weight, minlength=classes)
    class_start = np.cumsum(class_mass) - class_mass   # classes are in order in by_class
    dst = anyone(rng.random(m) * anyone.total)
    c = label[dst]
    same = by_class[in_class(class_start[c] + rng.random(m) * class_mass[c])]
    other = anyone(rng.random(m) * anyone.total)
    src = np.where(rng.random(m) < homophily, same, other)
    return src, dst


def _same_class_sources(rng, src, dst, label, classes: int, homophily: float):
    """With probability `homophily`, replace an edge's source by a uniformly chosen node
    of its destination's class (R-MAT itself carries no label signal)."""
    by_class = np.argsort(label, kind="stable")
    count = np.bincount(label, minlength=classes)
    start = np.cumsum(count) - count
    c = label[dst]
    same = by_class[start[c] + (rng.random(dst.size) * count[c]).astype(np.int64)]
    return np.where(rng.random(dst.size) < homophily, same, src), dst


def _rmat_edges(rng, m: int, scale: int, n: int, probs=(0.57, 0.19, 0.19, 0.05)):
    """R-MAT: each level picks a quadrant; ids >= n are dropped (the caller redraws)."""
    a, b, c, _ = probs
    src = np.zeros(m, np.int64)
    dst = np.zeros(m, np.int64)
    for _ in range(scale):
        r = rng.random(m, dtype=np.float32)
        src = (src << 1) | (r >= a + b)
        dst = (dst << 1) | (((r >= a) & (r < a + b)) | (r >= a + b + c))
    keep = (src < n) & (dst < n)
    return src[keep], dst[keep]
