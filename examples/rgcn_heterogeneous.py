"""R-GCN on a heterogeneous graph: papers, authors and subjects of ACM (HeCo's split).

    python examples/rgcn_heterogeneous.py [--devices 4] [--epochs 30]

Three node types and two relations (with their inverses added, four). Papers and
authors have 1902-wide features, each projected to the model's width by its own
linear layer; subjects have none and learn an embedding. The labelled type is paper.
Every partition holds each node type's rows in its own range. Validation during
training samples 10 neighbours per hop; the final scores come from layer-wise inference
over whole neighbourhoods. Prints (this machine, 4 simulated devices, 70 seconds):

    heco_acm: paper 4019, author 7167, subject 60 nodes; 4 relations
    test_acc 0.858 (macro F1 0.857)
"""
import argparse

import jgraph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--data", default="../shared/data/heco_acm.npz")
    parser.add_argument("--workdir", default="runs/rgcn_heterogeneous")
    args = parser.parse_args()
    jgraph.use_devices(args.devices)          # first: simulate devices before JAX starts

    graph = jgraph.add_reverse_relations(jgraph.load_npz(args.data))
    print(f"{graph.name}: " + ", ".join(f"{t} {n}" for t, n in graph.num_nodes.items())
          + f" nodes; {len(graph.relations)} relations")

    config = jgraph.load_config({
        "name": "rgcn_heco_acm",
        "data": {"path": args.data, "num_parts": args.devices, "reverse_relations": True,
                 "target_type": "paper"},
        "model": {"kind": "rgcn", "hidden": 64, "num_layers": 2, "embedding_dim": 64,
                  "decomposition": "basis", "num_bases": 2, "dropout": 0.5},
        "train": {"fanouts": [10, 10], "eval_fanouts": [10, 10], "inference": "full",
                  "lr": 0.005, "weight_decay": 0.0005, "epochs": args.epochs,
                  "batch_size": 32},
    })
    result = jgraph.train(config, args.workdir, resume="fresh", progress=False)
    print(f"test_acc {result['test_acc']:.3f} (macro F1 {result['test_macro_f1']:.3f})")


if __name__ == "__main__":
    main()
