#!/usr/bin/env bash
# jgraph on one GPU: the compiled draw kernel against its reference, the training
# bench on the 200k-node / 4M-edge graph (f32, bf16, batch 8192), the sampler with
# either draw, and GraphSAGE on Cora. Needs jgraph with JAX's CUDA build.
#   bash experiments/gpu_check.sh [GRAPH]    # GRAPH: an npz, or the default synthetic one
set -u
graph=${1:-synthetic:nodes=200k,edges=4M,kind=uniform,feat=100,classes=47,seed=0}
python "$(dirname "$0")/gpu_kernel_check.py" || exit 1
for extra in "" "--precision bf16" "--batch-size 8192"; do
    jgraph bench train "$graph" --devices 1 --epochs 5 --json $extra | tail -1
done
for impl in xla pallas; do
    jgraph bench sample "$graph" --devices 1 --epochs 5 --impl $impl --json | tail -1
done
jgraph train experiments/sage_cora.yaml --workdir /tmp/jgraph_gpu_cora --fresh --quiet | tail -1
