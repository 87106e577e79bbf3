"""The Python entry points of training: `jgraph.train(config)`, `jgraph.evaluate` and
`jgraph.embed`.

They do what `jgraph train`, `jgraph eval` and `jgraph embed` do, from a Python program
or a notebook:

    import jax
    jax.config.update("jax_num_cpu_devices", 4)     # before JAX starts: simulate 4
    import jgraph

    result = jgraph.train("experiments/sage_cora.yaml", "runs/cora",
                          overrides=["data.num_parts=4", "train.epochs=10"])
    print(result["test_acc"])
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from jgraph.config import ConfigError, build, load, override
from jgraph.jobs.experiment import Experiment, Inference
from jgraph.progress import Progress
from jgraph.train.resume import Resume
from jgraph.train.workdir import default_workdir


def load_config(config: Experiment | str | os.PathLike | Mapping,
               overrides: Sequence[str] = ()) -> Experiment:
    """An `Experiment` from itself, a YAML file's path, or a mapping of sections (as a
    YAML file holds them), with `section.key=value` overrides applied."""
    if isinstance(config, Experiment):
        return override(config, overrides)
    if isinstance(config, Mapping):
        return override(build(Experiment, config), overrides)
    if isinstance(config, (str, os.PathLike)):
        return load(Experiment, os.fspath(config), overrides)
    raise ConfigError(f"a config is an Experiment, a YAML path or a mapping, got "
                      f"{type(config).__name__}")


def train(config: Experiment | str | os.PathLike | Mapping, workdir: str | None = None, *,
          overrides: Sequence[str] = (), resume: Resume | str = Resume.AUTO,
          progress: bool = True) -> dict:
    """Train `config` on the devices JAX has (partitioned into `data.num_parts`; 0 =
    all) and evaluate it; returns the run's result (val_acc, test_acc, ... as
    WORKDIR/result.json holds it).

    workdir: where the run writes (default runs/<the config file's name>, or
    runs/<config.name> for a config given as an object or mapping); a run resumes from its
    newest checkpoint there (`resume`: "auto", "require" or "fresh").
    """
    from jgraph.train.loop import train_and_evaluate
    source = config
    config = load_config(config, overrides)
    workdir = workdir or default_workdir(source, config.name)
    return train_and_evaluate(config, workdir, Progress(enabled=progress), Resume(resume))


def evaluate(workdir: str, splits: Sequence[str] = ("val", "test"),
             inference: Inference | str | None = None, progress: bool = False) -> dict:
    """Scores of the model `train` saved in `workdir`: {split: {"acc", "macro_f1", ...}}.
    inference: "sampled" or "full" (default: the run's train.inference)."""
    from jgraph.train.model import evaluate_run
    return evaluate_run(workdir, tuple(splits),
                        None if inference is None else Inference(inference),
                        Progress(enabled=progress))


def smooth(workdir: str, *, correct_steps: int | None = None,
           smooth_steps: int | None = None, correct_alphas: Sequence[float] | None = None,
           smooth_alphas: Sequence[float] | None = None, scale: float | None = None,
           progress: bool = False) -> dict:
    """Correct & Smooth of the node classification run `train` saved in `workdir` (`jgraph
    smooth`): the alphas chosen on validation, the result also written to
    WORKDIR/correct_and_smooth.json. Settings left None are the run's `smooth` section's
    (`jgraph.jobs.experiment.SmoothConfig`); scale: a fixed scale of the correction
    instead of autoscaling it. See `jgraph.train.smooth`."""
    from jgraph.train.smooth import smooth_run
    given = {"correct_steps": correct_steps, "smooth_steps": smooth_steps,
             "correct_alphas": None if correct_alphas is None else tuple(correct_alphas),
             "smooth_alphas": None if smooth_alphas is None else tuple(smooth_alphas)}
    if scale is not None:
        given.update(autoscale=False, scale=scale)
    return smooth_run(workdir, {k: v for k, v in given.items() if v is not None},
                      Progress(enabled=progress))


def embed(workdir: str, out: str, *, what: str = "embeddings", layer: int | None = None,
          node_type: str | None = None, nodes=None, overwrite: bool = False,
          smoothed: bool = False, progress: bool = False) -> dict:
    """Write every node's output of the model `train` saved in `workdir` to `out`, in
    original node ids (read it back with `jgraph.read_embeddings(out)`); returns a
    summary (rows, width, seconds, ...). what: "embeddings" (the rows of `layer`,
    counted from 1; default the last hidden layer, or the last for link prediction),
    "logits", "probabilities" or "predictions"; node_type, nodes: only that type's
    nodes, only these original ids (an array or a file); smoothed: the probabilities or
    predictions after the run's Correct & Smooth (`smooth`). See `jgraph embed --help`."""
    from jgraph.train.embed import embed as embed_run
    return embed_run(workdir, out, what=what, layer=layer, node_type=node_type, nodes=nodes,
                     overwrite=overwrite, smoothed=smoothed,
                     progress=Progress(enabled=progress))
