"""DGL's GraphSAGE link predictor on the split a jgraph run trained on: the peer figures
for `jgraph train experiments/lp_sage_facebook.yaml`.

usage: PY dgl_link_peer.py WORKDIR/partition [--hidden 128] [--fanouts 10,5]
         [--batch-size 1024] [--negatives 1] [--epochs 10] [--lr 0.003] [--seed 0]
         [--dense]

PY is a Python with torch and DGL (not a jgraph dependency: e.g. the peer venv of the
benchmark harness). It reads the partition a `task: link` run wrote (one partition, a
homogeneous graph): the training graph, the features, the training positives and the
fixed validation/test negatives, so both libraries see the same split. It trains as
DGL's link prediction examples do: `as_edge_prediction_sampler` with
`exclude="reverse_id"` and `negative_sampler.Uniform(k)`, GraphSAGE (mean) with a dot
product decoder and binary cross-entropy over every score; the first layer multiplies
sparse feature rows by its kernels (as jgraph's does), so no dense feature matrix is
built; `--dense` gives it the dense matrix instead, as DGL's examples feed features.
Evaluation: layer-wise full-graph inference, then each positive ranked against its
negatives with OGB's tie rule. Prints one JSON line (edges_per_s: positive edges
per second of training, median epoch after the first; val/test MRR and Hits@k).
"""
import argparse
import json
import os
import time
import warnings

warnings.filterwarnings("ignore")
import dgl  # noqa: E402
import dgl.function as fn  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def read_partition(root):
    with open(os.path.join(root, "meta.json")) as f:
        meta = json.load(f)
    if meta["num_parts"] != 1 or len(meta["relations"]) != 1:
        raise SystemExit(f"{root}: give the partition of a 1-device homogeneous run")
    part = os.path.join(root, "part-0")
    load = lambda *p: np.load(os.path.join(part, *p))
    indptr, indices = load("indptr.npy"), load("indices.npy")
    dst = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    feat = os.path.join(part, "node", "_N", "feat")
    if os.path.isdir(feat):
        cols, vals = load("node", "_N", "feat", "indices.npy"), load("node", "_N", "feat",
                                                                       "values.npy")
        width = meta["node_data"]["_N"]["feat"]["shape"][0]
        rows = np.repeat(np.arange(cols.shape[0]), cols.shape[1])
        keep = vals.reshape(-1) != 0
        x = torch.sparse_coo_tensor(np.stack([rows[keep], cols.reshape(-1)[keep]]),
                                    vals.reshape(-1)[keep], (cols.shape[0], width)).coalesce()
    else:
        x = torch.from_numpy(np.asarray(load("node", "_N", "feat.npy"), np.float32))
    splits = {s: {k: load("edges", s, f"{k}.npy") for k in ("src", "dst", "negatives")
                  if os.path.exists(os.path.join(part, "edges", s, f"{k}.npy"))}
              for s in ("train", "val", "test")}
    return meta["num_nodes"], indices, dst, x, splits


class FirstSAGE(nn.Module):
    """SAGEConv(mean) whose input rows may be sparse: fc_self(x_dst) + mean of
    fc_neigh(x_src) over the block's edges."""

    def __init__(self, width, out):
        super().__init__()
        self.fc_self = nn.Linear(width, out, bias=False)
        self.fc_neigh = nn.Linear(width, out)

    def forward(self, block, x):
        z = matmul(x, self.fc_neigh.weight.T)
        with block.local_scope():
            block.srcdata["z"] = z
            block.update_all(fn.copy_u("z", "m"), fn.mean("m", "h"))
            h = block.dstdata["h"]
        x_dst = index_rows(x, torch.arange(block.num_dst_nodes()))
        return h + self.fc_neigh.bias + matmul(x_dst, self.fc_self.weight.T)


def index_rows(x, ids):
    return torch.index_select(x, 0, ids)


def matmul(x, w):
    return torch.sparse.mm(x, w) if x.is_sparse else x @ w


class SAGE(nn.Module):
    def __init__(self, width, hidden, layers):
        super().__init__()
        self.layers = nn.ModuleList([FirstSAGE(width, hidden)] + [
            dgl.nn.SAGEConv(hidden, hidden, "mean") for _ in range(layers - 1)])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h

    def inference(self, g, x, batch_size=4096):
        """Every node's embedding, layer by layer over full neighbourhoods."""
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        nodes = torch.arange(g.num_nodes())
        h = x
        for i, layer in enumerate(self.layers):
            out = torch.empty(g.num_nodes(), layer.fc_neigh.out_features)
            for src, dst, (block,) in dgl.dataloading.DataLoader(g, nodes, sampler,
                                                                 batch_size=batch_size):
                y = layer(block, index_rows(h, src))
                out[dst] = F.relu(y) if i < len(self.layers) - 1 else y
            h = out
        return h


def ogb_ranks(pos, neg):
    pos = pos[:, None]
    return 1.0 + 0.5 * ((neg > pos).sum(1) + (neg >= pos).sum(1)).double()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("partition")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--fanouts", default="10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--negatives", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hits", default="1,10,50")
    ap.add_argument("--dense", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    n, msg_src, msg_dst, x, splits = read_partition(a.partition)
    if a.dense and x.is_sparse:
        x = x.to_dense()
    pos_src = torch.from_numpy(splits["train"]["src"])
    pos_dst = torch.from_numpy(splits["train"]["dst"])
    m = pos_src.numel()
    # The training graph: each training pair both ways (edge i and its reverse m + i),
    # then whatever else the run's graph holds (self-loops).
    key = lambda s, d: s.astype(np.int64) * n + d
    pairs = np.concatenate([key(splits["train"]["src"], splits["train"]["dst"]),
                            key(splits["train"]["dst"], splits["train"]["src"])])
    other = ~np.isin(key(msg_src, msg_dst), pairs)
    src = torch.cat([pos_src, pos_dst, torch.from_numpy(msg_src[other])])
    dst = torch.cat([pos_dst, pos_src, torch.from_numpy(msg_dst[other])])
    g = dgl.graph((src, dst), num_nodes=n)
    reverse = torch.cat([torch.arange(m, 2 * m), torch.arange(m),
                         torch.arange(2 * m, g.num_edges())])
    hops = [int(f) for f in a.fanouts.split(",")]
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        dgl.dataloading.NeighborSampler(list(reversed(hops))), exclude="reverse_id",
        reverse_eids=reverse, negative_sampler=dgl.dataloading.negative_sampler.Uniform(
            a.negatives))
    loader = dgl.dataloading.DataLoader(g, torch.arange(m), sampler, batch_size=a.batch_size,
                                        shuffle=True, drop_last=False, num_workers=0)
    model = SAGE(x.shape[1], a.hidden, len(hops))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    times = []
    for _ in range(a.epochs):
        start = time.perf_counter()
        total = 0.0
        for input_nodes, pair, neg_pair, blocks in loader:
            h = model(blocks, index_rows(x, input_nodes))
            ps, pd = pair.edges()
            ns, nd = neg_pair.edges()
            score = torch.cat([(h[ps] * h[pd]).sum(1), (h[ns] * h[nd]).sum(1)])
            label = torch.cat([torch.ones(ps.numel()), torch.zeros(ns.numel())])
            loss = F.binary_cross_entropy_with_logits(score, label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
        times.append(time.perf_counter() - start)
    result = {"peer": "dgl", "dgl": dgl.__version__, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "fanouts_per_hop": hops,
              "hidden": a.hidden, "batch_size": a.batch_size, "negatives": a.negatives,
              "features": "sparse" if x.is_sparse else "dense",
              "epochs": a.epochs, "positives": m, "final_loss": total / len(loader),
              "epoch_seconds": float(np.median(times[1:] or times)),
              "edges_per_s": m / float(np.median(times[1:] or times))}
    model.eval()
    with torch.no_grad():
        h = model.inference(g, x)
        for split in ("val", "test"):
            e = {k: torch.from_numpy(v) for k, v in splits[split].items()}
            pos = (h[e["src"]] * h[e["dst"]]).sum(1)
            neg = torch.einsum("nd,nkd->nk", h[e["src"]], h[e["negatives"]])
            ranks = ogb_ranks(pos, neg)
            result[f"{split}_mrr"] = float((1.0 / ranks).mean())
            for k in (int(k) for k in a.hits.split(",")):
                result[f"{split}_hits@{k}"] = float((ranks <= k).double().mean())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
