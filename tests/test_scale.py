"""Scale-out: results independent of topology (devices, processes, FSDP, grad accumulation),
checkpoints that reshard, the --dry_run plan, analytic FLOPs and clear batch-split errors.

Topology runs are subprocesses of tests/scale_worker.py (device count fixed at process start):
8 devices with FSDP 4x2 (saves a checkpoint), 1 device (the reference, then restores the
8-device checkpoint), 1 device with accumulation 4 x 4 rows, and 2 processes x 4 devices joined
by jax.distributed on localhost with accumulation 2 (also restores the checkpoint). All use
dropout 0.1, so per-example dropout is exercised too. XLA's CPU backend optimisations are
turned off in the workers: it halves compile time and every run shares the same flags.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import portpicker
import pytest

from electra_jax import config as config_lib
from electra_jax import flops
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import parallel
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config, xla_flags_with

WORKER = os.path.join(REPO_ROOT, 'tests', 'scale_worker.py')
STEPS, SAVE_STEP = 4, 2
# Float32 on CPU: layouts differ only in the order of float reductions (and accumulation sums
# micro-batch gradients), which moves losses by ~1e-6 relative over these steps.
RTOL = 1e-5
LOSS_KEYS = ('loss', 'mlm_loss', 'disc_loss', 'mlm_accuracy', 'sampled_accuracy',
             'disc_accuracy', 'replaced_fraction')


def start(spec, num_devices):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT,
             XLA_FLAGS=xla_flags_with(f'--xla_force_host_platform_device_count={num_devices}'))
  return subprocess.Popen([sys.executable, WORKER, REPO_ROOT, json.dumps(spec)], env=env,
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def finish(proc):
  stdout, stderr = proc.communicate(timeout=600)
  if proc.returncode:
    raise AssertionError(f'worker failed ({proc.returncode}):\n{stdout}\n{stderr[-4000:]}')
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  ckpt = str(tmp_path_factory.mktemp('scale') / 'checkpoints')
  spec = dict(steps=STEPS, save_step=SAVE_STEP, fsdp=1, accum=1)
  out = {'fsdp8': finish(start(dict(spec, fsdp=2, save=ckpt), 8))}
  port = portpicker.pick_unused_port()
  procs = {
      'one': start(dict(spec, restore=ckpt), 1),
      'accum1': start(dict(spec, accum=4), 1),
      'proc0': start(dict(spec, accum=2, restore=ckpt, interleave=True,
                          process=[f'localhost:{port}', 2, 0]), 4),
      'proc1': start(dict(spec, accum=2, restore=ckpt, interleave=True,
                          process=[f'localhost:{port}', 2, 1]), 4),
  }
  out.update({name: finish(p) for name, p in procs.items()})
  return out


def assert_same_losses(a, b):
  assert sorted(a) == sorted(b)
  for step in a:
    for key in LOSS_KEYS:
      assert a[step][key] == pytest.approx(b[step][key], rel=RTOL, abs=1e-7), (step, key)


def test_runs_used_the_intended_topologies(runs):
  assert runs['fsdp8']['mesh'] == {'data': 4, 'fsdp': 2}
  assert (runs['fsdp8']['devices'], runs['one']['devices']) == (8, 1)
  assert (runs['proc0']['devices'], runs['proc0']['processes']) == (8, 2)
  assert runs['proc0']['mesh'] == {'data': 8}
  # As on a TPU slice: each process's rows of the batch are not one block.
  assert runs['proc0']['mesh_processes'] == [0, 1] * 4


@pytest.mark.parametrize('name', ['fsdp8', 'accum1', 'proc0', 'proc1'])
def test_losses_match_one_device_step_by_step(runs, name):
  assert_same_losses(runs[name]['losses'], runs['one']['losses'])
  np.testing.assert_allclose(runs[name]['fingerprint'], runs['one']['fingerprint'],
                             rtol=1e-4, atol=1e-5)


def test_steps_differ_from_each_other(runs):
  # Guards the comparisons above against a run that never updates or reuses one batch.
  losses = [runs['one']['losses'][str(s)]['loss'] for s in range(1, STEPS + 1)]
  assert len(set(losses)) == STEPS


@pytest.mark.parametrize('name', ['one', 'proc0', 'proc1'])
def test_checkpoint_from_8_devices_restores_on_other_topologies(runs, name):
  run = runs[name]
  assert run['restored_sharding_ok']
  # Fingerprints are sums, reduced in a layout-dependent order.
  np.testing.assert_allclose(run['restored_fingerprint'], runs['fsdp8']['saved_fingerprint'],
                             rtol=1e-5, atol=1e-6)
  # Resumed steps equal the uninterrupted run's.
  resumed = run['restored_losses']
  assert sorted(resumed) == [str(s) for s in range(SAVE_STEP + 1, STEPS + 1)]
  assert_same_losses(resumed, {s: runs['one']['losses'][s] for s in resumed})


def test_batch_not_divisible_by_devices_times_accumulation_is_one_clear_error():
  mesh = parallel.make_mesh()
  parallel.check_batch_divides(12, mesh, 'config.train_batch_size', 4)
  with pytest.raises(UserError, match=r'train_batch_size=10 .*grad_accum_steps=4.*multiple'):
    parallel.check_batch_divides(10, mesh, 'config.train_batch_size', 4)
  n = jax.device_count() + 1
  with pytest.raises(UserError, match=f'fsdp_axis_size={n} does not divide'):
    parallel.make_mesh(fsdp_axis_size=n)


def test_evaluation_reads_a_run_on_devices_its_fsdp_axis_and_train_batch_do_not_divide():
  """A run trained with fsdp_axis_size=4 and a train batch of 6 is evaluated on 1 device
  (evaluate: training=False); training there is refused."""
  from electra_jax import experiment  # pylint: disable=import-outside-toplevel
  config = tiny_config(fsdp_axis_size=4, train_batch_size=6, grad_accum_steps=3)
  one = jax.devices()[:1]
  run = experiment.Experiment.create(config, one, read_vocab=False, training=False)
  assert dict(run.mesh.shape) == {'data': 1}
  assert run.config.fsdp_axis_size == 4  # The run's config, as saved.
  with pytest.raises(UserError, match='fsdp_axis_size=4 does not divide the 1 devices'):
    experiment.Experiment.create(config, one, read_vocab=False)


def test_fsdp_rule_splits_the_largest_divisible_dimension():
  P = jax.sharding.PartitionSpec
  mesh = jax.sharding.AbstractMesh((2, 4), ('data', 'fsdp'))
  assert parallel.leaf_sharding(mesh, (64, 16)).spec == P('fsdp', None)
  assert parallel.leaf_sharding(mesh, (16, 1024)).spec == P(None, 'fsdp')
  assert parallel.leaf_sharding(mesh, (30, 8)).spec == P(None, 'fsdp')
  assert parallel.leaf_sharding(mesh, (3, 5)).spec == P()
  assert parallel.leaf_sharding(mesh, ()).spec == P()
  data_only = jax.sharding.AbstractMesh((8,), ('data',))
  assert parallel.leaf_sharding(data_only, (64, 16)).spec == P()


def test_an_fsdp_axis_dividing_no_width_leaves_most_bytes_whole():
  """fsdp_axis_size=3 splits no array of width 1024 or 4096, only the 30,522-row embedding (Large
  kept 91 % of its bytes whole): train warns above parallel.UNSPLIT_WARNING, where it said
  nothing."""
  large = {'kernel': jax.ShapeDtypeStruct((1024, 4096), jnp.float32),
           'embedding': jax.ShapeDtypeStruct((30522, 1024), jnp.float32),
           'bias': jax.ShapeDtypeStruct((1024,), jnp.float32)}
  split_by = lambda k: parallel.unsplit_fraction(jax.sharding.AbstractMesh((1, k),
                                                                           ('data', 'fsdp')), large)
  total = 1024 * 4096 + 30522 * 1024 + 1024
  assert split_by(2) == 0.0
  assert split_by(3) == pytest.approx((1024 * 4096 + 1024) / total)
  assert split_by(5) == 1.0 > parallel.UNSPLIT_WARNING
  assert split_by(3) < parallel.UNSPLIT_WARNING  # The embedding dominates this tree.


@pytest.mark.parametrize('overrides', [
    dict(hidden_size=256, embedding_size=128, intermediate_size=1024, num_heads=4,
         max_seq_length=128, vocab_size=4000, generator_hidden_size=0.25),
    dict(hidden_size=128, embedding_size=128, intermediate_size=512, num_heads=2,
         max_seq_length=256, vocab_size=1000, generator_hidden_size=0.5),
])
def test_analytic_flops_match_xla_cost_analysis(overrides):
  """XLA's count of the whole gradient step (dots plus elementwise work) is a few % above."""
  c = config_lib.resolve(tiny_config(train_batch_size=4, **overrides))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  objective = objectives.build(model, c, (0, 2, 3, 4), 4)
  params = jax.eval_shape(lambda r: model_lib.init_params(
      model, r, c.max_seq_length, c.max_predictions_per_seq), jax.random.key(0))
  batch = {k: jax.ShapeDtypeStruct((c.train_batch_size, c.max_seq_length), jnp.int32)
           for k in ('input_ids', 'input_mask', 'segment_ids')}
  grad = jax.grad(lambda p, b: objective(p, b, jax.random.key(0))[0])
  xla = jax.jit(grad).lower(params, batch).cost_analysis()['flops']
  analytic = flops.model_flops_per_step(c)
  assert 0.9 * xla < analytic <= xla


def test_dry_run_plans_large_on_8_devices_without_allocating(tmp_path):
  workdir = tmp_path / 'never_written'
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT,
             XLA_FLAGS=xla_flags_with('--xla_force_host_platform_device_count=8'))
  cmd = [sys.executable, '-m', 'electra_jax.train', '--config=configs/large.py',
         f'--workdir={workdir}', '--dry_run', '--config.fsdp_axis_size=4',
         '--config.grad_accum_steps=4']
  proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=300, check=True)
  plan = json.loads(proc.stdout.strip().splitlines()[-1])
  assert plan['mesh_shape'] == {'data': 2, 'fsdp': 4} and plan['num_devices'] == 8
  assert (plan['global_batch'], plan['per_host_batch'], plan['per_device_batch'],
          plan['per_device_micro_batch']) == (2048, 2048, 256, 64)
  assert 330e6 < plan['num_params'] < 340e6
  # FSDP 4: a quarter of the float32 parameters per device (a few small leaves replicate).
  full = plan['num_params'] * 4
  assert full / 4 <= plan['param_bytes_per_device'] < full / 4 * 1.01
  assert plan['optimizer_bytes_per_device'] == pytest.approx(
      2 * plan['param_bytes_per_device'], rel=1e-3)
  from configs import large  # pylint: disable=import-outside-toplevel
  c = config_lib.resolve(large.get_config())
  assert plan['model_flops_per_step'] == pytest.approx(flops.model_flops_per_step(c))
  assert 'mesh        data=2 x fsdp=4' in proc.stdout
  assert not workdir.exists()
  bad = subprocess.run(cmd + ['--config.grad_accum_steps=3'], env=env, cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2
  assert 'train_batch_size=2048 is not divisible by the 8 devices x' in bad.stderr
