"""`jgraph embed WORKDIR --out DIR`: every node's embedding or prediction, on disk."""
from __future__ import annotations


def add_commands(sub) -> None:
    from jgraph.data.outputs import What
    embed = sub.add_parser(
        "embed", help="write every node's embedding or prediction from a trained run",
        description="Compute a trained run's outputs for every node (or one node type, or "
                    "a list of nodes) by layer-wise full-graph inference on the run's "
                    "devices, and write them in original node ids to DIR: row-chunked .npy "
                    "files and DIR/index.json (read them with jgraph.read_embeddings). Each "
                    "process writes the rows its devices computed. A run of label "
                    "propagation, or --smoothed, gives the labelled type's class "
                    "probabilities or predictions.")
    embed.add_argument("workdir", help="the run's WORKDIR (jgraph train --workdir)")
    embed.add_argument("--out", required=True, help="output directory")
    embed.add_argument("--what", default=What.EMBEDDINGS.value,
                       choices=[w.value for w in What],
                       help="a layer's rows (default), the logits, their softmax, or the "
                            "predicted class")
    embed.add_argument("--layer", type=int,
                       help="with --what embeddings: the layer whose rows are written, "
                            "from 1 (default: the last hidden layer; for link prediction "
                            "the last layer)")
    embed.add_argument("--node-type", help="only this node type's nodes")
    embed.add_argument("--nodes", metavar="FILE",
                       help="only these nodes: original ids of --node-type (or of the only "
                            "type), a .npy array or a text file with one id a line")
    embed.add_argument("--smoothed", action="store_true",
                       help="with --what probabilities or predictions: those after the "
                            "Correct & Smooth that `jgraph smooth` (or "
                            "smooth.after_training) chose for the run, of the labelled type")
    embed.add_argument("--overwrite", action="store_true",
                       help="replace outputs that an earlier jgraph embed wrote to DIR")
    embed.add_argument("--devices", type=int, help="simulate this many devices on CPU "
                       "(default: as many as the run trained on)")
    embed.set_defaults(run=run_embed)


def run_embed(args) -> int:
    from jgraph.cli.devices import use_devices
    from jgraph.cli.train import run_devices
    use_devices(args.devices if args.devices is not None else run_devices(args.workdir))
    import jax

    from jgraph.progress import Progress
    from jgraph.train.embed import embed
    from jgraph.train.report import strict_json

    first = jax.process_index() == 0          # one process speaks for a multi-process job
    summary = embed(args.workdir, args.out, what=args.what, layer=args.layer,
                    node_type=args.node_type, nodes=args.nodes, overwrite=args.overwrite,
                    smoothed=args.smoothed, progress=Progress(enabled=first and not args.quiet))
    if first:
        print(strict_json(summary))
    return 0
