"""The work directory of a bounded-memory partitioning job (`<out>.work`): which
phases finished, and which job it belongs to.

The first process of a job decides whether what it finds there is resumed (the same
job: input, options and process count) or deleted (another, finished or unreadable
job, or one killed while publishing), and keeps `job.json`; the others read it.
"""
from __future__ import annotations

import json
import os
import shutil

from jgraph.atomic import writer, writer_alive
from jgraph.partition.errors import PartitionError
from jgraph.partition.group import Group
from jgraph.progress import Progress


class Work:
    """The work directory: which phases finished (with their seconds and peak RSS)."""

    def __init__(self, root: str, identity: dict, progress: Progress, group: Group):
        self.root, self.group = root, group
        self.record = os.path.join(root, "job.json")
        if not group.leader:               # the first process decides; the others follow
            group.barrier("work directory")
            with open(self.record) as f:
                self.state = json.load(f)
            return
        state = None
        owner = _read(os.path.join(root, "writer"))
        if owner and owner != writer() and writer_alive(owner):
            raise PartitionError(f"{root}: another job ({owner}) is writing this partition "
                                 f"directory; wait for it, or give another --out")
        if os.path.isdir(root):
            try:
                with open(self.record) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                state = None
            staged = os.path.isfile(os.path.join(root, "out", "node_map.npy"))
            relabelled = state is not None and "relabel" in state.get("phases", {})
            if (state is None or state.get("identity") != identity
                    or state.get("publishing") or (relabelled and not staged)):
                progress.note(f"{root}: left by a different, finished or unreadable job; "
                              f"starting over")
                shutil.rmtree(root)
                state = None
            elif state["phases"]:
                progress.note(f"resuming after phase {list(state['phases'])[-1]!r} "
                              f"({root})")
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "writer"), "w") as f:
            f.write(writer())
        self.state = state or {"identity": identity, "phases": {}}
        self._save()
        group.barrier("work directory")

    def _save(self) -> None:
        if not self.group.leader:
            return
        with open(self.record + ".tmp", "w") as f:
            json.dump(self.state, f, indent=1)
        os.replace(self.record + ".tmp", self.record)

    def publishing(self) -> None:
        self.state["publishing"] = True
        self._save()

    def done(self, phase: str) -> bool:
        return phase in self.state["phases"]

    def finish(self, phase: str, seconds: float, peaks: list[int], starts: list[int],
               **facts) -> None:
        """Record a finished phase: its seconds, its peak RSS and the RSS it began with
        (the largest process's, and with several processes each one's: what a phase
        added is the difference), and what it found."""
        record = {"seconds": seconds, "peak_rss_bytes": max(peaks),
                  "start_rss_bytes": max(starts)}
        if len(peaks) > 1:
            record["peak_rss_bytes_per_process"] = peaks
            record["start_rss_bytes_per_process"] = starts
        self.state["phases"][phase] = {**record, **facts}
        self._save()

    def path(self, *names: str) -> str:
        return os.path.join(self.root, *names)


def discard(root: str) -> None:
    """Delete the work directory `root` if this process wrote it (a job that cannot be
    resumed: its input was a scratch folder that is gone); another job's stays."""
    if _read(os.path.join(root, "writer")) == writer():
        shutil.rmtree(root, ignore_errors=True)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
