"""--cpu_devices: how many XLA CPU devices a run splits into, chosen before JAX starts."""
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from electra_jax import cpu_devices
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, saved_state
from tests.test_train_cli import (  # pylint: disable=unused-import
    TINY_FLAGS, run_cli, small_corpus)


@pytest.mark.parametrize('cores, batches, multiple_of, expected', [
    (2, [32, 32], 1, 2),
    (8, [12], 1, 6),     # the most cores that divide the batch
    (16, [64], 1, 8),    # capped at AUTO_MAX
    (3, [32, 8], 1, 2),
    (2, [7], 1, 1),      # nothing divides: one device
    (4, [24, 18], 1, 3),  # divides every batch (train and eval)
    (3, [32], 2, 2),     # a multiple of config.fsdp_axis_size
    (2, [32], 4, 1),
])
def test_auto_count(cores, batches, multiple_of, expected):
  assert cpu_devices.auto_count(cores, batches, multiple_of) == expected


def test_parse():
  assert cpu_devices.parse('auto') is None
  assert cpu_devices.parse('3') == 3
  for bad in ('0', '-2', 'two', ''):
    with pytest.raises(UserError, match=f"--cpu_devices='{bad}' is not a positive number"):
      cpu_devices.parse(bad)


def test_preset_count_reads_xla_flags():
  assert cpu_devices.preset_count(
      {'XLA_FLAGS': '--xla_cpu_use_onednn=true --xla_force_host_platform_device_count=8'}) == 8


def _configure_in_fresh_process(value, batches, extra_env=None):
  """configure() then the CPU device count JAX runs, in a process where JAX has not started."""
  code = ('import json, sys, jax\n'
          'from electra_jax import cpu_devices\n'
          'from electra_jax.errors import UserError\n'
          'try:\n'
          f'  got = cpu_devices.configure({value!r}, {batches!r})\n'
          'except UserError as e:\n'
          '  print(json.dumps({"error": str(e)})); sys.exit(0)\n'
          'print(json.dumps({"set": got, "devices": len(jax.devices())}))\n')
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'JAX_NUM_CPU_DEVICES')}
  env.update(JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT, **(extra_env or {}))
  proc = subprocess.run([sys.executable, '-c', code], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=120, check=True)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_configure_sets_the_device_count_before_jax_starts():
  assert _configure_in_fresh_process('3', [12]) == {'set': 3, 'devices': 3}
  assert _configure_in_fresh_process('1', [12]) == {'set': 1, 'devices': 1}
  auto = cpu_devices.auto_count(cpu_devices.usable_cores(), [12])
  assert _configure_in_fresh_process('auto', [12]) == {'set': auto if auto > 1 else None,
                                                       'devices': auto}
  # A count the user set through JAX's own settings wins over auto ...
  preset = {'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
  assert _configure_in_fresh_process('auto', [12], preset) == {'set': None, 'devices': 4}
  assert _configure_in_fresh_process('auto', [12], {'JAX_NUM_CPU_DEVICES': '4'}) == {
      'set': None, 'devices': 4}
  # ... and a different explicit count is a one-line error, not a silent choice.
  out = _configure_in_fresh_process('2', [12], preset)
  assert out['error'].startswith('--cpu_devices=2 contradicts the 4 CPU devices')
  # The count JAX runs: $JAX_NUM_CPU_DEVICES over XLA_FLAGS, a repeated flag's last value.
  both = dict(preset, JAX_NUM_CPU_DEVICES='2')
  assert _configure_in_fresh_process('2', [12], both) == {'set': None, 'devices': 2}
  repeated = {'XLA_FLAGS': '--xla_force_host_platform_device_count=2 '
                           '--xla_force_host_platform_device_count=4'}
  out = _configure_in_fresh_process('2', [12], repeated)
  assert out['error'].startswith('--cpu_devices=2 contradicts the 4 CPU devices')


def test_configure_after_jax_started():
  import jax  # pylint: disable=import-outside-toplevel
  running = len(jax.devices('cpu'))
  assert cpu_devices.configure('auto', [running * 2]) is None  # left alone
  with pytest.raises(UserError, match='must be set before JAX starts'):
    cpu_devices.configure(str(running + 1), [64])


def test_train_dry_run_splits_the_demo_batch(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'JAX_NUM_CPU_DEVICES')}
  env.update(JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT)
  cmd = [sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py',
         f'--workdir={tmp_path / "w"}', '--dry_run']
  plans = {}
  for value in ('4', '1', 'auto'):
    proc = subprocess.run(cmd + [f'--cpu_devices={value}'], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    plans[value] = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = proc.stdout
  from configs import demo  # pylint: disable=import-outside-toplevel
  c = demo.get_config()
  assert plans['4']['num_devices'] == 4 and plans['1']['num_devices'] == 1
  assert plans['4']['per_device_batch'] * 4 == c.train_batch_size
  # The demo's step in units that show it (16.5 GFLOP, not 0.000 PFLOP).
  assert plans['auto']['model_flops_per_step'] == pytest.approx(16.54e9, rel=1e-3)
  per_device = plans['auto']['model_flops_per_step_per_device'] / 1e9
  assert re.search(r'^compute +16\.5 GFLOP per step \(model FLOPs, fwd\+bwd\), '
                   f'{per_device:.3g} GFLOP per device$', lines, re.M), lines
  assert plans['auto']['num_devices'] == cpu_devices.auto_count(
      cpu_devices.usable_cores(), [c.train_batch_size, c.eval_batch_size])
  bad = subprocess.run(cmd + ['--cpu_devices=5'], env=env, cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=300)
  assert bad.returncode == 2
  assert f'train_batch_size={c.train_batch_size} is not divisible by the 5 devices' in bad.stderr


# slow: elastic resume runs by default in tests/test_resilience.py and tests/test_gcs.py.
@pytest.mark.slow
def test_resuming_on_another_device_count_continues_the_same_run(tmp_path, small_corpus):
  """2 devices for 3 steps, then 1 device to step 6 == 4 devices for 6 steps (up to the order of
  float sums); every checkpoint reads back on this 1-device process, for fine-tuning too."""
  from electra_jax.finetune import pretrained  # pylint: disable=import-outside-toplevel
  flags = ['--config=configs/demo.py', f'--config.train_files={small_corpus}', *TINY_FLAGS,
           '--config.num_train_steps=6', '--config.dropout_rate=0.1']
  resumed, straight = str(tmp_path / 'resumed'), str(tmp_path / 'straight')
  run_cli('electra_jax.train', *flags, f'--workdir={resumed}', '--stop_after_steps=3',
          '--cpu_devices=2')
  second = run_cli('electra_jax.train', *flags, f'--workdir={resumed}', '--cpu_devices=1')
  assert 'Resuming from step 3' in second.stdout and '| 1 device(s) cpu |' in second.stdout
  run_cli('electra_jax.train', *flags, f'--workdir={straight}', '--cpu_devices=4')
  a, b = (jax.tree_util.tree_leaves_with_path(saved_state(w, 6)) for w in (resumed, straight))
  assert [p for p, _ in a] == [p for p, _ in b] and len(a) > 20
  for (path, x), (_, y) in zip(a, b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
  params, _ = pretrained.load_pretrained(straight)  # saved on 4 devices, read on 1
  assert params['embeddings']['word_embeddings'].shape[1] == 16
