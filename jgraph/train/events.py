"""TensorBoard event files of a run (`tensorboard --logdir runs/`), beside
metrics.jsonl: written by the first process only, through tensorboardX (no
TensorFlow).

Per step: the training loss, and what the step's exchanges and sampler did (ids
requested, remote, answered by the cache, bytes on the wire; sampled edges). Per epoch:
every number of the epoch's metrics.jsonl line (loss, accuracies or MRR, seconds,
seeds/s, compile seconds), the learning rates and the programs compiled so far. Tags
are `train/...`, `val/...`, `exchange/...`, `sampler/...`, `time/...`, `compiles/...`.
A resumed run purges what a stopped one logged after its checkpoint, so the curves
read as one run.
"""
from __future__ import annotations

import glob
import numbers
import os
import time
from collections.abc import Mapping

import jax
import numpy as np

from jgraph.exchange import ExchangeStats
from jgraph.sampling.sampler import SampleStats

# metrics.jsonl's epoch fields -> their tags (others: "epoch/<name>").
EPOCH_TAGS = {"loss": "train/loss_epoch", "train_acc": "train/acc",
              "train_hits_1": "train/hits_1", "val_acc": "val/acc",
              "val_macro_f1": "val/macro_f1", "val_mrr": "val/mrr",
              "epoch_seconds": "time/epoch_seconds", "compile_seconds": "time/compile_seconds",
              "seeds_per_s": "time/seeds_per_s", "edges_per_s": "time/edges_per_s"}
SKIPPED = ("epoch", "step")


class EventLog:
    """TensorBoard scalars of one run in `logdir`; does nothing where not `enabled`
    (every process but the first). purge_step: the step a resumed run goes on from
    (events an earlier run wrote at or after it are dropped)."""

    def __init__(self, logdir: str, enabled: bool = True, purge_step: int | None = None):
        self.writer = None
        if enabled:
            from tensorboardX import SummaryWriter
            # A file of its own per writer, even for two in one second (a run stopped
            # and resumed at once): TensorBoard names files by the second and host.
            self.writer = SummaryWriter(logdir, purge_step=purge_step, flush_secs=30,
                                        filename_suffix=f".{time.time_ns()}")

    def step(self, step: int, loss: float, stats=None) -> None:
        """One training step's loss and its exchanges' and sampler's counters."""
        if self.writer is None:
            return
        self.writer.add_scalar("train/loss", loss, step)
        for tag, value in stats_scalars(stats).items():
            self.writer.add_scalar(tag, value, step)

    def epoch(self, row: Mapping, scalars: Mapping[str, float] = ()) -> None:
        """An epoch's metrics.jsonl line (numbers only), at its last step, and further
        `scalars` by tag."""
        if self.writer is None:
            return
        step = int(row["step"])
        for key, value in row.items():
            if key in SKIPPED or isinstance(value, bool) \
                    or not isinstance(value, numbers.Real):
                continue
            self.writer.add_scalar(EPOCH_TAGS.get(key, f"epoch/{key}"), float(value), step)
        for tag, value in dict(scalars).items():
            self.writer.add_scalar(tag, float(value), step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, text, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def stats_scalars(stats) -> dict[str, float]:
    """{tag: value} summed over every exchange and sampler of a step's statistics
    (host values): exchange/requested, non_local, cached, wire_bytes; sampler/
    sampled_edges, truncated."""
    out: dict[str, float] = {}
    if stats is None:
        return out
    leaves = jax.tree.leaves(stats, is_leaf=lambda x: isinstance(x, (ExchangeStats,
                                                                      SampleStats)))
    for leaf in leaves:
        if isinstance(leaf, ExchangeStats):
            for name in ("requested", "non_local", "cached", "wire_bytes"):
                tag = f"exchange/{name}"
                out[tag] = out.get(tag, 0.0) + float(np.sum(getattr(leaf, name)))
        elif isinstance(leaf, SampleStats):
            for name in ("sampled_edges", "truncated"):
                tag = f"sampler/{name}"
                out[tag] = out.get(tag, 0.0) + float(np.sum(getattr(leaf, name)))
            out.update({tag: out.get(tag, 0.0) + v
                        for tag, v in stats_scalars(leaf.exchange).items()})
    return out


def read_scalars(logdir: str) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the scalars in `logdir`'s event files, read as
    TensorBoard reads them: each file's records in TensorBoard's framing (length, its
    CRC, the record, its CRC) holding Event protocol buffers, the files in the order
    they were written, and a session's start dropping what earlier files logged at or
    after its step (a resumed run's purge)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    scalars: dict[str, dict[int, float]] = {}
    paths = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    for path in sorted(paths, key=lambda p: (int(os.path.basename(p).split(".")[3]), p)):
        with open(path, "rb") as f:
            data = f.read()
        at = 0
        while at + 12 <= len(data):
            length = int.from_bytes(data[at:at + 8], "little")
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                for values in scalars.values():
                    for step in [s for s in values if s >= event.step]:
                        del values[step]
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars
