"""Training as one JAX job of several processes (hosts), here all on this machine.

    python examples/multi_process.py [--processes 2] [--devices-per-process 2]

Run as it is, it starts itself under `python -m jgraph.launch`, which runs one process
per host with a coordinator on localhost; on a cluster, start this script once per
host with `srun` or `mpirun` (or the launcher on each host) instead. Every process calls
`jgraph.use_devices`, which joins the job, and then runs the same program: each loads
only its own devices' partitions, the collectives cross processes (gloo on CPU, NCCL on
GPUs), and the first process writes the run's files. Prints (this machine, 2 processes
x 2 simulated devices, 58 seconds; the launcher prefixes each line with its rank, and
gloo adds lines of its own):

    [rank 0] 4 devices in 2 processes; this process has devices 0..1
    [rank 0] test_acc 0.814
"""
import argparse
import subprocess
import sys

import jgraph
from jgraph.cli.devices import distributed_env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--workdir", default="runs/multi_process")
    args = parser.parse_args()
    if distributed_env() is None:             # not in a job yet: start one, of this script
        return subprocess.call([
            sys.executable, "-m", "jgraph.launch", "--num-processes", str(args.processes),
            "--devices-per-process", str(args.devices_per_process), "--",
            sys.executable, __file__, *sys.argv[1:]])

    jgraph.use_devices(args.devices_per_process)   # joins the job, then its devices
    import jax
    first = jax.process_index() == 0
    if first:
        mine = [d.id for d in jax.local_devices()]
        print(f"{jax.device_count()} devices in {jax.process_count()} processes; this "
              f"process has devices {mine[0]}..{mine[-1]}", flush=True)
    result = jgraph.train("experiments/sage_cora.yaml", args.workdir, overrides=[
        f"data.num_parts={jax.device_count()}", f"train.epochs={args.epochs}"],
        resume="fresh", progress=False)
    if first:
        print(f"test_acc {result['test_acc']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
