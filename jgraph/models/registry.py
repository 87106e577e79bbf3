"""Models by name: what `model.kind` in an experiment config picks.

A model is a `LayerStack` whose layers follow the `MessagePassing` contract
(`jgraph.models.stack`): `message`, `reduce`, `merge`, `update`. Then the fused training
step runs it on sampled blocks and layer-wise inference runs it over whole
neighbourhoods, with no other code. To train one of your own:

    from jgraph.models import ModelSpec, register_model

    def build_gin(spec: ModelSpec, rngs) -> LayerStack:
        return GIN(spec.in_features, spec.hidden, spec.out_features, spec.num_layers,
                   dropout=spec.dropout, rngs=rngs)

    register_model("gin", build_gin)      # then model.kind: gin

or name it in a config as "package.module:build_gin" (importable from where jgraph
runs), which the CLI imports itself. `examples/own_model.py` trains a GIN this way.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from flax import nnx

from jgraph.models.stack import LayerStack


class ModelSpec(NamedTuple):
    """What a model builder is given.

    in_features: width of the input rows (features, embeddings, or the projected
      inputs of several node types); hidden: width between layers; out_features: the
      number of classes; num_layers: one per sampled hop; num_relations: edge types
      (1 for a homogeneous graph; each neighbourhood's `etype` says which);
    dropout, input_dropout, norm: `LayerStack`'s between-layer settings;
    options: the whole `ModelConfig` (for settings of the built-in models).
    """

    in_features: int
    hidden: int
    out_features: int
    num_layers: int
    num_relations: int
    dropout: float
    input_dropout: float
    norm: bool
    options: Any


ModelBuilder = Callable[[ModelSpec, nnx.Rngs], LayerStack]
_MODELS: dict[str, ModelBuilder] = {}


def register_model(name: str, builder: ModelBuilder) -> None:
    """Make `builder` the model of `model.kind: name`. Names hold no ':'; registering a
    name again replaces its builder."""
    if not name or ":" in name:
        raise ValueError(f"a model name is a non-empty string without ':', got {name!r}")
    _MODELS[name] = builder


def registered_models() -> list[str]:
    return sorted(_MODELS)


def is_import_path(kind: str) -> bool:
    """Whether `kind` names a builder as "module:attribute"."""
    module, sep, attr = kind.partition(":")
    return bool(sep and module and attr)


def model_builder(kind: str) -> ModelBuilder:
    """The builder `model.kind` names: a registered name, or "module:attribute"."""
    if kind in _MODELS:
        return _MODELS[kind]
    if not is_import_path(kind):
        raise KeyError(f"model.kind {kind!r} is not a registered model "
                       f"({', '.join(registered_models())}) nor a 'module:function' path")
    module, _, attr = kind.partition(":")
    try:
        builder = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise KeyError(f"model.kind {kind!r}: cannot import it ({err})") from None
    if not callable(builder):
        raise KeyError(f"model.kind {kind!r} is not callable")
    return builder


def build(kind: str, spec: ModelSpec, rngs: nnx.Rngs) -> LayerStack:
    """The model `kind` names, built for `spec`; it must be a `LayerStack`."""
    model = model_builder(kind)(spec, rngs)
    if not isinstance(model, LayerStack):
        raise TypeError(f"model.kind {kind!r} built a {type(model).__name__}; a model is a "
                        f"jgraph.models.LayerStack of MessagePassing layers")
    return model
