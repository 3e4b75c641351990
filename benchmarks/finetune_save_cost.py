"""Seconds one fine-tuning resume save takes (a classification run's train state: parameters and
AdamW moments, 30,522-token vocabulary), saved synchronously 4 times, as run_seed does at every
epoch end. From the repository root:

  PYTHONPATH=. python benchmarks/finetune_save_cost.py small|base|large [DIR]

It saves into a new temporary folder inside the local DIR (default: the system's temporary
directory, e.g. a disk's mount point to time that disk) and removes only that folder.
"""
import os
import shutil
import sys
import tempfile
import time

import jax
import numpy as np

from configs.finetune import glue
from electra_jax import checkpoint
from electra_jax import model as model_lib
from electra_jax import parallel
from electra_jax.finetune import loop, pretrained, settings, tasks


def main(size: str, directory: str):
  c = glue.get_config()
  c.model_size = size
  model_config = pretrained.with_run_settings(
      model_lib.ModelConfig.from_config(pretrained.config_for_size(size, 30522)), c)
  task = tasks.get_task('sst2')
  c = settings.resolve(c, task, model_config.hidden_size)
  model = loop.make_model(task, model_config)
  rows = dict(input_ids=np.zeros((2, 128), np.int32), segment_ids=np.zeros((2, 128), np.int32),
              input_mask=np.ones((2, 128), np.int32), label=np.zeros((2,), np.int32))
  mesh = parallel.make_mesh()
  sample = jax.eval_shape(lambda: loop.init_params(model, rows, jax.random.key(0)))
  trainer = loop.make_trainer(c, task, model, model_config, sample, 100, mesh)
  params = loop.init_params(model, rows, jax.random.key(0))
  state = trainer.init_state(jax.device_put(params, parallel.replicated(mesh)))
  os.makedirs(directory, exist_ok=True)
  scratch = tempfile.mkdtemp(prefix='finetune_save_cost_', dir=directory)
  ckpt = checkpoint.Checkpointer(scratch, keep=1, async_save=False)
  seconds = []
  for step in range(1, 5):
    start = time.time()
    ckpt.save(step, state, force=True, loop_state={'epoch': step})
    seconds.append(time.time() - start)
  ckpt.close()
  shutil.rmtree(scratch, ignore_errors=True)
  count = sum(x.size for x in jax.tree.leaves(state.params))
  print(f'{size}: {count / 1e6:.1f}M parameters, state {checkpoint.size_bytes(state) / 2**20:.0f} '
        f'MiB, seconds a save: ' + ', '.join(f'{s:.2f}' for s in seconds))


SIZES = ('small', 'base', 'large')

if __name__ == '__main__':
  if not 2 <= len(sys.argv) <= 3 or sys.argv[1] not in SIZES:
    sys.exit(f"usage: PYTHONPATH=. python {sys.argv[0]} {'|'.join(SIZES)} [DIR]")
  main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tempfile.gettempdir())
