"""Counts how often a finished 2-process run exits non-zero: N times, the two ranks of
`train --config=configs/demo.py --dry_run --cpu_devices=2` as an srun step on localhost (the
environments of tests/test_distributed.py's launcher test, a fresh port each time).

  python benchmarks/multiprocess_exit.py [N=100]

Session 32 saw process 0 abort (-6) once in JAX's shutdown of the coordination service;
benchmarks/RESULTS.md (session 33) has the counts. Prints each failure's last error lines, then
one summary line.
"""
import collections
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import portpicker  # pylint: disable=wrong-import-position

from tests.test_distributed import as_rank, srun_task, REPO_ROOT  # pylint: disable=wrong-import-position


def main():
  if len(sys.argv) > 2 or len(sys.argv) == 2 and not sys.argv[1].isdigit():
    sys.exit(f'usage: python {sys.argv[0]} [N=100] (N: a whole number of runs)')
  runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
  failures = collections.Counter()
  start = time.time()
  for i in range(runs):
    port = portpicker.pick_unused_port()
    procs = [subprocess.Popen(
        [sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py', '--dry_run',
         '--cpu_devices=2'], cwd=REPO_ROOT,
        env=as_rank(dict(srun_task(2, rank), JAX_COORDINATOR_PORT=str(port))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    for rank, (proc, (_, err)) in enumerate(zip(procs, [p.communicate(timeout=300)
                                                        for p in procs])):
      if proc.returncode:
        failures[f'rank {rank} exit {proc.returncode}'] += 1
        lines = [line for line in err.splitlines() if 'Check failed' in line or 'rror' in line]
        print(f'run {i} rank {rank} exit {proc.returncode}: {lines[-3:]}', flush=True)
  print(f'{runs} runs in {time.time() - start:.0f}s, failures: {dict(failures)}', flush=True)


if __name__ == '__main__':
  main()
