#!/usr/bin/env bash
# jgraph on one GPU: the compiled draw kernel against its reference, the training
# bench on the 200k-node / 4M-edge graph (f32, bf16, batch 8192), the sampler with
# either draw, and each kind of job on one GPU (sampled, full-batch, control-variate and
# link-prediction training, GAT, R-GCN, label propagation, Correct & Smooth), each one's
# last line. Needs jgraph with JAX's CUDA build.
#   bash experiments/gpu_check.sh [GRAPH [DATA]]
# GRAPH: an npz, or the default synthetic one; DATA: the folder of aifb.npz and
# facebook_musae.npz (the jobs on those graphs are skipped, saying so, without it).
set -u
graph=${1:-synthetic:nodes=200k,edges=4M,kind=uniform,feat=100,classes=47,seed=0}
python "$(dirname "$0")/gpu_kernel_check.py" || exit 1
for extra in "" "--precision bf16" "--batch-size 8192"; do
    jgraph bench train "$graph" --devices 1 --epochs 5 --json $extra | tail -1
done
for impl in xla pallas; do
    jgraph bench sample "$graph" --devices 1 --epochs 5 --impl $impl --json | tail -1
done
here=$(cd "$(dirname "$0")" && pwd)
data=${2:-}
job() {  # NAME CONFIG [--set ...]: one run's last line, its seconds beside it
    local name=$1 config=$2 start=$SECONDS
    shift 2
    echo "$name: $(jgraph train "$here/$config" --workdir "/tmp/jgraph_gpu/$name" --fresh \
        --quiet "$@" | tail -1) ($((SECONDS - start)) s)"
}
job sage_cora sage_cora.yaml
job sage_cora_smoothed sage_cora.yaml --set smooth.after_training=true
job label_propagation sage_cora.yaml --set model.kind=label_propagation model.num_layers=50
job full_sage_cora full_sage_cora.yaml
job full_gat_cora full_gat_cora.yaml
job cv_sage_cora cv_sage_cora.yaml
if [ -n "$data" ]; then
    job rgcn_aifb rgcn_aifb.yaml --set data.path="$data/aifb.npz"
    job lp_sage_facebook lp_sage_facebook.yaml --set data.path="$data/facebook_musae.npz"
else
    echo "rgcn_aifb, lp_sage_facebook: skipped (no DATA folder given)"
fi
