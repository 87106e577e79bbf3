#!/usr/bin/env bash
# srun command lines for jgraph under SLURM: examples to copy from, not a script to run
# as it is. Placeholders: /path/to/... (PARTS and WORKDIR must be on storage every node
# sees), DATASET, CONFIG, and the node and GPU counts. See launch/README.md; for batch
# jobs with checkpoint-before-time-limit and requeue, launch/slurm.sbatch.
#
# jgraph recognises SLURM by itself (SLURM_NTASKS > 1 and SLURM_PROCID set) and joins
# the job through jax.distributed: srun only has to start the same command on every task.
set -euo pipefail

echo "launch/srun_examples.sh holds examples: copy a command and fill in its placeholders" >&2
exit 2

CONFIG=experiments/CONFIG.yaml                  # placeholder
PARTS=/path/to/shared/parts/NAME-8              # placeholder
WORKDIR=/path/to/shared/runs/NAME-2x4           # placeholder

# -- 1. Partition once, on one host, into as many partitions as the job has devices ------
# Here 2 nodes x 4 GPUs = 8. A partition directory is used as it is: pass the flags that
# match the config's data.symmetrize / data.reverse_relations (--symmetrize,
# --add-reverse); data.normalize_features has no partitioner flag (train from the
# dataset itself, example 5, to apply it).
jgraph partition /path/to/DATASET.npz --num-parts 8 --out "$PARTS"

# A graph larger than one host's memory, in the chunked format (`jgraph convert`): every
# task partitions its share, in bounded memory (CHUNKED and PARTS on storage every task
# sees; the work directory PARTS.work goes beside PARTS). Plan it first:
#   jgraph partition --plan /path/to/shared/CHUNKED --num-parts 8 --processes 4
srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1 \
    jgraph partition /path/to/shared/CHUNKED --num-parts 8 --out "$PARTS"

# -- 2. Interactive allocation, one task per node with all 4 of its GPUs ------------------
#   salloc --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 --time=02:00:00
# JAX_LOCAL_DEVICE_IDS: without it each task would use GPU 0 only.
JAX_LOCAL_DEVICE_IDS=0,1,2,3 srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8

# -- 3. One task per GPU --------------------------------------------------------------------
#   salloc --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --time=02:00:00
# JAX gives the task with SLURM_LOCALID i GPU i. Same mesh of 8, same partitions.
srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8
# Where the site gives each task only its own GPU (CUDA_VISIBLE_DEVICES holds one),
# that GPU is device 0 inside the task:
JAX_LOCAL_DEVICE_IDS=0 srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8

# -- 4. Without an allocation: srun asks for one itself ----------------------------------
# --signal=TERM@120: SIGTERM to every task 120 s before the time limit, so the run saves a
# checkpoint and exits with 143 instead of being killed.
JAX_LOCAL_DEVICE_IDS=0,1,2,3 srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 \
    --time=02:00:00 --signal=TERM@120 --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8

# -- 5. CPU-only cluster: 2 nodes x 1 task x 4 simulated CPU devices = 8 -------------------
# --devices is per process. data.path is the config's dataset here: process 0 partitions
# it into WORKDIR/partition/ (with the config's data transforms) while the others wait.
JAX_PLATFORMS=cpu srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=16 \
    --kill-on-bad-exit=1 \
    jgraph train experiments/sage_synthetic.yaml --devices 4 --workdir "$WORKDIR" \
    --set data.num_parts=8

# -- 6. Resume, extend, start over ---------------------------------------------------------
# The same command on the same WORKDIR resumes from the newest checkpoint, on any layout
# with the same number of devices (here: 8 tasks of 1 GPU instead of 2 of 4).
srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8
# --resume: fail if there is no checkpoint. Raising train.epochs trains on from it.
srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --resume \
    --set data.path="$PARTS" data.num_parts=8 train.epochs=100
# --fresh: delete WORKDIR's checkpoints and start over.
srun --kill-on-bad-exit=1 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --fresh \
    --set data.path="$PARTS" data.num_parts=8

# -- 7. Stop a running job with a checkpoint -----------------------------------------------
# SIGTERM to its tasks: they stop after the same step, save, and exit with 143.
scancel --signal=TERM JOBID

# -- 8. Score the trained model again, on the same number of devices -----------------------
# Every task runs the evaluation; each prints the scores.
JAX_LOCAL_DEVICE_IDS=0,1,2,3 srun --kill-on-bad-exit=1 jgraph eval "$WORKDIR"
