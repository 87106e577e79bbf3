"""`jgraph.train.checkpoint`: orbax checkpoints that restore onto another mesh layout,
checksums that do not depend on the layout and catch a changed value, the fallback past
a truncated checkpoint, half-written checkpoints never used (and their deletion said),
the save in flight finished when a run leaves on an error, a checkpoint of another run
refused by name, SIGINT/SIGTERM turned into a stop request, and no orbax warning
printed when a save waits for the one before it."""
import logging
import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jgraph.mesh import REPLICATED, ROWS
from jgraph.sharded import make_mesh
from jgraph.train.checkpoint import (
    CORRUPT_DIR,
    FORMAT,
    CheckpointError,
    Checkpoints,
    StopRequest,
    abstract,
    checksums,
)
from jgraph.train.resume import check_resumable


def tree_on(mesh, seed=0):
    """A state-like tree: a row-sharded table, a replicated weight and step."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(1024, 16)).astype(np.float32)   # its file is the largest
    weight = rng.normal(size=(16, 2)).astype(np.float32)
    return {"table": jax.device_put(table, NamedSharding(mesh, ROWS)),
            "weight": jax.device_put(weight, NamedSharding(mesh, REPLICATED)),
            "step": jax.device_put(jnp.int32(7 + seed), NamedSharding(mesh, REPLICATED))}


SPECS = {"table": ROWS, "weight": REPLICATED, "step": REPLICATED}


def save_steps(workdir, steps, keep=3):
    ckpts = Checkpoints(str(workdir), keep=keep, say=lambda m: None)
    mesh = make_mesh(None, jax.devices()[:4])
    for s in steps:
        tree = tree_on(mesh, seed=s)
        ckpts.save(s, tree, {"weight": tree["weight"]}, {"step": s})
    ckpts.close()
    return mesh


def targets(mesh):
    shapes = jax.eval_shape(lambda: tree_on(mesh))
    state = abstract(shapes, SPECS, mesh)
    return state, {"weight": state["weight"]}


def test_checksums_are_the_same_on_any_layout_and_change_with_any_value():
    four, two = make_mesh(None, jax.devices()[:4]), make_mesh(None, jax.devices()[:2])
    assert checksums(tree_on(four)) == checksums(tree_on(two))
    tree = tree_on(four)
    changed = dict(tree, table=tree["table"].at[5, 1].add(1e-6))
    got, want = checksums(changed), checksums(tree)
    assert [k for k in got if got[k] != want[k]] == ["['table']"]


def test_a_checkpoint_saved_on_4_devices_restores_on_2_with_the_values_and_meta(tmp_path):
    save_steps(tmp_path, [1, 2])
    two = make_mesh(None, jax.devices()[:2])
    ckpts = Checkpoints(str(tmp_path), say=lambda m: None)
    got = ckpts.restore_latest(*targets(two))
    ckpts.close()
    want = tree_on(make_mesh(None, jax.devices()[:4]), seed=2)
    assert got.step == 2 and got.meta["step"] == 2
    assert got.state["table"].sharding == NamedSharding(two, PartitionSpec("parts"))
    for k in want:
        np.testing.assert_array_equal(np.asarray(got.state[k]), np.asarray(want[k]))
    np.testing.assert_array_equal(np.asarray(got.best["weight"]), np.asarray(want["weight"]))


def test_only_the_newest_keep_checkpoints_stay(tmp_path):
    save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4"]


def test_a_save_waiting_for_the_one_before_it_says_nothing_through_absl(tmp_path, caplog,
                                                                          monkeypatch):
    # Orbax warns through absl (`WARNING:absl:Waiting for previous save ...` on stderr)
    # when a save waited longer than a threshold for the one before it; below zero,
    # every save does.
    from orbax.checkpoint import checkpoint_manager
    monkeypatch.setattr(checkpoint_manager, "_WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS", -1.0)
    caplog.set_level(logging.DEBUG)
    save_steps(tmp_path, [1, 2, 3])
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2", "3"]
    assert not [r.getMessage() for r in caplog.records
                if r.name == "absl" and r.levelno >= logging.WARNING]


def largest_file(folder):
    files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
    return max(files, key=os.path.getsize)


@pytest.mark.parametrize("victim", ["state data", "meta"])
def test_a_truncated_checkpoint_is_reported_set_aside_and_the_previous_one_used(tmp_path,
                                                                                victim):
    mesh = save_steps(tmp_path, [1, 2])
    path = (largest_file(tmp_path / "checkpoints" / "2" / "state") if victim == "state data"
            else str(tmp_path / "checkpoints" / "2" / "meta" / "metadata"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    said = []
    ckpts = Checkpoints(str(tmp_path), say=said.append)
    got = ckpts.restore_latest(*targets(mesh))
    assert got.step == 1 and int(got.state["step"]) == 8      # tree_on(seed=1)
    assert len(said) == 1 and str(tmp_path / "checkpoints" / "2") in said[0]
    assert "unreadable" in said[0] and "trying the one before it" in said[0]
    assert ckpts.steps() == [1]
    assert (tmp_path / CORRUPT_DIR / "2").is_dir()
    ckpts.save(2, tree_on(mesh, 2), {"weight": tree_on(mesh, 2)["weight"]}, {"step": 2})
    ckpts.close()                            # the step can be written again afterwards
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


def test_a_checkpoint_whose_values_differ_from_its_checksums_is_not_used(tmp_path):
    """A damage orbax reads without complaint: rewrite the data of step 2 with step 1's
    values (a valid file, the wrong numbers)."""
    mesh = save_steps(tmp_path, [1, 2])
    ckpts = Checkpoints(str(tmp_path), say=lambda m: None)
    ckpts.manager.delete(2)
    tree = tree_on(mesh, seed=1)
    meta_of_2 = {"format": FORMAT, "step": 2, "checksums": checksums(
        {"state": tree_on(mesh, seed=2), "best": {"weight": tree_on(mesh, seed=2)["weight"]}})}
    import orbax.checkpoint as ocp
    ckpts.manager.save(2, args=ocp.args.Composite(
        state=ocp.args.StandardSave(tree), best=ocp.args.StandardSave({"weight": tree["weight"]}),
        meta=ocp.args.JsonSave(meta_of_2)), force=True)
    ckpts.wait()
    said = []
    ckpts.say = said.append
    got = ckpts.restore_latest(*targets(mesh))
    ckpts.close()
    assert got.step == 1
    assert "checksums" in said[0] and "['table']" in said[0]


def test_a_half_written_checkpoint_is_never_used_and_is_cleaned_up(tmp_path):
    mesh = save_steps(tmp_path, [1, 2])
    # What an interrupted asynchronous save leaves: orbax's temporary folder.
    half = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1234"
    half.mkdir()
    (half / "state").mkdir()
    ckpts = Checkpoints(str(tmp_path), say=lambda m: None)
    assert ckpts.steps() == [1, 2]
    assert ckpts.restore_latest(*targets(mesh)).step == 2
    ckpts.close()
    assert not half.exists()


@pytest.mark.parametrize("name", ["3.orbax-checkpoint-tmp",          # this orbax's
                                  "3.orbax-checkpoint-tmp-1234"])    # older ones'
def test_an_unfinished_checkpoint_is_deleted_at_start_and_said_so(tmp_path, name):
    save_steps(tmp_path, [1, 2])
    half = tmp_path / "checkpoints" / name
    (half / "state").mkdir(parents=True)
    (half / "state" / "_METADATA").write_text("{")
    said = []
    ckpts = Checkpoints(str(tmp_path), say=said.append)
    assert not half.exists()          # already: nothing left running in the background
    assert said == [(f"discarding {half}: the checkpoint of step 3 was left unfinished "
                     f"(its save was interrupted)")]
    assert ckpts.steps() == [1, 2]
    ckpts.close()


def test_leaving_checkpoints_on_an_error_finishes_the_save_in_flight(tmp_path):
    mesh = make_mesh(None, jax.devices()[:4])
    tree = tree_on(mesh)
    with pytest.raises(RuntimeError, match="diverged"), \
            Checkpoints(str(tmp_path), say=lambda m: None) as ckpts:
        ckpts.save(1, tree, {"weight": tree["weight"]}, {"step": 1})
        raise RuntimeError("diverged")
    assert ckpts.closed
    assert os.listdir(tmp_path / "checkpoints") == ["1"]      # renamed: complete
    ckpts.close()                                             # a second close: nothing


@pytest.mark.slow        # processes with their own JAX: 6 s
def test_a_process_leaving_on_an_error_prints_only_its_error(tmp_path):
    """The symptom: orbax threads still running at interpreter shutdown printed a
    40-line traceback ('cannot schedule new futures after interpreter shutdown') after
    jgraph's one-line error. Here: an unfinished folder to delete at start (orbax's
    cleanup thread) and an asynchronous save in flight when the error leaves."""
    script = textwrap.dedent("""
        import os, sys
        from jgraph.cli.devices import use_devices
        use_devices(1)
        import jax.numpy as jnp
        from jgraph.train.checkpoint import Checkpoints
        os.makedirs(os.path.join(sys.argv[1], "checkpoints", "5.orbax-checkpoint-tmp"))
        with Checkpoints(sys.argv[1], say=lambda m: None) as ckpts:
            tree = {"x": jnp.arange(100_000.0)}
            ckpts.save(1, tree, tree, {})
            sys.exit("jgraph train: error: the one line")
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "jgraph train: error: the one line"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert os.listdir(tmp_path / "checkpoints") == ["1"]


def test_a_workdir_without_checkpoints_restores_nothing(tmp_path):
    ckpts = Checkpoints(str(tmp_path), say=lambda m: None)
    assert ckpts.steps() == [] and ckpts.restore_latest(*targets(make_mesh(None))) is None
    ckpts.close()


def test_clear_deletes_every_checkpoint(tmp_path):
    save_steps(tmp_path, [1, 2])
    ckpts = Checkpoints(str(tmp_path), say=lambda m: None)
    ckpts.clear()
    assert ckpts.steps() == []
    ckpts.close()


IDENTITY = {"config": {"name": "a", "train": {"epochs": 5, "lr": 0.01},
                       "data": {"num_parts": 4}, "checkpoint": {"keep": 3}},
            "partition": {"graph": "cora", "num_parts": 4, "node_map_sha1": "ab"}}


def changed(section, key, value):
    out = {k: dict(v) for k, v in IDENTITY.items()}
    if section == "config" and "." in key:
        top, sub = key.split(".")
        out["config"][top] = {**IDENTITY["config"][top], sub: value}
    else:
        out[section][key] = value
    return out


def test_a_resumed_run_may_change_epochs_checkpointing_and_name_only():
    for ok in (changed("config", "train.epochs", 9), changed("config", "checkpoint.keep", 1),
               changed("config", "name", "b")):
        check_resumable(IDENTITY, ok, "ck/5")
    for section, key, value, named in (
            ("config", "train.lr", 0.1, "config.train.lr: 0.01 there, 0.1 now"),
            ("config", "data.num_parts", 8, "config.data.num_parts: 4 there, 8 now"),
            ("partition", "node_map_sha1", "cd", "partition.node_map_sha1")):
        with pytest.raises(CheckpointError, match="ck/5 belongs to another run") as e:
            check_resumable(IDENTITY, changed(section, key, value), "ck/5")
        assert named in str(e.value) and "--fresh" in str(e.value)


def test_a_stop_request_records_the_first_signal_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert stop.requested is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested is signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)          # a repeat changes nothing
        assert stop.requested is signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):        # a second SIGINT stops at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_setting_added_since_a_checkpoint_counts_as_its_default_there():
    """A checkpoint written before `task` and `link` existed resumes a node
    classification run (their defaults), and refuses a link prediction one."""
    check_resumable(IDENTITY, changed("config", "task", "node"), "ck/5")
    now = changed("config", "task", "node")
    now["config"]["link"] = {"negatives": 1, "decoder": "dot"}
    check_resumable(IDENTITY, now, "ck/5")
    with pytest.raises(CheckpointError, match="config.task: 'node' there, 'link' now"):
        check_resumable(IDENTITY, changed("config", "task", "link"), "ck/5")
