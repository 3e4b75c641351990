"""Data parallelism: the same steps on 1 and on 8 (forced host) devices give the same numbers."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, xla_flags_with

SCRIPT = r'''
import json, sys
import jax, numpy as np
sys.path.insert(0, sys.argv[1])
from electra_jax import parallel
from electra_jax.objectives import metrics as objective_metrics
from tests.conftest import tiny_trainer
from tests.test_model_objective import toy_batch
c, _, state, step, mesh = tiny_trainer(dropout_rate=0.1, attention_dropout_rate=0.1)
losses = []
for i in range(4):
  batch = parallel.global_batch(jax.device_get(toy_batch(c, seed=i)), mesh)
  assert len(batch['input_ids'].sharding.device_set) == jax.device_count()
  state, sums = step(state, batch, jax.random.key(1))
  losses.append(objective_metrics.summarize(jax.device_get(sums), 1.0, 50.0))
kernel = np.asarray(state.params['discriminator']['head']['dense']['kernel'])
print(json.dumps(dict(devices=jax.device_count(), losses=losses, kernel=kernel.ravel()[:64].tolist())))
'''


def run_on(num_devices):
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags_with(f'--xla_force_host_platform_device_count={num_devices}'))
  out = subprocess.run([sys.executable, '-c', SCRIPT, REPO_ROOT], env=env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


# slow: tests/test_scale.py checks the same equality per layout in the default run.
@pytest.mark.slow
def test_one_and_eight_devices_give_the_same_steps():
  one, eight = run_on(1), run_on(8)
  assert (one['devices'], eight['devices']) == (1, 8)
  # Masking, sampling and dropout are drawn for the global batch: only the order of float
  # reductions differs between layouts.
  for a, b in zip(one['losses'], eight['losses']):
    for key in ('loss', 'mlm_loss', 'disc_loss', 'disc_auc', 'replaced_fraction'):
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
  assert one['kernel'] == pytest.approx(eight['kernel'], rel=1e-3, abs=1e-5)
