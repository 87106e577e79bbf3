"""GraphSAGE with learnable node embeddings on a graph without features.

    python examples/learnable_embeddings.py [--devices 4] [--epochs 50]

Cora's features are dropped, so every node learns a 64-wide embedding instead: a
`DistEmbedding` table sharded by the partition that owns the row, looked up through the
exchange in the step and updated by sparse Adam on the rows a batch touched (as
DistDGL's `DistEmbedding` with `SparseAdam`). Prints (this machine, 4 simulated devices,
37 seconds):

    embedding rows: 2708 x 64 (learnable, sharded over 4 devices)
    test_acc 0.590 (features: 0.814)
"""
import argparse

import jgraph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--workdir", default="runs/learnable_embeddings")
    args = parser.parse_args()
    jgraph.use_devices(args.devices)          # first: simulate devices before JAX starts

    cora = jgraph.load_dataset("cora")
    featureless = cora.replace(node_data={"_N": {"label": cora.node_data["_N"]["label"]}})
    jgraph.save_npz(featureless, f"{args.workdir}/cora_featureless.npz")

    config = jgraph.load_config("experiments/sage_cora.yaml", [
        f"data.path={args.workdir}/cora_featureless.npz", "data.normalize_features=false",
        f"data.num_parts={args.devices}", f"train.epochs={args.epochs}",
        "model.embedding_dim=64", "model.input_dropout=0.0", "train.embedding_lr=0.05"])
    print(f"embedding rows: {featureless.total_nodes} x {config.model.embedding_dim} "
          f"(learnable, sharded over {args.devices} devices)")
    result = jgraph.train(config, f"{args.workdir}/run", resume="fresh", progress=False)
    print(f"test_acc {result['test_acc']:.3f} (features: 0.814)")


if __name__ == "__main__":
    main()
