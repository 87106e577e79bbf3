"""Flax NNX graph models over fixed-width neighbourhoods (sampled Blocks, or windows of
the full graph in layer-wise inference), by name (`register_model`): "sage", "rgcn"
and "gat" are built in; see `jgraph.models.registry` for models of one's own."""
from jgraph.models.encoder import InputEncoder, NodeClassifier
from jgraph.models.gat import GAT, GATConv
from jgraph.models.registry import (
    ModelSpec,
    is_import_path,
    model_builder,
    register_model,
    registered_models,
)
from jgraph.models.rgcn import (
    RGCN,
    Decomposition,
    Norm,
    OneHotRelGraphConv,
    RelGraphConv,
    one_hot_width,
)
from jgraph.models.sage import Aggregator, GraphSAGE, SAGEConv
from jgraph.models.stack import (
    LayerStack,
    MessagePassing,
    Neighbourhood,
    gather_neighbours,
    merge_partials,
    slot_count,
)


def _build_sage(spec: ModelSpec, rngs) -> GraphSAGE:
    return GraphSAGE(spec.in_features, spec.hidden, spec.out_features, spec.num_layers,
                     aggregator=Aggregator(spec.options.aggregator), dropout=spec.dropout,
                     input_dropout=spec.input_dropout, norm=spec.norm, rngs=rngs)


def _build_rgcn(spec: ModelSpec, rngs) -> RGCN:
    o = spec.options
    return RGCN(spec.in_features, spec.hidden, spec.out_features, spec.num_layers,
                spec.num_relations, decomposition=Decomposition(o.decomposition),
                num_bases=o.num_bases, self_loop=o.self_loop, normalization=Norm(o.normalization),
                dropout=spec.dropout, input_dropout=spec.input_dropout, norm=spec.norm,
                one_hot_inputs=o.one_hot_inputs, rngs=rngs)


def _build_gat(spec: ModelSpec, rngs) -> GAT:
    o = spec.options
    return GAT(spec.in_features, spec.hidden, spec.out_features, spec.num_layers,
               heads=o.heads, out_heads=o.out_heads, attn_dropout=o.attn_dropout,
               negative_slope=o.negative_slope, residual=o.residual, dropout=spec.dropout,
               input_dropout=spec.input_dropout, norm=spec.norm, rngs=rngs)


register_model("sage", _build_sage)
register_model("rgcn", _build_rgcn)
register_model("gat", _build_gat)

__all__ = [
    "GAT",
    "RGCN",
    "Aggregator",
    "Decomposition",
    "GATConv",
    "GraphSAGE",
    "InputEncoder",
    "LayerStack",
    "MessagePassing",
    "ModelSpec",
    "Neighbourhood",
    "NodeClassifier",
    "Norm",
    "OneHotRelGraphConv",
    "RelGraphConv",
    "SAGEConv",
    "gather_neighbours",
    "is_import_path",
    "merge_partials",
    "model_builder",
    "one_hot_width",
    "register_model",
    "registered_models",
    "slot_count",
]
