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

`generate` builds the graph in memory; `generate_chunked` writes an rmat graph larger
than memory (2^26 nodes, 1B edges) straight to the chunked format, in O(nodes) memory.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import enum
import functools
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator

import numpy as np

import jgraph.segments as segments
from jgraph.data.chunked import ChunkedGraph, ChunkedWriter, check_chunked_out, open_chunked
from jgraph.data.graph import Graph
from jgraph.data.npz import DatasetError
from jgraph.progress import Progress


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
    sizes = segments.offsets([int(round(f * n)) for f in (spec.train, spec.val, spec.test)])
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
    class_start = segments.exclusive_sum(class_mass)   # classes are in order in by_class
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
    start = segments.exclusive_sum(count)
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


# -- an R-MAT graph larger than memory, written as a chunked directory ------------------
#
# `generate_chunked` gives the graph `generate` defines for kind rmat (R-MAT draws with
# the same homophily, the same rounds, a uniform trim; not the same bits) in O(nodes)
# memory plus bounded blocks:
#
# 1. Labels, the id permutation and the class lists are drawn whole: O(nodes).
# 2. Edges are drawn in blocks of _BLOCK, each from its own random stream (so threads
#    draw them in any order and the graph stays the same), already in shuffled ids, and
#    appended as keys dst << 32 | src to temporary bucket files by destination range.
# 3. Each bucket is sorted and deduplicated; while fewer than `edges` distinct edges
#    exist, a further round is drawn and merged in (the rounds of `_simple_edges`).
# 4. The trim keeps the `edges` distinct edges of smallest random priority (a uniform
#    choice, as `_simple_edges`' rng.choice), found by a histogram of the priorities;
#    the kept edges are written bucket by bucket, sorted by (dst, src).
# 5. Labels, features (one random stream per _ROW_BLOCK rows) and splits are written
#    in row chunks.

_BLOCK = 1 << 20           # edges per drawn block: one random stream each
_ROW_BLOCK = 1 << 16       # feature rows per random stream
_WORD_LEVELS = 7           # R-MAT levels drawn from one 64-bit word
_BUCKET_EDGES = 1 << 23    # drawn edges per bucket, sorted in memory (a few int64 copies)
_MIN_BUCKETS = 16
_PRIORITY_BINS = 16        # top bits of a priority that the trim's histogram counts


class _Stream(enum.IntEnum):
    """The purposes of `generate_chunked`'s random streams."""

    LABEL = 0
    PERM = 1
    EDGES = 2
    TRIM = 3
    CENTROIDS = 4
    FEAT = 5
    SPLITS = 6


def _rng(seed: int, stream: _Stream, *index: int) -> np.random.Generator:
    """The random stream of (seed, purpose, index): independent of every other, so each
    block draws alone, in any order and on any thread."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(stream), *index)))


def _alias_table(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table for probabilities `p` (summing to 1), by Vose's construction:
    a uniform slot i is kept with probability accept[i], else replaced by alias[i]."""
    k = p.size
    scaled = list(p * k)
    accept, alias = np.ones(k), np.arange(k)
    small = [i for i, x in enumerate(scaled) if x < 1]
    large = [i for i, x in enumerate(scaled) if x >= 1]
    while small and large:
        s, big = small.pop(), large[-1]
        accept[s], alias[s] = scaled[s], big
        scaled[big] -= 1 - scaled[s]
        if scaled[big] < 1:
            small.append(large.pop())
    return accept, alias


class _RmatWords:
    """R-MAT's quadrant choices, up to _WORD_LEVELS levels from one random 64-bit word.

    k levels choose one of 4^k outcomes, slot s * 2^k + d for k source bits s and k
    destination bits d, with probability the product of the levels' quadrant
    probabilities. A word's top 2k bits pick a slot, its other 64 - 2k bits keep the slot
    (below `threshold[slot]`) or take `alias[slot]`: every outcome's probability is exact
    to 2^-(64-2k) of a slot's 4^-k, finer than `_rmat_edges`' float32 draws, and a
    2^26-node edge takes 4 words instead of 26 floats (3.8x faster).
    """

    def __init__(self, scale: int, probs=(0.57, 0.19, 0.19, 0.05)):
        words = -(-scale // _WORD_LEVELS)
        self.levels = [scale // words + (i < scale % words) for i in range(words)]
        quadrant = np.asarray(probs, np.float64).reshape(2, 2)     # [src bit, dst bit]
        self.tables = {}
        for k in set(self.levels):
            accept, alias = _alias_table(functools.reduce(np.kron, [quadrant] * k).ravel())
            self.tables[k] = (np.round(accept * 2.0 ** (64 - 2 * k)).astype(np.uint64), alias)

    def __call__(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """int64[m] sources and destinations in [0, 2^scale)."""
        src, dst = np.zeros(m, np.int64), np.zeros(m, np.int64)
        for k in self.levels:
            threshold, alias = self.tables[k]
            word = rng.bit_generator.random_raw(m)
            slot = (word >> np.uint64(64 - 2 * k)).astype(np.int64)
            word &= np.uint64((1 << (64 - 2 * k)) - 1)
            slot = np.where(word < threshold[slot], slot, alias[slot])
            src <<= k
            src |= slot >> k
            dst <<= k
            dst |= slot & ((1 << k) - 1)
        return src, dst


class _EdgeDraws:
    """Draws blocks of R-MAT edges with the homophily of `generate`, in final (shuffled)
    ids, as keys grouped by bucket. Holds the O(nodes) arrays every block reads.

    label: int8/int32[n] of the final ids; perm: int32[n] R-MAT id -> final id; members:
    int32[n] final ids by class, class c at [start[c], start[c] + count[c]); bucket of an
    edge: dst >> shift, `buckets` of them."""

    def __init__(self, spec: SyntheticSpec, label: np.ndarray, perm: np.ndarray, shift: int):
        self.spec, self.n = spec, spec.nodes
        self.words = _RmatWords(int(np.ceil(np.log2(self.n))))
        self.label, self.perm, self.shift = label, perm, shift
        self.buckets = -(-self.n // (1 << shift))
        self.members = np.argsort(label, kind="stable").astype(np.int32)
        self.count = np.bincount(label, minlength=spec.classes)
        self.start = segments.exclusive_sum(self.count)

    def block(self, index: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Block `index` of m draws: (int64[k] keys dst << 32 | src of its non-loop edges,
        grouped by bucket; int64[buckets] keys per bucket)."""
        rng = _rng(self.spec.seed, _Stream.EDGES, index)
        src, dst = self.words(rng, m)
        keep = (src < self.n) & (dst < self.n)          # R-MAT ids >= n are dropped
        src, dst = self.perm[src[keep]], self.perm[dst[keep]]
        # `_same_class_sources` in final ids: a uniform node of the class is one in R-MAT
        # ids, renamed by the permutation.
        c = self.label[dst]
        same = self.members[self.start[c] + (rng.random(dst.size) * self.count[c]).astype(np.int64)]
        src = np.where(rng.random(dst.size) < self.spec.homophily, same, src)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        bucket = (dst >> self.shift).astype(np.uint16)
        order = np.argsort(bucket, kind="stable")       # a radix sort for 16-bit keys
        keys = ((dst.astype(np.int64) << 32) | src)[order]
        return keys, np.bincount(bucket, minlength=self.buckets)


class _Buckets:
    """Edge keys on disk, one file pair per destination range: `raw` keys appended as
    drawn, `unique` the sorted distinct keys that deduplication merged them into."""

    def __init__(self, root: str, count: int):
        self.root, self.count = root, count
        self.distinct = np.zeros(count, np.int64)

    def path(self, b: int, kind: str) -> str:
        return os.path.join(self.root, f"{kind}-{b:05d}.bin")

    def append(self, blocks: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        """Append each block's keys to their buckets' raw files."""
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(self.path(b, "raw"), "ab"))
                     for b in range(self.count)]
            for keys, per_bucket in blocks:
                bounds = segments.offsets(per_bucket)
                for b in np.flatnonzero(per_bucket):
                    keys[bounds[b]:bounds[b + 1]].tofile(files[b])

    def deduplicate(self, b: int) -> int:
        """Merge bucket b's raw keys into its unique ones; its distinct count."""
        raw = self.path(b, "raw")
        if not os.path.getsize(raw):
            os.remove(raw)
            return int(self.distinct[b])
        keys = np.fromfile(raw, np.int64)
        if self.distinct[b]:
            keys = np.concatenate([self.keys(b), keys])
        keys = np.sort(keys, kind="stable")     # merges the sorted unique keys as a run
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
        keys.tofile(self.path(b, "unique"))
        os.remove(raw)
        return keys.size

    def keys(self, b: int) -> np.ndarray:
        """int64[distinct[b]]: bucket b's sorted distinct keys."""
        if not self.distinct[b]:
            return np.zeros(0, np.int64)
        return np.fromfile(self.path(b, "unique"), np.int64)


def _priorities(seed: int, b: int, count: int) -> np.ndarray:
    """uint64[count]: the trim's random priorities of bucket b's distinct edges, in key
    order. The trim keeps the edges of smallest (priority, bucket, position)."""
    return _rng(seed, _Stream.TRIM, b).bit_generator.random_raw(count)


def _trim_cut(seed: int, distinct: np.ndarray, keep: int, workers: int):
    """(priority, bucket, position) of the `keep`-th smallest edge over all buckets (the
    last one kept), or None when every edge is kept. Two passes over the priorities,
    drawn again each time: a histogram of their top bits finds the bin holding the cut,
    then that bin's few edges are sorted."""
    total = int(distinct.sum())
    if keep >= total:
        return None
    if keep == 0:
        return 0, -1, 0                                 # below every edge
    low = 64 - _PRIORITY_BINS
    hist = lambda b: np.bincount((_priorities(seed, b, distinct[b]) >> np.uint64(low))
                                 .astype(np.int64), minlength=1 << _PRIORITY_BINS)
    with _ordered_map(hist, range(distinct.size), workers) as hists:
        counts = np.cumsum(sum(hists))
    at = int(np.searchsorted(counts, keep))             # the bin of the keep-th edge
    rank = keep - (int(counts[at - 1]) if at else 0)    # its rank within the bin

    def in_bin(b: int):
        p = _priorities(seed, b, distinct[b])
        j = np.flatnonzero((p >> np.uint64(low)) == at)
        return p[j], np.full(j.size, b), j
    with _ordered_map(in_bin, range(distinct.size), workers) as found:
        p, b, j = (np.concatenate(x) for x in zip(*found))
    last = np.lexsort((j, b, p))[rank - 1]
    return int(p[last]), int(b[last]), int(j[last])


def _kept(priority: np.ndarray, b: int, cut) -> np.ndarray:
    """bool mask of bucket b's edges at or below the cut."""
    if cut is None:
        return np.ones(priority.size, bool)
    p, cut_b, cut_j = cut
    kept = priority < np.uint64(p)
    if b < cut_b:
        kept |= priority == np.uint64(p)
    elif b == cut_b:
        equal = np.flatnonzero(priority == np.uint64(p))
        kept[equal[equal <= cut_j]] = True
    return kept


@contextlib.contextmanager
def _ordered_map(fn, items: Iterable, workers: int) -> Iterator[Iterator]:
    """A context giving fn over items on `workers` threads, results in order, at most
    2 * workers in flight (bounded memory; numpy releases the GIL in the large array
    operations). Leaving the context, by an error too, cancels what has not started and
    waits for what has: no thread still writes into a directory about to be deleted."""
    pending: collections.deque = collections.deque()

    def results(pool) -> Iterator:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        try:
            yield results(pool)
        finally:
            for future in pending:
                future.cancel()


def _rechunk(pieces: Iterable[np.ndarray], size: int) -> Iterator[np.ndarray]:
    """The arrays of `pieces` laid end to end, cut into arrays of `size` (the last one
    shorter)."""
    held, count = [], 0
    for piece in pieces:
        held.append(piece)
        count += piece.size
        if count >= size:
            whole = np.concatenate(held)
            cut = count - count % size
            yield from (whole[a:a + size] for a in range(0, cut, size))
            held, count = [whole[cut:]], count - cut
    if count:
        yield np.concatenate(held)


def _noted(items: Iterable, total: int, what: str, note) -> Iterator:
    """`items`, calling note(f"{what} {i}/{total}") at every tenth of `total` done."""
    for i, item in enumerate(items, 1):
        yield item
        if i * 10 // total > (i - 1) * 10 // total:
            note(f"{what} {i:,}/{total:,}")


def _check_disk(out: str, tmp: str, temp_bytes: int, out_bytes: int) -> None:
    """A DatasetError naming the directory if its file system lacks the space."""
    def existing(path):
        while not os.path.exists(path):
            path = os.path.dirname(path)
        return path
    out_dir, tmp_dir = existing(os.path.dirname(out)), existing(tmp)
    need = {out_dir: out_bytes}
    if os.stat(out_dir).st_dev == os.stat(tmp_dir).st_dev:
        need[out_dir] += temp_bytes
    else:
        need[tmp_dir] = temp_bytes
    for path, nbytes in need.items():
        free = shutil.disk_usage(path).free
        if free < nbytes:
            raise DatasetError(
                f"{path}: {free / 2**30:.1f} GiB free, generating needs about "
                f"{nbytes / 2**30:.1f} GiB there (output {out_bytes / 2**30:.1f} GiB, "
                f"temporary {temp_bytes / 2**30:.1f} GiB); free space or pass another "
                f"output or temporary directory")


def generate_chunked(spec: SyntheticSpec | str, out: str | os.PathLike, *,
                     edges_per_chunk: int = 1 << 24, rows_per_chunk: int = 1 << 20,
                     tmp_dir: str | os.PathLike | None = None, overwrite: bool = False,
                     progress: Progress | None = None) -> ChunkedGraph:
    """The rmat graph a spec describes, written to the chunked directory `out` in memory
    O(nodes): the graph that `generate` defines (not the same bits) and, like it, a
    function of the spec alone, whatever the chunk sizes. Edges are sorted by (dst, src).

    Temporary files (8 bytes per drawn edge: 1.2x the edges) go to a new directory in
    `tmp_dir` (default: beside `out`), removed at the end; `out` appears only once
    complete. 2^26 nodes and 1B edges: see experiments/make_rmat.py."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    if spec.kind is not Kind.RMAT:
        raise DatasetError(f"synthetic: generate_chunked draws kind=rmat graphs, not "
                           f"kind={spec.kind.value}; use generate and save_chunked")
    if spec.nodes > 2**31:
        raise DatasetError(f"synthetic: generate_chunked takes up to 2^31 nodes (int32 ids), "
                           f"not nodes={spec.nodes}")
    progress = progress or Progress(enabled=False)
    out = os.path.realpath(os.fspath(out))
    check_chunked_out(out, overwrite)
    start = time.perf_counter()
    note = lambda what: progress.note(f"{what} ({time.perf_counter() - start:.0f} s)")
    n, num_edges = spec.nodes, spec.edges
    first = int(num_edges * 1.2) + 16                   # the first round of `_simple_edges`
    split_rows = sum(int(round(f * n)) for f in (spec.train, spec.val, spec.test))
    out_bytes = 4 * (2 * num_edges + split_rows) + n * (8 + 4 * spec.feat)
    tmp_parent = os.fspath(tmp_dir) if tmp_dir is not None else os.path.dirname(out)
    _check_disk(out, tmp_parent, 8 * first + 16 * _BUCKET_EDGES, out_bytes)
    workers = min(os.cpu_count() or 1, 8)

    os.makedirs(tmp_parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{os.path.basename(out)}.tmp-", dir=tmp_parent)
    try:
        with progress.phase(f"labels and id permutation of {n:,} nodes"):
            label = _rng(spec.seed, _Stream.LABEL).integers(
                spec.classes, size=n, dtype=np.int8 if spec.classes <= 128 else np.int32)
            perm = np.arange(n, dtype=np.int32)         # R-MAT id -> final id
            _rng(spec.seed, _Stream.PERM).shuffle(perm)
            # Buckets of 2^shift destinations, each about _BUCKET_EDGES drawn edges.
            buckets = min(max(_MIN_BUCKETS, -(-first // _BUCKET_EDGES)), 1 << 15)
            draws = _EdgeDraws(spec, label, perm, shift=max(0, int(np.log2(n / buckets))))
        buckets = _Buckets(tmp, draws.buckets)
        _draw_distinct(draws, buckets, first, workers, progress, note)
        distinct, draws, perm = int(buckets.distinct.sum()), None, None
        with progress.phase(f"trim {distinct:,} distinct edges to {num_edges:,}"):
            cut = _trim_cut(spec.seed, buckets.distinct, num_edges, workers)

        with ChunkedWriter(out, n, name=spec.name, overwrite=overwrite) as writer:
            with progress.phase(f"write {num_edges:,} edges"):
                def kept(b: int) -> np.ndarray:
                    keys = buckets.keys(b)
                    return keys[_kept(_priorities(spec.seed, b, keys.size), b, cut)]
                with _ordered_map(kept, range(buckets.count), workers) as kept_keys:
                    chunks = _rechunk(kept_keys, edges_per_chunk)
                    for keys in _noted(chunks, -(-num_edges // edges_per_chunk),
                                       "edge chunks written", note):
                        writer.add_edges((keys & 0xFFFFFFFF).astype(np.int32),
                                         (keys >> 32).astype(np.int32))
            shutil.rmtree(tmp)                          # its space, before the features'
            with progress.phase(f"write labels and {spec.feat} features"):
                _write_node_data(writer, spec, label, rows_per_chunk)
            with progress.phase("write splits"):
                _write_splits(writer, spec, rows_per_chunk)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    note(f"{out}: {n:,} nodes, {num_edges:,} edges")
    return open_chunked(out)


def _draw_distinct(draws: _EdgeDraws, buckets: _Buckets, first: int, workers: int,
                   progress: Progress, note) -> None:
    """Draw rounds of edges into the buckets until `spec.edges` distinct ones exist: the
    rounds of `_simple_edges`, `first` draws then 1.2x the shortfall (+16)."""
    blocks, rounds, m = 0, 0, first
    while True:
        rounds += 1
        sizes = [_BLOCK] * (m // _BLOCK) + [m % _BLOCK] * bool(m % _BLOCK)
        with progress.phase(f"draw round {rounds}: {m:,} edges in {len(sizes):,} blocks "
                            f"into {buckets.count} buckets"):
            jobs = zip(range(blocks, blocks + len(sizes)), sizes)
            with _ordered_map(lambda job: draws.block(*job), jobs, workers) as drawn:
                buckets.append(_noted(drawn, len(sizes), "blocks drawn", note))
            blocks += len(sizes)
        with (progress.phase(f"deduplicate {buckets.count} buckets"),
              _ordered_map(buckets.deduplicate, range(buckets.count), workers) as counts):
            buckets.distinct[:] = list(_noted(counts, buckets.count, "buckets deduplicated",
                                              note))
        distinct = int(buckets.distinct.sum())
        progress.note(f"{distinct:,} distinct edges after round {rounds}")
        if distinct >= draws.spec.edges:
            return
        m = int((draws.spec.edges - distinct) * 1.2) + 16


def _write_node_data(writer: ChunkedWriter, spec: SyntheticSpec, label: np.ndarray,
                     rows_per_chunk: int) -> None:
    """Labels (int64) and features (a class centroid plus unit noise, as `generate`)."""
    n = spec.nodes
    centroids = _rng(spec.seed, _Stream.CENTROIDS).standard_normal((spec.classes, spec.feat))
    centroids = (centroids * (spec.signal * np.sqrt(2.0 / max(spec.feat, 1)))).astype(np.float32)
    for a in range(0, n, rows_per_chunk):
        b = min(a + rows_per_chunk, n)
        writer.add_node_data("label", label[a:b].astype(np.int64))
        if spec.feat:
            first = a // _ROW_BLOCK
            noise = np.concatenate([
                _rng(spec.seed, _Stream.FEAT, j).standard_normal(
                    (min(_ROW_BLOCK, n - j * _ROW_BLOCK), spec.feat), dtype=np.float32)
                for j in range(first, -(-b // _ROW_BLOCK))])
            offset = a - first * _ROW_BLOCK
            writer.add_node_data("feat", centroids[label[a:b]] + noise[offset:offset + b - a])


def _write_splits(writer: ChunkedWriter, spec: SyntheticSpec, rows_per_chunk: int) -> None:
    """train, val, test: consecutive runs of a random permutation, as `generate`."""
    n = spec.nodes
    order = np.arange(n, dtype=np.int32)
    _rng(spec.seed, _Stream.SPLITS).shuffle(order)
    sizes = segments.offsets([int(round(f * n)) for f in (spec.train, spec.val, spec.test)])
    for i, name in enumerate(("train", "val", "test")):
        members = np.sort(order[sizes[i]:sizes[i + 1]])
        for a in range(0, max(members.size, 1), rows_per_chunk):
            writer.add_split(name, members[a:a + rows_per_chunk])
