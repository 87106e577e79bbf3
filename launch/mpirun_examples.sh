#!/usr/bin/env bash
# mpirun command lines for jgraph under Open MPI: examples to copy from, not a script to
# run as it is. Placeholders: NODE0, NODE1 (host names; NODE0 is where you run mpirun),
# PORT, /path/to/... (PARTS and WORKDIR must be on storage every host sees), DATASET,
# CONFIG. See launch/README.md.
#
# jgraph recognises mpirun (OMPI_COMM_WORLD_SIZE > 1) and calls jax.distributed itself.
# JAX finds the coordinator and the process ids of Open MPI 4.x; for Open MPI 5 and other
# launchers use the wrapper of example 4.
set -euo pipefail

echo "launch/mpirun_examples.sh holds examples: copy a command and fill in its placeholders" >&2
exit 2

CONFIG=experiments/CONFIG.yaml                  # placeholder
PARTS=/path/to/shared/parts/NAME-8              # placeholder
WORKDIR=/path/to/shared/runs/NAME-2x4           # placeholder

# -- 1. Partition once, on one host, into as many partitions as the job has devices ------
# (2 hosts x 4 GPUs = 8; --symmetrize / --add-reverse to match the config's data.*.)
jgraph partition /path/to/DATASET.npz --num-parts 8 --out "$PARTS"
# A graph larger than one host's memory, in the chunked format (`jgraph convert`): both
# hosts partition it together, each its share, in bounded memory (CHUNKED and PARTS on
# storage both see; plan it first with `jgraph partition --plan CHUNKED --num-parts 8
# --processes 2`).
mpirun -np 2 -H NODE0:1,NODE1:1 --map-by ppr:1:node --bind-to none -x PATH \
    jgraph partition /path/to/shared/CHUNKED --num-parts 8 --out "$PARTS"

# -- 2. Open MPI 4.x, one process per host with all 4 of its GPUs -----------------------
# Run on NODE0: JAX takes the coordinator address from mpirun's host, and rank 0 runs it.
# --bind-to none: otherwise Open MPI pins each process (and XLA's threads) to a core or
# socket. -x passes environment variables on; JAX_LOCAL_DEVICE_IDS gives each process
# all its GPUs (without it, JAX gives it the GPU numbered by its local rank only).
mpirun -np 2 -H NODE0:1,NODE1:1 --map-by ppr:1:node --bind-to none \
    -x PATH -x LD_LIBRARY_PATH -x JAX_LOCAL_DEVICE_IDS=0,1,2,3 \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8

# -- 3. Open MPI 4.x, one process per GPU --------------------------------------------------
# The process with OMPI_COMM_WORLD_LOCAL_RANK i uses GPU i.
mpirun -np 8 -H NODE0:4,NODE1:4 --map-by ppr:4:node --bind-to none \
    -x PATH -x LD_LIBRARY_PATH \
    jgraph train "$CONFIG" --workdir "$WORKDIR" --set data.path="$PARTS" data.num_parts=8
# Optional: -x JAX_COORDINATOR_PORT=PORT picks the coordinator's port (default: derived
# from the job id, between 61440 and 65535).

# -- 4. Open MPI 5 (or another launcher): set what python -m jgraph.launch would ---------
# jgraph joins the job from JAX_COORDINATOR_ADDRESS (rank 0's host and a free port),
# JGRAPH_NUM_PROCESSES and JGRAPH_PROCESS_ID; JAX_LOCAL_DEVICE_IDS picks the GPUs.
# The single quotes matter: the variables are expanded by each process, not here.
mpirun -np 8 -H NODE0:4,NODE1:4 --map-by ppr:4:node --bind-to none \
    -x PATH -x LD_LIBRARY_PATH -x JAX_COORDINATOR_ADDRESS=NODE0:PORT \
    bash -c 'JGRAPH_NUM_PROCESSES=$OMPI_COMM_WORLD_SIZE \
             JGRAPH_PROCESS_ID=$OMPI_COMM_WORLD_RANK \
             JAX_LOCAL_DEVICE_IDS=$OMPI_COMM_WORLD_LOCAL_RANK \
             exec jgraph train "$0" --workdir "$1" --set data.path="$2" data.num_parts=8' \
    "$CONFIG" "$WORKDIR" "$PARTS"

# -- 5. CPU-only hosts: 2 processes x 4 simulated CPU devices = 8 --------------------------
# --devices is per process. data.path is the config's dataset: process 0 partitions it
# into WORKDIR/partition/ (with the config's data transforms) while the other waits.
mpirun -np 2 -H NODE0:1,NODE1:1 --map-by ppr:1:node --bind-to none \
    -x PATH -x JAX_PLATFORMS=cpu \
    jgraph train experiments/sage_synthetic.yaml --devices 4 --workdir "$WORKDIR" \
    --set data.num_parts=8

# -- 6. Stopping with a checkpoint ---------------------------------------------------------
# SIGTERM or Ctrl-C to mpirun makes Open MPI terminate the processes itself (SIGTERM, then
# SIGKILL a few seconds later), which may be too soon to save. Send SIGTERM to the jgraph
# processes instead (on each host, by their process ids): they stop after the same step,
# save a checkpoint and exit with 143. Rerunning the same command resumes.
kill -TERM PID_OF_JGRAPH_PROCESS
