"""A JAX profiler trace of a window of training steps (`train.profile`).

The trace opens in Perfetto (ui.perfetto.dev) or TensorBoard's profile plugin. It
starts after the run's first step, so compilation and the first step's warm-up stay
out of it, and it covers `steps` steps, waiting for the last one to finish.
"""
from __future__ import annotations

import os

import jax


class StepTrace:
    """`after(done, outputs)` after each dispatched step (done = steps this run has
    dispatched); `close()` when the loop ends, however it ends."""

    def __init__(self, directory: str | None, steps: int = 5, skip: int = 1):
        self.directory, self.steps, self.skip = directory, steps, skip
        self.active = False
        if directory and steps < 1:
            raise ValueError(f"a profile traces at least one step, got {steps}")

    def after(self, done: int, outputs) -> None:
        if not self.directory:
            return
        if done == self.skip:
            jax.block_until_ready(outputs)      # the trace holds whole steps only
            os.makedirs(self.directory, exist_ok=True)
            jax.profiler.start_trace(self.directory)
            self.active = True
        elif self.active and done >= self.skip + self.steps:
            jax.block_until_ready(outputs)
            self.close()

    def close(self) -> None:
        if self.active:
            self.active = False
            jax.profiler.stop_trace()
