"""Partition a graph with METIS and look inside the partition directory.

    python examples/partition_and_inspect.py [--graph cora] [--parts 4] [--out parts/cora4]

Each partition owns a contiguous range of new node ids and holds its nodes' in-edges
(CSC), their features, labels and splits, and its halo (the sources it reads from
other partitions). Prints (this machine, under a second):

    cora: 2708 nodes, 10556 edges -> 4 parts, edge cut 0.066
    part 0: nodes 0..707, 2767 in-edges, halo 130, train 36
    part 1: nodes 708..1398, 2613 in-edges, halo 152, train 32
    part 2: nodes 1399..2000, 2479 in-edges, halo 129, train 36
    part 3: nodes 2001..2707, 2697 in-edges, halo 91, train 36
    original node 0 is new node 708, owned by part 1
"""
import argparse

import numpy as np

import jgraph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="cora", help="cora, an .npz, or synthetic:...")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--out", default="parts/cora4")
    args = parser.parse_args()

    graph = jgraph.load_dataset(args.graph)
    meta = jgraph.partition_graph(graph, args.parts, "metis", args.out, overwrite=True)
    print(f"{meta.graph_name}: {meta.num_nodes} nodes, {meta.num_edges} edges -> "
          f"{meta.num_parts} parts, edge cut {meta.edge_cut_fraction:.3f}")

    parts = jgraph.open_partitions(args.out)          # reads meta.json; parts load lazily
    ntype = parts.meta.node_types[0]
    for k in range(parts.num_parts):
        part = parts.part(k)                          # memory-mapped .npy files
        lo, hi = part.node_range
        train = part.splits[ntype].get("train", np.empty(0))
        print(f"part {k}: nodes {lo}..{hi - 1}, {part.num_edges} in-edges, "
              f"halo {part.halo.size}, train {train.size}")
        # Rows are in new-id order: row i of a part is new node lo + i.
        original = np.asarray(parts.node_map())[lo:hi]          # new -> original ids
        assert np.array_equal(part.node_data[ntype]["feat"],
                              graph.node_data[ntype]["feat"][original])

    new = int(np.asarray(parts.node_map_inv())[0])             # original -> new ids
    print(f"original node 0 is new node {new}, owned by part {int(parts.book.owner([new])[0])}")


if __name__ == "__main__":
    main()
