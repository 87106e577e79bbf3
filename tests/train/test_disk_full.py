"""A disk that cannot take a checkpoint or the model: refused before writing when the
free space is short, and one CheckpointError naming the folder when the disk refuses a
write anyway (never orbax's page of tracebacks)."""
import collections

import jax.numpy as jnp
import pytest

from jgraph.train import checkpoint
from jgraph.train.checkpoint import CheckpointError, Checkpoints, check_space, refused_writes
from jgraph.train.model import save_model

Usage = collections.namedtuple("Usage", "total used free")


def tree():
    return {"w": jnp.ones((256, 256), jnp.float32), "b": jnp.zeros(256, jnp.float32)}


def free_bytes(monkeypatch, free):
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: Usage(free, 0, free))


def test_check_space_counts_this_process_share_and_names_the_folder(tmp_path, monkeypatch):
    need = 256 * 256 * 4 + 256 * 4
    free_bytes(monkeypatch, int(need * 1.1) + (1 << 20))
    check_space(str(tmp_path / "not" / "yet" / "made"), tree(), "checkpoint 7")
    free_bytes(monkeypatch, need)
    with pytest.raises(CheckpointError, match=r"checkpoints: checkpoint 7 needs about 1\.3 "
                                              r"MiB and the disk has 0\.3 MiB free"):
        check_space(str(tmp_path / "checkpoints"), tree(), "checkpoint 7")


def test_a_save_on_a_full_disk_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    free_bytes(monkeypatch, 1000)
    with Checkpoints(str(tmp_path), asynchronous=False) as ckpts:
        with pytest.raises(CheckpointError, match="checkpoint 1 needs about"):
            ckpts.save(1, tree(), tree(), {"step": 1})
        assert ckpts.steps() == []
    with pytest.raises(CheckpointError, match=r"model: the trained model needs about"):
        save_model(str(tmp_path), tree(), {})
    assert not (tmp_path / "model").exists()


def test_writes_the_disk_refuses_become_one_error_naming_the_folder():
    refusal = ValueError('RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database')
    with (pytest.raises(CheckpointError, match=r"^/ckpt: the disk refused the write "
                                               r"\(ValueError: RESOURCE_EXHAUSTED"),
          refused_writes("/ckpt")):
        raise refusal
    with (pytest.raises(CheckpointError, match="OSError: .*No space left"),
          refused_writes("/ckpt")):
        raise OSError(28, "No space left on device")
    with pytest.raises(KeyError), refused_writes("/ckpt"):   # anything else is not the disk's
        raise KeyError("w")
