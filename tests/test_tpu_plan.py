"""train --dry_run --topology: the real step compiled for a TPU slice by libtpu, without a TPU.

libtpu comes with the test extra (jax[tpu]). Where it is missing these tests skip, except under
CI (`$CI` set, as .ci/run does), where a missing libtpu is a failure, never a silent skip.
"""
import dataclasses
import importlib.util
import os

import numpy as np
import pytest

from electra_jax import chips
from electra_jax import dry_run
from electra_jax import experiment as experiment_lib
from electra_jax import flops
from electra_jax import topology
from electra_jax import tpu_plan
from electra_jax.errors import UserError
from tests.conftest import tiny_config
from tests.test_train_cli import last_json, run_cli

HAS_LIBTPU = importlib.util.find_spec('libtpu') is not None


@pytest.fixture
def libtpu():
  if not HAS_LIBTPU:
    if os.environ.get('CI'):
      pytest.fail("libtpu is missing under CI; the test extra installs it: "
                  "pip install -e '.[test]'")
    pytest.skip("needs libtpu: pip install -e '.[test]'")


@pytest.fixture(scope='module')
def v4_2x2x1():
  """(chip, libtpu name, the 4 devices) of the smallest v4 slice."""
  if not HAS_LIBTPU:
    return None
  chip, name = topology.parse('v4-8')
  return chip, name, topology.devices(chip, name)


@pytest.mark.parametrize('name, expected', [
    ('v4:8x8x8', 'v4:8x8x8'), ('v4-8', 'v4:2x2x1'), ('v4-128', 'v4:4x4x4'),
    ('v4-256', 'v4:4x4x8'), ('v4-512', 'v4:4x8x8'), ('v5p-128', 'v5p:4x4x4'),
    ('v5p-512', 'v5p:4x8x8'), ('V5litepod-256', 'v5e:16x16'), ('v5e:2x4', 'v5e:2x4'),
    ('v6e-256', 'v6e:16x16'), ('v6e-8', 'v6e:2x4')])
def test_slice_names_map_to_libtpu_shapes_counting_tensorcores_on_v4_and_v5p(name, expected):
  chip, libtpu_name = topology.parse(name)
  assert libtpu_name == expected and chip.name == expected.split(':')[0]
  cores = int(name.split('-')[1]) if '-' in name else None
  if cores:  # v4-N / v5p-N name TensorCores (2 per chip); v5litepod-N / v6e-N chips.
    assert topology.num_chips(libtpu_name) * chip.cores_per_chip == cores


@pytest.mark.parametrize('name, num_devices, num_vms', [
    ('v5litepod-1', 1, 1), ('v5litepod-4', 4, 1), ('v5litepod-8', 8, 1), ('v5litepod-16', 16, 4),
    ('v5litepod-256', 256, 64), ('v6e-1', 1, 1), ('v6e-4', 4, 1), ('v6e-8', 8, 1),
    ('v6e-16', 16, 4), ('v6e-256', 256, 64), ('v4-8', 4, 1), ('v4-16', 8, 2), ('v5p-8', 4, 1)])
def test_slice_devices_sit_in_as_many_processes_as_the_slice_has_tpu_vms(libtpu, name,
                                                                         num_devices, num_vms):
  """One process a TPU VM (Cloud TPU's v5e/v6e pages: 1x1, 2x2 and 2x4 are one VM, larger
  slices 4 chips a VM); libtpu's default of 4 chips a host refused 1x1 and split 2x4 in two."""
  del libtpu
  chip, libtpu_name = topology.parse(name)
  devices = topology.devices(chip, libtpu_name)
  assert len(devices) == num_devices
  assert len({d.process_index for d in devices}) == num_vms


def test_every_fsdp_axis_dividing_a_4x4x4_slice_gets_a_mesh(libtpu):
  """jax.make_mesh refuses an fsdp axis of 2, 8 or 32 on v4-128 (it lays mesh axes over whole
  physical ones); the mesh then splits one, so every divisor plans and trains."""
  del libtpu
  from electra_jax import parallel  # pylint: disable=import-outside-toplevel
  chip, name = topology.parse('v4-128')
  devices = topology.devices(chip, name)
  for size in (2, 4, 8, 16, 32, 64):
    mesh = parallel.make_mesh(devices, size)
    assert dict(mesh.shape) == {'data': 64 // size, 'fsdp': size}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


@pytest.mark.parametrize('name, fsdp', [('v4-32', 1), ('v5litepod-16', 1), ('v4-128', 8)])
def test_a_slices_hosts_read_the_rows_their_devices_hold_which_are_no_blocks(libtpu, name,
                                                                              fsdp):
  """jax.make_mesh interleaves a slice's hosts along the batch: each host's data pipeline reads
  process_rows, every row once over the hosts, not host h's block of rows."""
  del libtpu
  from electra_jax import parallel  # pylint: disable=import-outside-toplevel
  chip, libtpu_name = topology.parse(name)
  mesh = parallel.make_mesh(topology.devices(chip, libtpu_name), fsdp)
  batch = 4 * mesh.devices.size
  hosts = sorted({d.process_index for d in mesh.devices.flat})
  rows = [parallel.process_rows(mesh, batch, h) for h in hosts]
  np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(batch))
  held = parallel.batch_sharding(mesh).devices_indices_map((batch,))
  for h, host_rows in zip(hosts, rows):
    starts = sorted(s.start for d, (s,) in held.items() if d.process_index == h)
    assert set(starts) <= set(host_rows.tolist())
  blocks = np.arange(batch).reshape(len(hosts), -1)
  assert any((r != b).any() for r, b in zip(rows, blocks))


@pytest.mark.parametrize('name, message', [
    ('v3-8', 'not a TPU slice name'), ('tpu', 'not a TPU slice name'),
    ('v4-100', 'not a standard v4 slice'), ('v4:4x4', 'has 3 dimensions'),
    ('v4:0x4x4', 'has 3 dimensions of at least 1 chip'),
    ('v6e:2x2x2', 'has 2 dimensions')])
def test_unknown_slice_names_are_user_errors(name, message):
  with pytest.raises(UserError, match=message):
    topology.parse(name)


def test_a_chips_hbm_holds_what_its_compiler_lets_one_program_use():
  for chip in chips.TPU_CHIPS.values():
    assert chip.usable_hbm_bytes <= chip.hbm_bytes, chip.name


def test_out_of_memory_message_gives_bytes_needed_and_available():
  needed, available = tpu_plan.out_of_memory_bytes(
      'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO '
      'temporaries (32.31G) exceeds available HBM (30.75G).')
  assert needed == int(32.31 * 2**30) and available == chips.TPU_CHIPS['v4'].usable_hbm_bytes


def test_bad_topology_batch_and_missing_libtpu_are_one_line_errors(tmp_path):
  base = ['--config=configs/demo.py', '--dry_run']
  unknown = run_cli('electra_jax.train', *base, '--topology=v9-8', check=False)
  uneven = run_cli('electra_jax.train', *base, '--topology=v4-256', check=False)
  # A libtpu that cannot be imported, as on a machine without the extra.
  (tmp_path / 'libtpu').mkdir()
  (tmp_path / 'libtpu' / '__init__.py').write_text("raise ImportError('no libtpu here')\n")
  env = dict(os.environ, PYTHONPATH=f'{tmp_path}{os.pathsep}{os.environ.get("PYTHONPATH", "")}')
  missing = run_cli('electra_jax.train', *base, '--topology=v4-8', check=False, env=env)
  for proc, text in [(unknown, "--topology='v9-8' is not a TPU slice name"),
                     (uneven, 'train_batch_size=32 does not split over the 128 chips'),
                     (missing, "needs libtpu, the TPU compiler (no TPU needed); install it with "
                               "pip install -e '.[tpu]'")]:
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and text in proc.stderr


def test_demo_step_compiles_for_v4_2x2x1_with_memory_and_a_roofline(libtpu):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', '--dry_run',
                 '--topology=v4-8')
  p = last_json(proc.stdout)
  assert (p['libtpu_topology'], p['num_devices'], p['device_kind']) == ('v4:2x2x1', 4, 'TPU v4')
  assert p['mesh_shape'] == {'data': 4} and p['per_device_batch'] == 8
  # The compiled program's memory per chip: the donated state is an argument and aliases its
  # output, so it counts once; the state alone (params + Adam moments + step) is in the args.
  assert p['memory_bytes_per_chip'] == (p['argument_bytes'] + p['output_bytes'] + p['temp_bytes']
                                        + p['generated_code_bytes'] - p['alias_bytes'])
  state = p['param_bytes_per_device'] + p['optimizer_bytes_per_device']
  assert state <= p['argument_bytes'] < state * 1.05 and p['alias_bytes'] >= state
  assert p['temp_bytes'] > 0 and p['fits'] and p['usable_hbm_bytes'] == int(30.75 * 2**30)
  from configs import demo  # pylint: disable=import-outside-toplevel
  assert p['model_flops_per_step'] == pytest.approx(flops.model_flops_per_step(demo.get_config()))
  # The roofline: the slower of XLA's FLOPs at the bf16 peak and the least HBM traffic (state
  # read and written, temporaries written and read) at the HBM bandwidth.
  v4 = chips.TPU_CHIPS['v4']
  assert p['xla_flops_per_chip'] >= p['model_flops_per_step_per_device']
  assert p['min_hbm_bytes_per_chip'] == (p['argument_bytes'] + p['output_bytes']
                                         + 2 * p['temp_bytes'])
  assert p['predicted_step_s'] == pytest.approx(max(p['xla_flops_per_chip'] / v4.peak_bf16_flops,
                                                    p['min_hbm_bytes_per_chip']
                                                    / v4.hbm_bytes_per_sec))
  assert p['predicted_mfu'] == pytest.approx(
      p['model_flops_per_step_per_device'] / p['predicted_step_s'] / v4.peak_bf16_flops)
  assert 'a roofline, not a measurement' in proc.stdout and 'leaves out collectives' in proc.stdout
  assert 'E0000' not in proc.stderr  # libtpu's complaints about not being on a TPU VM


def test_small_step_compiles_and_fits_until_hbm_is_one_byte_short(libtpu, v4_2x2x1):
  """The paper's Small (width, vocabulary, generator, bf16) cut to 2 of its 12 layers: each
  layer adds the same ops, and compile time grows with them (105 s for all 12 on CI). Batch 64
  (16 per chip): at 2 per chip this 2-layer step keeps no temporaries in HBM at all."""
  from configs import small  # pylint: disable=import-outside-toplevel
  chip, name, devices = v4_2x2x1
  c = small.get_config()
  c.update(dict(num_layers=2, train_batch_size=64, eval_batch_size=8))
  exp = experiment_lib.Experiment.create(c, devices, read_vocab=False)
  compiled, oom = tpu_plan.compile_step(exp)
  assert oom is None
  memory = tpu_plan.memory(compiled, chip)
  shapes = dry_run.plan(exp)
  state = shapes['param_bytes_per_device'] + shapes['optimizer_bytes_per_device']
  # The arguments are the state (and a tiny batch), small arrays padded to the TPU's tiles.
  assert shapes['num_params'] > 2.5e6 and state <= memory['argument_bytes'] < state * 1.05
  assert memory['fits'] and memory['temp_bytes'] > 0
  just_enough = dataclasses.replace(chip, usable_hbm_bytes=memory['memory_bytes_per_chip'])
  one_short = dataclasses.replace(chip, usable_hbm_bytes=memory['memory_bytes_per_chip'] - 1)
  assert tpu_plan.memory(compiled, just_enough)['fits']
  assert not tpu_plan.memory(compiled, one_short)['fits']


# One layer, 128 sequences of 128 tokens per chip: activations dominate the step's memory (with
# 64 or fewer, XLA keeps so little in HBM that remat and batch hardly show).
ACTIVATION_HEAVY = dict(num_layers=1, hidden_size=128, num_heads=2, intermediate_size=512,
                        embedding_size=64, max_seq_length=128, train_batch_size=512,
                        eval_batch_size=8)


# slow (two minutes of libtpu compiles): the sweep's choice is checked against a table of
# outcomes below, and real compiles for the slice by the two tests above, in the default run.
@pytest.mark.slow
def test_sweep_takes_more_accumulation_where_remat_none_outgrows_hbm(libtpu, v4_2x2x1):
  chip, name, devices = v4_2x2x1
  full = tpu_plan.plan(tiny_config(**ACTIVATION_HEAVY, remat='full'), chip, name, devices)
  assert full['fits'] and full['per_device_micro_batch'] == 128
  # A chip with just the HBM this step needs: without remat it needs 2 micro-batches.
  tight = dataclasses.replace(chip, usable_hbm_bytes=full['memory_bytes_per_chip'])
  rows, best = tpu_plan.sweep(tiny_config(**ACTIVATION_HEAVY), tight, name, devices,
                              remats=('none',), fsdps=(1, 3), say=lambda *a, **k: None)
  # fsdp 3 does not divide the 4 chips and is not tried.
  assert [(r.fsdp_axis_size, r.remat, r.grad_accum_steps, r.per_device_micro_batch, r.fits)
          for r in rows] == [(1, 'none', 1, 128, False), (1, 'none', 2, 64, True)]
  whole, halves = rows
  assert best == halves
  # Memory falls with remat='full' and grows with the batch per chip, by a wide margin here.
  assert full['memory_bytes_per_chip'] < 0.8 * whole.memory_bytes_per_chip
  assert halves.memory_bytes_per_chip < 0.5 * whole.memory_bytes_per_chip


def test_sweep_prefers_the_simplest_of_equally_fast_settings_and_reports_none_fitting(
    monkeypatch):
  """The sweep's choice and report, with the compiler replaced by a table of outcomes."""
  outcomes = {  # (fsdp, remat, accum) -> (memory GiB or None for out of memory, step seconds)
      (1, 'none', 1): (None, None), (1, 'none', 2): (20, 0.998), (1, 'full', 1): (12, 0.995),
      (2, 'none', 1): (28, 0.990), (2, 'full', 1): (10, 1.200)}

  def fake_plan(c, chip, topology_name, devices, name=None):
    memory, step = outcomes.get((c.fsdp_axis_size, c.remat, c.grad_accum_steps), (None, None))
    fits = memory is not None and memory * 2**30 <= chip.usable_hbm_bytes
    return dict(per_device_micro_batch=c.train_batch_size // 4 // c.grad_accum_steps,
                fits=fits, memory_bytes_per_chip=memory and memory * 2**30,
                temp_bytes_needed=None if memory else 40 * 2**30, predicted_step_s=step,
                predicted_mfu=step and 0.5 / step, predicted_days=step and step * 10,
                compile_s=1.0)

  monkeypatch.setattr(tpu_plan, 'plan', fake_plan)
  monkeypatch.setattr(topology, 'devices', lambda chip, name: ['chip'] * 4)
  lines = []
  say = lambda *a, **k: lines.append(' '.join(map(str, a)))
  result = tpu_plan.run(tiny_config(), 'v4-8', ('none', 'full'), (1, 2, 3), say=say)
  # 0.990-0.998 s are within 1 %: the unsharded, no-remat setting wins over faster ones.
  assert (result['best']['fsdp_axis_size'], result['best']['remat'],
          result['best']['grad_accum_steps']) == (1, 'none', 2)
  assert len(result['rows']) == 5 and not result['rows'][0]['fits']
  assert 'fsdp 3 skipped' in lines[0] and '--config.grad_accum_steps=2' in lines[-1]
  assert any('needs 40.00 GiB temp' in line for line in lines)
  v4 = chips.TPU_CHIPS['v4']
  monkeypatch.setitem(chips.TPU_CHIPS, 'v4', dataclasses.replace(v4, usable_hbm_bytes=2**30))
  nothing = tpu_plan.run(tiny_config(), 'v4-8', ('none', 'full'), (1,), say=say)
  assert nothing['best'] is None and lines[-1].startswith('Nothing fits')


def test_a_sweep_without_an_fsdp_size_dividing_the_chips_is_a_one_line_error():
  """--sweep_fsdp=16 on a 4-chip slice compiled nothing, said 'Nothing fits' and exited 0."""
  with pytest.raises(UserError, match=r'^--sweep_fsdp=16,32: no value divides the 4 chips of '
                                      r'--topology=v4-8, so nothing would be compiled; use '
                                      r'some of 1,2,4$'):
    tpu_plan.run(tiny_config(), 'v4-8', ('none',), (16, 32))
  # So did --sweep_remat= (empty); an unknown value was refused after the sweep's header.
  said = []
  for remats, shown in (([], ''), (['none', 'most'], 'none,most')):
    with pytest.raises(UserError, match=rf'^--sweep_remat={shown}: give some of '
                                        + ','.join(tpu_plan.REMATS) + '$'):
      tpu_plan.run(tiny_config(), 'v4-8', remats, (1,), say=said.append)
  assert not said


def test_flop_counts_read_to_three_digits_in_the_unit_that_keeps_them_under_a_thousand():
  assert [dry_run.flop(x) for x in (1.2e15, 999.7e12, 16537878528, 2.5e6, 12, 0)] == [
      '1.2 PFLOP', '1 PFLOP', '16.5 GFLOP', '2.5 MFLOP', '12 FLOP', '0 FLOP']
