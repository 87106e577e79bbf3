"""R-MAT graphs written straight to the chunked format (`generate_chunked`): a simple graph
with exactly the edges asked, the node data and splits of `generate`, its homophily and
degree distribution, the same files for the same seed whatever the chunk sizes, further
rounds when the first falls short, R-MAT's exact probabilities from the packed draws, and
nothing left behind, temporary or at `out`, by an error."""
from __future__ import annotations

import collections
import io
import os
from pathlib import Path

import numpy as np
import pytest

import jgraph.data.synthetic as synthetic
from jgraph.data import DEFAULT_NTYPE, DatasetError, generate, generate_chunked, open_chunked
from jgraph.progress import Progress

N = DEFAULT_NTYPE
SPEC = "synthetic:nodes=4096,edges=30000,kind=rmat,feat=8,classes=10"
SMALL_CHUNKS = dict(edges_per_chunk=7000, rows_per_chunk=1000)


def _edges(path) -> tuple[np.ndarray, np.ndarray]:
    chunks = list(open_chunked(path).edge_chunks())
    return np.concatenate([c.src for c in chunks]), np.concatenate([c.dst for c in chunks])


def _keys(path) -> np.ndarray:
    src, dst = _edges(path)
    return dst * open_chunked(path).total_nodes + src


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def rmat(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rmat") / "graph"
    generate_chunked(SPEC, out, **SMALL_CHUNKS)
    return out


def test_the_graph_is_simple_with_exactly_the_edges_asked_in_several_chunks(rmat):
    graph = open_chunked(rmat)
    assert graph.total_nodes == 4096 and graph.num_edges == 30000
    assert graph.num_edge_chunks == 5 and graph.edges["src"].rows[:4] == (7000,) * 4
    src, dst = _edges(rmat)
    assert src.min() >= 0 and dst.min() >= 0 and max(src.max(), dst.max()) < 4096
    assert not (src == dst).any()
    assert (np.diff(_keys(rmat)) > 0).all()     # unique, and sorted by (dst, src) as documented


def test_node_data_and_splits_are_those_of_generate_in_kind_and_size(rmat):
    graph = open_chunked(rmat)
    reference = generate(SPEC)
    loaded = graph.to_graph()
    for name, values in reference.node_data[N].items():
        assert loaded.node_data[N][name].dtype == values.dtype
        assert loaded.node_data[N][name].shape == values.shape
    assert len(graph.node_data[N]["feat"].files) == 5          # rows in chunks of 1000
    label = loaded.node_data[N]["label"]
    assert label.min() >= 0 and label.max() < 10
    assert np.bincount(label).min() > 4096 / 10 * 0.7          # every class well filled
    splits = {k: graph.split(N, k) for k in ("train", "val", "test")}
    assert {k: v.size for k, v in splits.items()} == {
        k: v.size for k, v in reference.splits[N].items()}
    assert np.unique(np.concatenate(list(splits.values()))).size == sum(
        v.size for v in splits.values())


def _homophily(path) -> float:
    src, dst = _edges(path)
    label = open_chunked(path).node_rows(N, "label")
    return float(np.mean(label[src] == label[dst]))


def _in_degree_moment(src, dst, n) -> float:
    """sum of squared in-degrees / edges: large for R-MAT's skewed in-degrees."""
    return float((np.bincount(dst, minlength=n).astype(np.float64) ** 2).sum() / dst.size)


def test_homophily_and_degrees_follow_the_spec_as_generate_does(rmat, tmp_path):
    # An edge's ends share a label when its source was redrawn from the destination's
    # class (probability 0.7) or by chance (0.3 / 10); 30k edges give a standard error
    # of 0.003, and `generate` lands 0.01 below 0.73 too (deduplication).
    assert abs(_homophily(rmat) - (0.7 + 0.3 / 10)) < 0.05
    generate_chunked(SPEC + ",homophily=0", tmp_path / "h0")
    assert abs(_homophily(tmp_path / "h0") - 0.1) < 0.03
    reference = generate(SPEC)
    src, dst = reference.edges[next(iter(reference.edges))]
    ours, theirs = _in_degree_moment(*_edges(rmat), 4096), _in_degree_moment(src, dst, 4096)
    assert abs(ours / theirs - 1) < 0.1 and theirs > 5 * 30000 / 4096


def test_the_same_seed_gives_the_same_files_whatever_the_chunk_sizes(rmat, tmp_path):
    generate_chunked(SPEC, tmp_path / "again", **SMALL_CHUNKS)
    assert _files(tmp_path / "again") == _files(rmat)
    generate_chunked(SPEC, tmp_path / "whole")                     # one chunk of each
    a, b = open_chunked(rmat).to_graph(), open_chunked(tmp_path / "whole").to_graph()
    assert open_chunked(tmp_path / "whole").num_edge_chunks == 1
    for x, y in ((a.edges, b.edges), (a.node_data[N], b.node_data[N]),
                 (a.splits[N], b.splits[N])):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    generate_chunked(SPEC + ",seed=1", tmp_path / "seed1")    # ids shuffled differently:
    assert np.intersect1d(_keys(tmp_path / "seed1"), _keys(rmat)).size < 1000    # ~55 shared


def test_when_the_first_round_falls_short_more_rounds_are_drawn(tmp_path):
    # 1024 nodes, 20000 edges: R-MAT's skew repeats its likely edges, so its 24016 first
    # draws give 16355 distinct ones; 8 rounds reach 20000, merged into the buckets.
    log = io.StringIO()
    generate_chunked("synthetic:nodes=1024,edges=20000,kind=rmat,feat=0", tmp_path / "dense",
                     progress=Progress(stream=log))
    assert "16,355 distinct edges after round 1" in log.getvalue()
    assert "after round 3" in log.getvalue()
    src, dst = _edges(tmp_path / "dense")
    assert src.size == 20000 and not (src == dst).any()
    assert np.unique(_keys(tmp_path / "dense")).size == 20000
    assert "feat" not in open_chunked(tmp_path / "dense").node_data[N]


def _quadrant_probability(src, dst, levels: int, probs=(0.57, 0.19, 0.19, 0.05)):
    """The exact R-MAT probability of each (src, dst) of `levels` bits."""
    p = np.ones(src.shape)
    for bit in range(levels):
        p *= np.asarray(probs)[2 * ((src >> bit) & 1) + ((dst >> bit) & 1)]
    return p


@pytest.mark.parametrize("scale", [5, 9])           # one word; two words of 5 and 4 levels
def test_packed_rmat_draws_give_rmats_exact_probabilities(scale):
    words = synthetic._RmatWords(scale)
    assert sum(words.levels) == scale
    m = 1 << 21
    src, dst = words(np.random.default_rng(0), m)
    assert src.max() < 2**scale and dst.max() < 2**scale
    if scale == 5:          # every outcome: a chi-square test (1023 degrees of freedom)
        s, d = np.divmod(np.arange(1 << 10), 32)
        expected = _quadrant_probability(s, d, 5) * m
        observed = np.bincount(src * 32 + dst, minlength=1 << 10)
        assert ((observed - expected) ** 2 / expected).sum() < 1023 + 10 * np.sqrt(2 * 1023)
    # each level's quadrant frequencies, within 6 standard errors
    for bit in range(scale):
        q = np.bincount(2 * ((src >> bit) & 1) + ((dst >> bit) & 1), minlength=4) / m
        assert np.abs(q - [0.57, 0.19, 0.19, 0.05]).max() < 6 * np.sqrt(0.25 / m)


def test_temporary_files_go_to_tmp_dir_and_are_removed(tmp_path):
    scratch = tmp_path / "scratch"
    generate_chunked(SPEC, tmp_path / "out", tmp_dir=scratch)
    assert scratch.is_dir() and not os.listdir(scratch)
    assert sorted(os.listdir(tmp_path)) == ["out", "scratch"]


class _FailingProgress(Progress):
    """Raises on the first note that contains `when`."""

    def __init__(self, when: str):
        super().__init__(enabled=False)
        self.when = when

    def note(self, message: str):
        if self.when in message:
            raise RuntimeError(f"interrupted at {message!r}")


@pytest.mark.parametrize("when", ["blocks drawn", "buckets deduplicated",
                                  "edge chunks written 2/"])
def test_an_error_midway_leaves_nothing_at_out_nor_temporary_files(when, tmp_path):
    with pytest.raises(RuntimeError, match="interrupted"):
        generate_chunked(SPEC, tmp_path / "out", tmp_dir=tmp_path / "scratch",
                         progress=_FailingProgress(when), **SMALL_CHUNKS)
    assert sorted(os.listdir(tmp_path)) == ["scratch"]
    assert not os.listdir(tmp_path / "scratch")


def test_too_little_disk_space_is_refused_naming_the_directory(tmp_path, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(synthetic.shutil, "disk_usage", lambda path: usage(10**6, 10**6, 1000))
    with pytest.raises(DatasetError, match=f"{tmp_path}: 0.0 GiB free, generating needs"):
        generate_chunked(SPEC, tmp_path / "out")
    assert not os.listdir(tmp_path)


def test_other_kinds_and_an_occupied_out_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="draws kind=rmat graphs, not kind=powerlaw"):
        generate_chunked("synthetic:nodes=100,edges=300", tmp_path / "out")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="is not empty and is not a chunked graph"):
        generate_chunked(SPEC, tmp_path / "taken")
    assert sorted(os.listdir(tmp_path)) == ["taken"]
