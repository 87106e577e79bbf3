"""Nothing wrong in a partition directory is accepted: every tampered file fails
`jgraph info --check` (and, where a training step relies on it, opening the partition)
in one line naming the file and the value; a killed write never leaves a half
directory behind; bad partitioning requests are refused."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from jgraph.cli.main import main
from jgraph.data import Graph, SparseRows
from jgraph.partition import PartitionError, PartitionFormatError, open_partitions, partition_graph
from jgraph.partition.build import OutputExistsError
from jgraph.partition.store import ArraySpec

PAPERS, AUTHORS = 120, 80
WORDS = 30                      # width of the papers' sparse node data
N = PAPERS + AUTHORS


def tiny_graph() -> Graph:
    """Two node types, two relations, float and integer node and edge data, splits."""
    rng = np.random.default_rng(0)
    cites = rng.integers(0, PAPERS, size=(2, 600))
    writes = np.stack([rng.integers(0, AUTHORS, 300), rng.integers(0, PAPERS, 300)])
    edges = {("paper", "cites", "paper"): cites, ("author", "writes", "paper"): writes}
    return Graph(
        name="tiny", num_nodes={"paper": PAPERS, "author": AUTHORS}, edges=edges,
        node_data={"paper": {"feat": rng.standard_normal((PAPERS, 4)).astype(np.float32),
                             "label": rng.integers(0, 5, PAPERS),
                             "words": SparseRows.from_dense(
                                 (rng.random((PAPERS, WORDS)) < 0.1).astype(np.float32))},
                   "author": {"feat": rng.standard_normal((AUTHORS, 4)).astype(np.float32)}},
        edge_data={rel: {"weight": rng.random(e.shape[1]).astype(np.float32),
                         "kind": rng.integers(0, 3, e.shape[1])} for rel, e in edges.items()},
        splits={"paper": {"train": np.arange(0, PAPERS, 3), "val": np.arange(1, PAPERS, 3)}})


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("integrity") / "p"
    partition_graph(tiny_graph(), 3, "random", out)
    return out


@pytest.fixture
def parts(written, tmp_path):
    """A fresh copy of the module's partition directory, to tamper with."""
    shutil.copytree(written, tmp_path / "p")
    return tmp_path / "p"


def info(capsys, *args) -> tuple[int, str, str]:
    rc = main(["info", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, pattern):
    """Exit status 2 and one error line, last (`partition` reports progress before it)."""
    assert rc == 2, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert re.search(pattern, err.splitlines()[-1]), err


def edit(path, change):
    """Change a .npy file in place, keeping its dtype and shape."""
    a = np.load(path)
    change(a)
    np.save(path, a)


def test_valid_partition_passes_every_check(parts, capsys):
    rc, out, err = info(capsys, parts, "--check")
    assert rc == 0, err
    assert "all partition files checked in" in out
    rc, out, _ = info(capsys, parts, "--check", "--json")
    assert rc == 0 and json.loads(out)["num_parts"] == 3


def _swap_first_sorted_pair(d):
    """Swap two in-edges of one node that are in (relation, source) order."""
    indptr = np.load(d / "indptr.npy")
    etype, src = np.load(d / "etype.npy"), np.load(d / "indices.npy")
    node = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    i = int(np.flatnonzero((node[1:] == node[:-1]) & ((etype[1:] > etype[:-1]) | (
        (etype[1:] == etype[:-1]) & (src[1:] > src[:-1]))))[0])
    for name, a in (("etype", etype), ("indices", src)):
        a[[i, i + 1]] = a[[i + 1, i]]
        np.save(d / f"{name}.npy", a)
    return i


def _tamper(parts, case) -> str:
    """Apply one kind of damage; returns the regex the error must match."""
    p1 = parts / "part-1"
    if case == "source id out of range":
        edit(p1 / "indices.npy", lambda a: a.__setitem__(17, N + 5))
        return rf"part-1/indices.npy: entry 17 is {N + 5}; source node ids are in \[0, {N}\)"
    if case == "indptr decreases":
        def dip(a):
            a[a.size // 2] = a[a.size // 2 + 1] + 1
        edit(p1 / "indptr.npy", dip)
        return r"part-1/indptr.npy: entry \d+ is \d+ after \d+ at entry \d+; CSC offsets"
    if case == "label outside recorded range":
        edit(p1 / "node" / "paper" / "label.npy", lambda a: a.__setitem__(3, 99))
        return r"part-1/node/paper/label.npy: entry 3 is 99; meta.json records the range \[0, 4\]"
    if case == "node_map not a permutation":
        edit(parts / "node_map.npy", lambda a: a.__setitem__(5, a[3]))
        return r"/node_map.npy: entry 5 is \d+, but .*node_map_inv.npy maps \d+ to 3"
    if case == "meta num_edges":
        meta = json.loads((parts / "meta.json").read_text())
        meta["num_edges"] += 1
        (parts / "meta.json").write_text(json.dumps(meta))
        return r"meta.json: num_edges_per_relation sums to 900, num_edges is 901"
    if case == "relation out of range":
        edit(p1 / "etype.npy", lambda a: a.__setitem__(0, 2))
        return r"part-1/etype.npy: entry 0 is 2; relations are in \[0, 2\)"
    if case == "halo":
        edit(p1 / "halo.npy", lambda a: a.__setitem__(0, a[1]))
        return r"part-1/halo.npy: entry 0 is \d+, expected \d+"
    if case == "meta halo by owner":
        meta = json.loads((parts / "meta.json").read_text())
        meta["parts"][1]["halo_by_owner"][0] += 1
        (parts / "meta.json").write_text(json.dumps(meta))
        return r"meta.json: parts\[1\].halo_by_owner is \[\d+, 0, \d+\], but part 1's halo.npy"
    if case == "in-edge order":
        i = _swap_first_sorted_pair(p1)
        return rf"part-1/indices.npy: in-edges {i} and {i + 1} of node \d+ are out of order"
    if case == "edge stored twice":
        edit(p1 / "edge_ids.npy", lambda a: a.__setitem__(1, a[0]))
        return r"part-1/edge_ids.npy: entry 1 is \d+, an edge stored before"
    if case == "split id of another type":
        book = open_partitions(parts).book
        author = int(book.ntype_offsets[1, 1])                  # part 1's first author
        edit(p1 / "split" / "paper" / "train.npy", lambda a: a.__setitem__(-1, author))
        return (rf"part-1/split/paper/train.npy: entry \d+ is {author}; part 1's nodes of "
                rf"type 'paper'")
    if case == "nan feature":
        edit(p1 / "node" / "author" / "feat.npy", lambda a: a.__setitem__((2, 1), np.nan))
        return r"part-1/node/author/feat.npy: entry \[2, 1\] is nan; float data must be finite"
    if case == "sparse column outside the width":
        edit(p1 / "node" / "paper" / "words" / "indices.npy",
             lambda a: a.__setitem__((2, 0), WORDS))
        return (rf"part-1/node/paper/words/indices.npy: entry \[2, 0\] is {WORDS}; sparse "
                rf"rows of width {WORDS} hold columns \[0, {WORDS}\)")
    if case == "nan in sparse values":
        edit(p1 / "node" / "paper" / "words" / "values.npy",
             lambda a: a.__setitem__((4, 0), np.nan))
        return r"part-1/node/paper/words/values.npy: entry \[4, 0\] is nan; float data"
    if case == "edge data outside recorded range":
        edit(p1 / "edge" / "kind.npy", lambda a: a.__setitem__(4, 7))
        return r"part-1/edge/kind.npy: entry 4 is 7; meta.json records the range \[0, 2\]"
    if case == "string labels":
        count = np.load(p1 / "node" / "paper" / "label.npy").size
        np.save(p1 / "node" / "paper" / "label.npy", np.array(["x"] * count))
        return r"part-1/node/paper/label.npy: dtype <U1 cannot be read"
    raise AssertionError(case)


CASES = ["source id out of range", "indptr decreases", "label outside recorded range",
         "node_map not a permutation", "meta num_edges", "relation out of range", "halo",
         "meta halo by owner",
         "in-edge order", "edge stored twice", "split id of another type", "nan feature",
         "edge data outside recorded range", "string labels", "sparse column outside the width",
         "nan in sparse values"]


def test_sparse_node_data_is_stored_as_index_and_value_rows_of_each_parts_nodes(written):
    pg = open_partitions(written)
    words = tiny_graph().node_data["paper"]["words"]
    assert pg.meta.node_data["paper"]["words"] == ArraySpec("float32", (WORDS,),
                                                           sparse=words.nnz_per_row)
    orig = pg.node_map()
    for k in range(pg.num_parts):
        part = pg.part(k)
        got = part.node_data["paper"]["words"]
        assert isinstance(got, SparseRows) and got.width == WORDS
        lo, hi = (int(x) for x in pg.book.ntype_offsets[k, :2])
        assert not os.path.exists(pg.array_path(k, "node", "paper", "words"))
        np.testing.assert_array_equal(got.toarray(), words.toarray()[orig[lo:hi]])


@pytest.mark.parametrize("case", CASES)
def test_info_check_names_the_damaged_file_and_value(parts, capsys, case):
    pattern = _tamper(parts, case)
    assert_one_line_error(*info(capsys, parts, "--check")[::2], pattern)


# What a training step relies on fails when the partition is opened, not only in --check.
OPEN_CASES = ["source id out of range", "indptr decreases", "label outside recorded range",
              "relation out of range", "split id of another type",
              "sparse column outside the width"]


@pytest.mark.parametrize("case", OPEN_CASES)
def test_open_time_check_of_a_part_catches_what_a_step_relies_on(parts, case):
    pattern = _tamper(parts, case)
    with pytest.raises(PartitionFormatError, match=pattern):
        open_partitions(parts).check_part(1)


def test_dist_graph_refuses_a_corrupt_local_part(parts):
    from jgraph.mesh import first_devices
    from jgraph.sharded import DistGraph, make_mesh
    pattern = _tamper(parts, "source id out of range")
    with pytest.raises(PartitionFormatError, match=pattern):
        DistGraph(parts, make_mesh(None, first_devices(3)))


@pytest.mark.parametrize("missing", ["node_map.npy", "part-2/split/paper/val.npy",
                                     "part-0/edge/weight.npy",
                                     "part-1/node/paper/words/values.npy"])
def test_plain_info_names_a_missing_file(parts, capsys, missing):
    os.remove(parts / missing)
    assert_one_line_error(*info(capsys, parts)[::2], rf"{missing}: missing")
    if missing == "node_map.npy":
        with pytest.raises(PartitionFormatError, match="node_map.npy: missing"):
            open_partitions(parts).node_map()


def test_unreadable_dtype_in_meta_is_named(parts, capsys):
    meta = json.loads((parts / "meta.json").read_text())
    meta["node_data"]["paper"]["label"]["dtype"] = "str160"
    (parts / "meta.json").write_text(json.dumps(meta))
    assert_one_line_error(*info(capsys, parts)[::2],
                          r"meta.json: node data paper.label: dtype 'str160' cannot be read")


def test_directory_without_recorded_ranges_still_opens_and_checks(parts):
    """Format 1 written before value ranges were recorded: no range to hold labels to."""
    meta = json.loads((parts / "meta.json").read_text())
    for spec in [*meta["node_data"]["paper"].values(), *meta["edge_data"].values()]:
        spec.pop("min", None), spec.pop("max", None)
    (parts / "meta.json").write_text(json.dumps(meta))
    open_partitions(parts).check()


# -- writing: atomic, refusals in library terms -------------------------------------------

# Partitions a graph into argv[1] and SIGKILLs itself right after the argv[2]-th phase
# of the partition job is recorded.
KILLED_WRITER = """
import os, signal, sys
from jgraph.data import load_dataset
from jgraph.partition import build, work

finish = work.Work.finish

def finish_then_die(self, *args, **kwargs):
    finish(self, *args, **kwargs)
    if len(self.state["phases"]) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

work.Work.finish = finish_then_die
build.partition_graph(load_dataset("synthetic:nodes=3000,edges=20000,feat=8"), 3, "random",
                      sys.argv[1], overwrite=True)
"""


def kill_mid_write(out, after_phases=5):
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out), str(after_phases)],
                          check=False, capture_output=True, text=True, cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def leftovers(out):
    """What a write to `out` left beside it: its work directory, its scratch folders."""
    return sorted(p.name for p in out.parent.iterdir()
                  if p.name.startswith((out.name + ".", f".{out.name}.")))


def test_a_scratch_folder_is_cleared_only_where_its_writer_is_gone(tmp_path):
    from jgraph.atomic import scratch_beside, writer
    host = writer().rpartition("-")[0]
    dead = tmp_path / f".a.source-{host}-{2**22 + 1}.x1"         # no such process
    alive = tmp_path / f".a.source-{writer()}.x2"                  # this process
    other_host = tmp_path / ".a.source-elsewhere-1.x3"
    other_output = tmp_path / f".a.source-b.source-{host}-{2**22 + 1}.x4"   # of `a.source-b`
    for folder in (dead, alive, other_host, other_output):
        folder.mkdir()
    with scratch_beside(str(tmp_path / "a"), "source") as scratch:
        assert os.path.basename(scratch).startswith(f".a.source-{writer()}.")
        kept = sorted(p.name for p in tmp_path.iterdir())
    assert dead.name not in kept
    assert {alive.name, other_host.name, other_output.name} <= set(kept)
    assert not os.path.exists(scratch)


@pytest.fixture(scope="module")
def synthetic():
    from jgraph.data import load_dataset
    return load_dataset("synthetic:nodes=3000,edges=20000,feat=8")


@pytest.mark.slow       # a killed writer in a process of its own, each
def test_killed_write_leaves_nothing_at_out_and_the_next_write_succeeds(tmp_path, synthetic):
    out = tmp_path / "p"
    kill_mid_write(out)
    assert not out.exists()                     # a reader finds nothing, not half a directory
    assert "p.work" in leftovers(out)
    assert any(name.startswith(".p.source-") for name in leftovers(out))
    partition_graph(synthetic, 3, "random", out)
    assert leftovers(out) == []
    open_partitions(out).check()


@pytest.mark.slow
def test_killed_overwrite_keeps_the_old_partition(tmp_path, synthetic):
    out = tmp_path / "p"
    partition_graph(synthetic, 2, "random", out)
    kill_mid_write(out)
    assert open_partitions(out).num_parts == 2  # the old directory, whole
    open_partitions(out).check()
    partition_graph(synthetic, 3, "random", out, overwrite=True)
    assert open_partitions(out).num_parts == 3 and leftovers(out) == []


def test_failed_write_removes_its_staging_directory(tmp_path, synthetic, monkeypatch):
    from jgraph.partition import chunked
    written = []

    class FullDisk(chunked.NpyAppender):          # the disk fills at the second write
        def append(self, values, at=None):
            written.append(self.path)
            if len(written) == 2:
                raise OSError(28, "No space left on device", self.path)
            super().append(values, at)
    monkeypatch.setattr(chunked, "NpyAppender", FullDisk)
    with pytest.raises(OSError):
        partition_graph(synthetic, 3, "random", tmp_path / "p")
    assert not (tmp_path / "p").exists() and leftovers(tmp_path / "p") == []


def test_overwrite_replaces_an_incomplete_directory_of_an_older_jgraph(tmp_path, synthetic):
    out = tmp_path / "p"
    (out / "part-0").mkdir(parents=True)
    (out / "node_map.npy").write_bytes(b"")
    with pytest.raises(OutputExistsError, match="not empty"):
        partition_graph(synthetic, 2, "random", out)
    partition_graph(synthetic, 2, "random", out, overwrite=True)
    open_partitions(out).check()


def test_refusals_name_the_path_and_only_the_callers_flags(tmp_path, synthetic, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError) as e:
        partition_graph(synthetic, 2, "random", other, overwrite=True)
    assert str(other) in str(e.value) and "--" not in str(e.value)
    assert (other / "notes.txt").read_text() == "mine"
    rc = main(["partition", "cora", "--num-parts", "2", "--out", str(other), "--overwrite"])
    assert_one_line_error(rc, capsys.readouterr().err,
                          rf"--out {other}: is not empty and is not a jgraph partition")
    partition_graph(synthetic, 2, "random", tmp_path / "p")
    rc = main(["partition", "cora", "--num-parts", "2", "--out", str(tmp_path / "p")])
    assert_one_line_error(rc, capsys.readouterr().err, r"pass --overwrite to replace it")


def test_writer_refuses_data_it_could_not_read_back(tmp_path):
    # Graph refuses such data itself; the writer still refuses what gets past it.
    graph = tiny_graph()
    graph.node_data["author"]["name"] = np.array(["x"] * AUTHORS)
    with pytest.raises(PartitionError, match=r"node data 'name' of type 'author' has dtype <U1"):
        partition_graph(graph, 2, "random", tmp_path / "p")
    assert not (tmp_path / "p").exists() and leftovers(tmp_path / "p") == []


# -- requests ---------------------------------------------------------------------------

@pytest.mark.parametrize("tolerance,shown", [(float("nan"), "nan"), (float("inf"), "inf"),
                                             (-0.1, "-0.1"), (np.float64("nan"), "nan")])
def test_non_finite_or_negative_tolerance_is_refused(tmp_path, synthetic, tolerance, shown):
    with pytest.raises(PartitionError, match=rf"balance tolerance .* got {shown}$"):
        partition_graph(synthetic, 2, "random", tmp_path / "p", tolerance=tolerance)


@pytest.mark.parametrize("num_parts,shown", [(2.5, "2.5"), (True, "True"), ("3", "'3'")])
def test_non_integer_num_parts_is_refused(tmp_path, synthetic, num_parts, shown):
    with pytest.raises(PartitionError, match=rf"num_parts must be a positive integer, got {shown}"):
        partition_graph(synthetic, num_parts, "random", tmp_path / "p")


def test_cli_refuses_nan_tolerance(tmp_path, capsys):
    rc = main(["partition", "cora", "--num-parts", "2", "--out", str(tmp_path / "p"),
               "--balance-tolerance", "nan"])
    assert_one_line_error(rc, capsys.readouterr().err, r"balance tolerance .* got nan")
    assert not (tmp_path / "p").exists()
