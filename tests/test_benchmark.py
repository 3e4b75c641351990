"""The benchmark instrument: analytic FLOPs, the CLI's JSON line, and the HF reference step."""
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from electra_jax import benchmark
from electra_jax import chips
from electra_jax import config as config_lib
from electra_jax import device_memory
from electra_jax import flops
from electra_jax import model as model_lib
from electra_jax import optim
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config, tiny_trainer
from tests.test_train_cli import last_json, run_cli

HAS_TORCH = importlib.util.find_spec('torch') is not None and importlib.util.find_spec(
    'transformers') is not None


def test_model_flops_match_a_hand_count_for_a_tiny_config():
  # Generator at 1/4 width: hidden 8, FFN 16, 1 head; E 16 != 8, so it has an E->H projection.
  c = tiny_config(generator_hidden_size=0.25)  # B 8, S 32, E 16, H 32, FFN 64, 2 layers, V 64
  b, s, p = 8, 32, 4  # p = int((0.15 + 0.005) * 32)
  tokens = b * s
  gen_encoder = 2 * tokens * (16 * 8 + 2 * (4 * 8 * 8 + 2 * 8 * 16))
  gen_attention = 2 * 4 * b * s * s * 8
  gen_head = 2 * b * p * (8 * 16 + 16 * 64)  # dense H_G->E, tied projection E->V
  disc_encoder = 2 * tokens * (16 * 32 + 2 * (4 * 32 * 32 + 2 * 32 * 64))
  disc_attention = 2 * 4 * b * s * s * 32
  disc_head = 2 * tokens * (32 * 32 + 32 * 1)
  forward = gen_encoder + gen_attention + gen_head + disc_encoder + disc_attention + disc_head
  assert flops.model_flops_per_step(c) == 3 * forward == 37_429_248


def _dot_general_flops(jaxpr) -> int:
  """2 · output elements · contracted size, for every dot_general in a jaxpr (recursively)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contract, _), _ = eqn.params['dimension_numbers']
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lhs_contract)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += _dot_general_flops(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += _dot_general_flops(sub)
  return total


def test_model_flops_equal_the_matmuls_the_train_step_actually_traces():
  """Forward + backward of the real objective contain exactly the counted matmul FLOPs."""
  c, objective, state, _, _ = tiny_trainer(generator_hidden_size=0.25)
  batch = benchmark.synthetic_batch(c)
  grad_fn = jax.value_and_grad(objective, has_aux=True)
  traced = jax.make_jaxpr(grad_fn)(state.params, batch, jax.random.key(0))
  assert _dot_general_flops(traced.jaxpr) == flops.model_flops_per_step(c)


def test_peak_memory_is_the_device_allocators_where_it_reports_one(monkeypatch):
  class Device:
    def memory_stats(self):
      return {'peak_bytes_in_use': 49_300_000_000, 'bytes_limit': 79_100_000_000}
  monkeypatch.setattr(jax, 'local_devices', lambda: [Device()])
  memory = device_memory.peak()
  assert memory['peak_memory_bytes'] == 49_300_000_000
  assert device_memory.describe(memory) == 'peak memory 49.3 GB of 79.1 GB (device)'
  monkeypatch.undo()  # A CPU reports no allocator statistics: the process's peak RSS.
  memory = device_memory.peak()
  assert memory['memory_limit_bytes'] is None and memory['peak_memory_bytes'] > 50e6
  assert device_memory.describe(memory).endswith(' GB (process RSS)')


@pytest.mark.skipif(sys.platform != 'linux', reason='VmHWM is Linux /proc')
def test_a_child_process_reports_its_own_peak_rss_not_its_launchers():
  """getrusage's ru_maxrss survives exec on Linux: a command launched from a process holding
  1 GiB would report at least that. VmHWM counts the child's own pages."""
  held = bytearray(1 << 30)
  held[::4096] = b'\x01' * len(range(0, len(held), 4096))  # Touch every page: resident.
  code = 'from electra_jax import device_memory; print(device_memory.peak_rss_bytes())'
  env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  child = int(subprocess.run([sys.executable, '-c', code], env=env, check=True,
                             capture_output=True, text=True).stdout)
  del held
  assert 20e6 < child < 0.8 * (1 << 30)


def test_peak_table_matches_device_kinds_and_dtypes():
  assert chips.peak_tflops('NVIDIA H100 80GB HBM3', 'bfloat16', None)[0] == 989
  assert chips.peak_tflops('NVIDIA H100 80GB HBM3', 'float32', None)[0] == 494.7  # TF32.
  assert chips.peak_tflops('NVIDIA H100 PCIe', 'bfloat16', None)[0] == 756  # Longest name wins.
  assert chips.peak_tflops('TPU v5 lite', 'bfloat16', None)[0] == 197
  assert chips.peak_tflops('TPU v5p', 'bfloat16', None)[0] == 459
  assert chips.peak_tflops('TPU v4', 'bfloat16', None)[0] == 275
  assert chips.peak_tflops('cpu', 'float32', None)[0] is None
  assert chips.peak_tflops('cpu', 'float32', 0.5) == (0.5, '--peak_tflops')


def test_float32_peak_is_tf32_at_jax_default_precision_and_fp32_only_when_asked_for():
  """JAX's default precision runs float32 matmuls on GPU tensor cores as TF32; the FP32 peak,
  7 times lower on an H100, would overstate float32 MFU as much."""
  peak = lambda kind, dtype='float32': chips.peak_tflops(kind, dtype, None)
  for kind, tf32, fp32 in [('NVIDIA H100 80GB HBM3', 494.7, 67), ('NVIDIA H100 PCIe', 378, 51),
                           ('NVIDIA H200', 494.7, 67), ('NVIDIA A100-SXM4-80GB', 156, 19.5)]:
    bf16 = peak(kind, 'bfloat16')
    assert peak(kind)[0] == tf32 and peak(kind)[1].endswith('float32 dense (TF32 tensor cores)')
    with jax.default_matmul_precision('tensorfloat32'):
      assert peak(kind)[0] == tf32
    for full in ('highest', 'float32'):
      with jax.default_matmul_precision(full):
        assert peak(kind)[0] == fp32 and peak(kind)[1].endswith('float32 dense (FP32)')
        assert peak(kind, 'bfloat16') == bf16  # Matmul precision moves float32 only.


def test_nvl_cards_read_as_their_own_peaks_not_the_sxm_parts():
  """'NVIDIA H100 NVL' contains 'H100': it read as the SXM part (989 bf16, not its 835.5)."""
  for kind in ('NVIDIA H100 NVL', 'NVIDIA H200 NVL'):
    name = kind.removeprefix('NVIDIA ')
    assert chips.peak_tflops(kind, 'bfloat16', None) == (835.5, f'table: {name} bfloat16 dense')
    assert chips.peak_tflops(kind, 'float32', None)[0] == 417.5
    with jax.default_matmul_precision('highest'):
      assert chips.peak_tflops(kind, 'float32', None)[0] == 60


def test_synthetic_batch_is_full_length_two_segments_without_masking_candidates_lost():
  c = config_lib.resolve(tiny_config())
  batch = benchmark.synthetic_batch(c)
  ids = batch['input_ids']
  assert ids.shape == (c.train_batch_size, c.max_seq_length)
  assert (ids[:, 0] == 2).all() and (ids[:, -1] == 3).all()
  assert batch['input_mask'].all() and set(np.unique(batch['segment_ids'])) == {0, 1}
  assert ids[:, 1:15].min() >= 5 and ids.max() < c.vocab_size  # no specials inside the text


def test_synthetic_rows_need_a_vocabulary_beyond_the_special_tokens():
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, '--config.vocab_size=5', check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      'error: config.vocab_size=5 leaves no token for synthetic rows beside the 5 special '
      'tokens; use a vocabulary bigger than 5'], proc.stderr


@pytest.mark.parametrize('value', ['-5', 'nan', 'inf'])
def test_a_peak_that_is_no_positive_number_is_a_one_line_error(value):
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, f'--peak_tflops={value}', check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --peak_tflops={float(value):g} must be the device's peak TFLOP/s, a positive "
      'finite number (e.g. 989 for an H100 in bfloat16)'], proc.stderr


def test_a_profile_dir_that_cannot_hold_a_trace_is_refused_before_the_benchmark(tmp_path):
  (tmp_path / 'afile').write_text('')
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, f'--profile_dir={tmp_path}/afile',
                 check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --profile_dir '{tmp_path}/afile' is a file; pass a directory path"], proc.stderr
  assert 'electra_jax:' not in proc.stdout  # Nothing timed first.
  # A benchmark refused after making its --profile_dir leaves none behind.
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, f'--profile_dir={tmp_path}/new/sub',
                 '--compare=bogus', check=False)
  assert proc.returncode == 2 and not (tmp_path / 'new').exists(), proc.stderr


def benchmark_script(name: str):
  """benchmarks/NAME.py (scripts of the checkout, not of the package) as a module."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(REPO_ROOT, 'benchmarks', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


BENCH_FLAGS = ['--config=configs/demo.py', '--config.num_layers=1', '--config.hidden_size=32',
               '--config.embedding_size=16', '--config.intermediate_size=64',
               '--config.num_heads=2', '--config.max_seq_length=32', '--config.vocab_size=512',
               '--config.train_batch_size=8', '--config.steps_per_execution=1', '--steps=2',
               '--warmup=1']


def test_benchmark_cli_prints_a_table_and_a_json_line_with_every_field(tmp_path):
  # The paper's network (the demo's relative attention bias is not in the HF reference).
  compare = ['--compare=hf', '--config.relative_attention_span=0'] if HAS_TORCH else []
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, '--peak_tflops=0.1', *compare,
                 f'--profile_dir={tmp_path}')
  result = last_json(proc.stdout)
  assert 'tokens/s' in proc.stdout and 'electra_jax' in proc.stdout
  for key in ('tokens_per_sec', 'step_ms', 'step_ms_p10', 'step_ms_p90', 'model_flops_per_step',
              'mfu', 'peak_memory_bytes', 'memory_limit_bytes', 'peak_memory_source',
              'device_kind', 'device_count', 'jax_version', 'dtype', 'batch', 'seq', 'remat'):
    assert key in result, key
  assert result['batch'] == 8 and result['seq'] == 32 and result['dtype'] == 'float32'
  # A CPU computes attention with XLA, fused or not.
  assert result['attention'] == ('xla (attention dropout)' if result['attention_dropout_rate']
                                 else 'xla')
  assert f"attention {result['attention']}," in proc.stdout
  assert result['step_ms_p10'] <= result['step_ms'] <= result['step_ms_p90']
  # Each step's call returns before its results are ready, so its host share is within it.
  assert 0 < result['host_dispatch_ms'] <= result['step_ms']
  assert f"{result['host_dispatch_ms']:.2f} ms a step (median; 1 step(s) a call" in proc.stdout
  # The profile's trace, and beside it the step's optimised HLO that names its fusions.
  assert result['profile_dir'] == str(tmp_path)
  assert list(tmp_path.glob('plugins/profile/*/*.xplane.pb'))
  assert 'ENTRY' in (tmp_path / 'train_step.hlo.txt').read_text()
  # Steps called back to back (the training loop's pace) are timed too, and printed.
  assert result['pipelined_step_ms'] > 0
  assert f"{result['pipelined_step_ms']:.2f} ms a step over 2 steps called back to back" in (
      proc.stdout)
  assert math.isclose(result['tokens_per_sec'], 8 * 32 / (result['step_ms'] / 1e3))
  # The analytic count of this config, and MFU against the peak given on the command line.
  assert result['model_flops_per_step'] == 3 * (
      2 * 256 * (16 * 8 + 4 * 64 + 2 * 8 * 16) + 4 * 8 * 32 * 32 * 8
      + 2 * 8 * 4 * (8 * 16 + 16 * 512)
      + 2 * 256 * (16 * 32 + 4 * 1024 + 2 * 32 * 64) + 4 * 8 * 32 * 32 * 32 + 2 * 256 * (1024 + 32))
  # Per device: --cpu_devices=auto may split the CPU run over several devices.
  expected_mfu = (result['model_flops_per_step'] / (result['step_ms'] / 1e3) / 1e12 / 0.1
                  / result['device_count'])
  assert math.isclose(result['mfu'], expected_mfu, rel_tol=1e-9)
  assert result['peak_memory_bytes'] > 0 and math.isfinite(result['first_loss'])
  if HAS_TORCH:
    assert result['hf_tokens_per_sec'] > 0
    assert math.isclose(result['speedup_vs_hf'],
                        result['tokens_per_sec'] / result['hf_tokens_per_sec'])


def test_benchmark_times_calls_of_several_steps_that_train_as_one_step_a_call(tmp_path):
  """With config.steps_per_execution=2 the benchmark times the loop's 2-step calls: per step
  a time and a loss, and the steps those calls run are one step a call's, bit for bit."""
  states = {}
  for n in (1, 2):
    exp, host_batch = benchmark.build(tiny_config(steps_per_execution=n), 'synthetic')
    step = benchmark.JaxStep(exp, host_batch, warmup=2)
    times, losses = step.run(4)
    assert len(times) == len(losses) == 4 and min(times) > 0
    assert len(step.dispatch_s) == 4 // n  # One a call, per step of it.
    states[n] = step.state
  assert int(states[1].step) == int(states[2].step) == 6
  for got, want in zip(jax.tree.leaves(states[2]), jax.tree.leaves(states[1])):
    np.testing.assert_array_equal(got, want)
  # Step counts are rounded up to whole calls: the warmup's, and the timed ones.
  exp, host_batch = benchmark.build(tiny_config(steps_per_execution=2), 'synthetic')
  assert int(benchmark.JaxStep(exp, host_batch, warmup=1).state.step) == 2
  result = benchmark.run_benchmark(tiny_config(steps_per_execution=2), steps=3, warmup=0,
                                   profile_dir=str(tmp_path))
  assert result['steps'] == 4 and result['pipelined_step_ms'] > 0
  # The profile's 3 calls are 6 steps: written down for profile_top_ops.py's per-step figures.
  with open(tmp_path / 'traced_steps.json', encoding='utf-8') as f:
    assert json.load(f) == {'steps': 6}


def test_xla_flops_are_the_whole_steps_under_gradient_accumulation():
  """XLA's cost analysis counts the micro-batch loop's body once: the benchmark scales it back
  to the step's (within the optimizer update, counted once per micro-batch)."""
  counts = {}
  for accum in (1, 2):
    exp, host_batch = benchmark.build(tiny_config(grad_accum_steps=accum), 'synthetic')
    counts[accum] = benchmark.JaxStep(exp, host_batch, warmup=0).xla_flops
  assert counts[2] == pytest.approx(counts[1], rel=0.05), counts


def test_xla_flops_are_the_whole_steps_on_several_devices_and_warmup_is_reported_as_run():
  """XLA counts one device's partition of the SPMD program: the benchmark sums the devices'."""
  results = [last_json(run_cli('electra_jax.benchmark', *BENCH_FLAGS, f'--cpu_devices={n}',
                               '--config.steps_per_execution=2').stdout) for n in (1, 2)]
  assert [r['device_count'] for r in results] == [1, 2]
  assert results[1]['xla_flops_per_step'] == pytest.approx(results[0]['xla_flops_per_step'],
                                                           rel=0.1), results
  assert [r['warmup'] for r in results] == [2, 2]  # --warmup=1 is one call of 2 steps.


def test_benchmark_cli_rejects_an_unknown_reference():
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, '--compare=pytorch', check=False)
  assert proc.returncode == 2 and 'error: --compare=pytorch' in proc.stderr


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch + transformers (test/bench extras)')
def test_hf_reference_shares_embeddings_masks_exactly_and_learns():
  import torch  # pylint: disable=import-outside-toplevel
  hf = benchmark_script('hf_reference')
  c = config_lib.resolve(tiny_config(num_warmup_steps=0, learning_rate=2e-3))
  trainer = hf.Trainer(c, (0, 2, 3, 4), 4, 'cpu', gather=True, seed=0)
  model = trainer.model
  # One embedding module for both networks; the MLM output matrix is the token table.
  assert model.discriminator.electra.embeddings is model.generator.electra.embeddings
  assert (model.generator.generator_lm_head.weight.data_ptr()
          == model.generator.electra.embeddings.word_embeddings.weight.data_ptr())

  batch = benchmark.synthetic_batch(c)
  ids, mask, segments = trainer.to_device(batch)
  mask[0, 20:] = 0  # a padded row: fewer real tokens, fewer predictions
  positions, original, weights, replacement = model.mask(ids, mask)
  n_real = mask.sum(-1).float()
  expected = torch.clamp(torch.round(n_real * c.mask_prob), 1, c.max_predictions_per_seq)
  assert torch.equal(weights.sum(-1).float(), expected)
  chosen = positions[weights]
  rows = torch.arange(ids.shape[0])[:, None].expand_as(positions)[weights]
  assert mask[rows, chosen].all() and not torch.isin(ids[rows, chosen], torch.tensor([2, 3])).any()
  assert len(set(zip(rows.tolist(), chosen.tolist()))) == len(chosen)  # no position twice
  assert set(replacement[weights].tolist()) <= set(original[weights].tolist()) | {4}

  losses = [float(trainer.step(ids, mask, segments)) for _ in range(25)]
  assert all(math.isfinite(x) for x in losses)
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch + transformers (test/bench extras)')
def test_hf_reference_generator_is_as_deep_as_the_configs():
  hf = benchmark_script('hf_reference')
  c = config_lib.resolve(tiny_config(num_layers=4, generator_layers=0.5))
  g, d = hf.hf_configs(c)
  assert (g.num_hidden_layers, d.num_hidden_layers) == (2, 4)
  model = hf.ElectraPretrainer(c, (0, 2, 3, 4), 4)
  assert len(model.generator.electra.encoder.layer) == 2
  assert len(model.discriminator.electra.encoder.layer) == 4


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch + transformers (test/bench extras)')
@pytest.mark.parametrize('overrides, key', [
    (dict(objective='mlm'), 'objective'), (dict(tie='none'), 'tie'),
    (dict(uniform_generator=True), 'uniform_generator'),
    (dict(relative_attention_span=8), 'relative_attention_span'),
    (dict(whole_word_masking=True), 'whole_word_masking'),
    (dict(grad_accum_steps=2), 'grad_accum_steps')])
def test_compare_hf_refuses_a_config_the_reference_does_not_implement(overrides, key):
  """Before anything compiles: the reference would time another step."""
  with pytest.raises(UserError, match=rf'^--compare=hf: config\.{key}=.* is not what the HF '
                     rf'reference .* set --config\.{key}='):
    benchmark.run_benchmark(tiny_config(**overrides), steps=1, warmup=0, compare=['hf'])
  hf = benchmark_script('hf_reference')
  c = config_lib.resolve(tiny_config())
  hf.check_config(c, '--compare=hf', 8, 'cpu')  # CPU devices share the reference's cores.
  with pytest.raises(UserError, match='runs on one gpu device, electra_jax here on 2'):
    hf.check_config(c, '--compare=hf', 2, 'gpu')


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch + transformers (test/bench extras)')
def test_compare_hf_on_the_demos_relative_attention_is_a_one_line_error():
  proc = run_cli('electra_jax.benchmark', *BENCH_FLAGS, '--compare=hf', check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      'error: --compare=hf: config.relative_attention_span=8 is not what the HF reference '
      '(benchmarks/hf_reference.py) implements (0), so it would time another step; drop '
      '--compare=hf or set --config.relative_attention_span=0'], proc.stderr


def test_half_bits_dropout_keeps_the_rate_and_the_expectation():
  x = jax.numpy.ones((64, 33, 130))  # odd widths: the last element of a 32-bit pair is dropped
  layer = model_lib.Dropout(0.1)
  out = layer.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(0)})
  kept = np.asarray(out != 0)
  assert abs(kept.mean() - 0.9) < 0.003 and math.isclose(float(out.mean()), 1.0, abs_tol=0.005)
  assert np.allclose(np.asarray(out)[kept], 65536 / 58982)  # inverted dropout, exact keep rate
  # Neighbouring elements come from different halves of one draw: they must not be correlated.
  pairs = kept[..., 0:128:2] & kept[..., 1:128:2]
  assert abs(pairs.mean() - 0.81) < 0.005
  other = layer.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert (np.asarray(other != 0) != kept).mean() > 0.1  # the key matters
  assert (layer.apply({}, x, deterministic=True) == x).all()
  # A rate below the 16 bits' resolution keeps every element (its threshold, 2^16, does not fit
  # in uint16); the smallest rate they resolve drops about one element in 2^16.
  for rate, dropped in ((2**-18, 0), (0.0, 0), (2**-16, 1)):
    out = model_lib.Dropout(rate).apply({}, jax.numpy.ones((256, 1024)), deterministic=False,
                                        rngs={'dropout': jax.random.key(0)})
    assert abs(int((np.asarray(out) == 0).sum()) - 4 * dropped) <= 4 * dropped, rate


def test_profile_top_ops_ranks_device_ops_and_measures_idle_gaps(tmp_path):
  import gzip  # pylint: disable=import-outside-toplevel
  meta = lambda kind, pid, name, tid=None: dict(ph='M', name=kind, pid=pid, tid=tid,
                                                args=dict(name=name))
  op = lambda pid, tid, name, ts, dur: dict(ph='X', pid=pid, tid=tid, name=name, ts=ts, dur=dur)
  events = [meta('process_name', 1, '/device:GPU:0'), meta('process_name', 2, '/host:CPU'),
            meta('thread_name', 1, 'Stream #7(Compute)', tid=7),
            # Busy 0-15 (two overlapping ops), idle 15-20, busy 20-30: 25 of a 30 us span.
            op(1, 7, 'gemm', 0, 10), op(1, 7, 'softmax', 5, 10), op(1, 7, 'gemm', 20, 10),
            op(2, 3, 'host_work', 0, 1000)]  # Host events never count as device ops.
  path = tmp_path / 'perfetto_trace.json.gz'
  with gzip.open(path, 'wt') as f:
    json.dump(dict(traceEvents=events), f)
  tool = benchmark_script('profile_top_ops')
  loaded, processes, threads = tool.load_events(str(tmp_path))
  [track] = tool.summarize(tool.device_tracks(loaded, processes), processes, threads, top=10)
  assert track['track'] == '/device:GPU:0 / Stream #7(Compute)'
  assert [(r['name'], r['total_us'], r['count']) for r in track['top']] == [
      ('gemm', 20, 2), ('softmax', 10, 1)]
  assert track['top'][0]['share'] == pytest.approx(2 / 3)
  assert track['busy'] == pytest.approx(25 / 30)
  # With the step's HLO, kernels group by the op_name of their fusion, layers folded, per step.
  hlo = '\n'.join([
      '  %gemm.3 = f32[2] fusion(%p), kind=kCustom, metadata={op_name="jit(train_step)/'
      'jvp(Electra.discriminator_logits)/discriminator/encoder/layer_0/dot_general"}',
      '  ROOT %softmax-1 = f32[2] fusion(%p), metadata={op_name="jit(train_step)/'
      'jvp(Electra.discriminator_logits)/discriminator/encoder/layer_11/exp"}'])
  names = tool.hlo_op_names(hlo)
  ops = [op(1, 7, 'gemm_3', 0, 10), op(1, 7, 'softmax_1', 10, 30), op(1, 7, 'nvjet_7', 40, 2)]
  assert tool.by_scope(ops, names, steps=2) == [
      dict(scope='jvp(Electra.discriminator_logits)/discriminator/encoder', kernels_per_step=1.0,
           us_per_step=20.0),
      dict(scope='(unnamed) nvjet', kernels_per_step=0.5, us_per_step=1.0)]
  # The command divides by the steps the benchmark wrote beside the trace (a call may run
  # many); --steps overrides it, and without either it says what to pass.
  (tmp_path / 'train_step.hlo.txt').write_text(hlo)
  script = os.path.join(REPO_ROOT, 'benchmarks', 'profile_top_ops.py')
  run = lambda *flags: subprocess.run([sys.executable, script, str(tmp_path), *flags],
                                      capture_output=True, text=True, check=False)
  missing = run()
  assert missing.returncode == 1 and 'no traced_steps.json in' in missing.stderr
  (tmp_path / 'traced_steps.json').write_text(json.dumps({'steps': 300}))
  for flags, steps in (((), 300), (('--steps=3',), 3)):
    done = run(*flags)
    assert done.returncode == 0, done.stderr
    assert f'per step ({steps} traced)' in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary['traced_steps'] == steps
    assert [r['kernels_per_step'] for r in summary['scopes']] == [2 / steps, 1 / steps]
  # The host's graph events: re-recorded in 2 of 3 launches here.
  host = [op(2, 3, 'command_buffer::update', 0, 4000), op(2, 3, 'command_buffer::update', 9, 5000),
          *(op(2, 3, 'cuGraphLaunch (CudaGraph:103)', t, 1000 * t) for t in (1, 2, 3))]
  assert tool.host_summary(events + host) == [
      dict(event='command_buffer::update', count=2, median_ms=5.0),
      dict(event='cuGraphLaunch', count=3, median_ms=2.0)]


def test_step_parts_swaps_out_exactly_the_part_each_variant_names():
  """Each variant's traced step lacks just its part: the AUC's sort, the row-keyed PRNG (its
  key type 'rows8'), every dropout draw, or has optax's skip (an isfinite per parameter array)
  instead of ours; the others are as trained."""
  step_parts = benchmark_script('step_parts')
  c = tiny_config(dropout_rate=0.1, attention_dropout_rate=0.1)
  counts = {}
  for variant in step_parts.VARIANTS:
    vc, patch = step_parts.traced_as(variant, c)
    with patch:
      exp, host_batch = benchmark.build(vc, 'synthetic')
      batch = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in host_batch.items()}
      text = str(jax.make_jaxpr(exp.jit_train_step())(exp.abstract_state(), batch,
                                                      jax.random.key(0)))
    counts[variant] = (text.count('sort['), text.count('rows8'), text.count('random_bits'),
                       text.count('is_finite'))
  sorts, rows, draws, checks = counts['as_trained']
  assert sorts >= 1 and rows > 0
  assert counts['plain_dropout_key'] == (sorts, 0, draws, checks)  # the same draws, one key
  assert counts['no_auc'] == (sorts - 1, rows, draws, checks)
  assert counts['no_dropout'][:2] == (sorts, 0) and counts['no_dropout'][2] < draws
  num_arrays = len(jax.tree.leaves(exp.abstract_state().params))
  # One isfinite of the global norm, against one per parameter array.
  assert counts['apply_if_finite'] == (sorts, rows, draws, checks - 1 + num_arrays)
  assert c.dropout_rate == 0.1  # the caller's config is left as it was
  with pytest.raises(UserError, match='--variants=no_auc: give as_trained'):
    step_parts.run(c, 1, 0, 1, ('no_auc',))


def test_step_parts_flat_optimizer_updates_parameters_as_the_per_array_optimizer():
  """flat_optimizer runs the same chain (clipping, AdamW with its decay mask, the generator's
  learning-rate factor) over a few joined vectors: after three steps the parameters match the
  per-array optimizer's to float32 rounding, its state holds one vector per network and group,
  and its step takes a few square roots where the per-array one takes one per array."""
  step_parts = benchmark_script('step_parts')
  assert 'flat_optimizer' not in step_parts.VARIANTS  # opt-in
  c = tiny_config(generator_lr_multiplier=0.5, max_grad_norm=0.1)
  states, sqrts = {}, {}
  for variant in ('as_trained', 'flat_optimizer'):
    vc, patch = step_parts.traced_as(variant, c)
    with patch:
      exp, host_batch = benchmark.build(vc, 'synthetic')
      batch = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in host_batch.items()}
      sqrts[variant] = str(jax.make_jaxpr(exp.jit_train_step())(
          exp.abstract_state(), batch, jax.random.key(0))).count('sqrt')
      states[variant] = benchmark.JaxStep(exp, host_batch, warmup=3).state
  assert optim.make_optimizer is step_parts._make_optimizer  # restored after the trace
  per_array, flat = states['as_trained'], states['flat_optimizer']
  assert int(per_array.step) == int(flat.step) == 3
  for got, want in zip(jax.tree.leaves(flat.params), jax.tree.leaves(per_array.params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  # Its moments: one vector per network and group, each moved by the gradients.
  vectors = [x for x in jax.tree.leaves(flat.opt_state) if x.ndim == 1]
  num_arrays = len(jax.tree.leaves(per_array.params))
  assert len(vectors) == 2 * 2 * len(flat.params) < 2 * num_arrays
  assert all(float(np.max(np.abs(x))) > 0 for x in vectors)
  assert max(x.size for x in vectors) > max(x.size for x in jax.tree.leaves(flat.params))
  # Adam's square root: one per parameter array, or one per network and group.
  assert sqrts['as_trained'] - sqrts['flat_optimizer'] == num_arrays - 2 * len(flat.params)


def test_step_parts_xla_attention_variant_is_asked_for_where_the_step_uses_cudnn():
  """xla_attention changes only config.attention_implementation; it is refused, before anything
  compiles, where the step's attention is not cuDNN's to begin with."""
  step_parts = benchmark_script('step_parts')
  assert 'xla_attention' not in step_parts.VARIANTS  # not in the default --variants
  c = tiny_config(attention_dropout_rate=0.0)
  swapped, patch = step_parts.traced_as('xla_attention', c)
  assert swapped.attention_implementation == 'xla' and c.attention_implementation == 'auto'
  assert isinstance(patch, contextlib.nullcontext)
  variants = ('as_trained', 'xla_attention')
  with pytest.raises(UserError, match='needs --config.attention_dropout_rate=0 '):
    step_parts.run(tiny_config(attention_dropout_rate=0.1), 1, 0, 1, variants)
  with pytest.raises(UserError, match="compares with cuDNN's attention, which this step does "
                     'not use'):
    step_parts.run(c, 1, 0, 1, variants)


def test_step_parts_f32_scores_swaps_the_models_bf16_scores_for_the_same_loss():
  """The model's attention scores are a bf16 matmul in a bf16 step; f32_scores swaps only that
  matmul for one that writes float32, and the first step's loss agrees to bf16 rounding;
  without attention dropout (no scores written) it is refused before compiling."""
  step_parts = benchmark_script('step_parts')
  assert 'f32_scores' not in step_parts.VARIANTS  # opt-in
  # 48 tokens, not the hidden size 32: the scores' [.., seq, seq] shape is theirs alone.
  c = tiny_config(dtype='bfloat16', attention_dropout_rate=0.1, max_seq_length=48)
  variants = ('as_trained', 'f32_scores')
  score_dtypes = {}
  for variant in variants:
    vc, patch = step_parts.traced_as(variant, c)
    with patch:
      exp, host_batch = benchmark.build(vc, 'synthetic')
      batch = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in host_batch.items()}
      jaxpr = jax.make_jaxpr(exp.jit_train_step())(exp.abstract_state(), batch,
                                                   jax.random.key(0))
    seq = host_batch['input_ids'].shape[1]
    score_dtypes[variant] = {
        str(eqn.outvars[0].aval.dtype) for eqn in _equations(jaxpr.jaxpr)
        if eqn.primitive.name == 'dot_general' and eqn.outvars[0].aval.shape[-2:] == (seq, seq)}
  # (The backward's [.., seq, seq] gradient of the probabilities is bf16 in both.)
  assert score_dtypes == {'as_trained': {'bfloat16'}, 'f32_scores': {'float32', 'bfloat16'}}
  # A float32 model's scores are those of the f32 form bit for bit (power-of-two head dim).
  q, k = jax.random.normal(jax.random.key(1), (2, 2, 8, 3, 16))
  np.testing.assert_array_equal(model_lib.attention_scores(q, k), step_parts._f32_scores(q, k))
  result = step_parts.run(c, steps=1, warmup=0, rounds=1, variants=variants)
  sums = result['first_loss_sums']
  assert set(result['step_ms']) == set(variants) and sums['as_trained'] > 0
  assert all(result['temp_mb'][v] > 0 for v in variants)  # XLA's memory analysis, per variant
  np.testing.assert_allclose(sums['f32_scores'], sums['as_trained'], rtol=2e-2)
  with pytest.raises(UserError, match='f32_scores needs --config.attention_dropout_rate'):
    step_parts.run(tiny_config(), 1, 0, 1, ('as_trained', 'f32_scores'))


def test_step_parts_autodiff_softmax_backward_keeps_16_bytes_a_score_where_the_model_keeps_5():
  """autodiff_softmax_backward: the same training to float32 rounding (parameters after three
  steps with both dropouts), and of attention's [batch, heads, seq, seq] arrays the model's
  backward keeps only the keep mask and bf16 probabilities where JAX's autodiff keeps f32
  scores, exp and probabilities too."""
  step_parts = benchmark_script('step_parts')
  assert 'autodiff_softmax_backward' not in step_parts.VARIANTS  # opt-in
  c = tiny_config(dropout_rate=0.1, attention_dropout_rate=0.1)
  states = {}
  softmax_dropout = model_lib.softmax_dropout
  for variant in ('as_trained', 'autodiff_softmax_backward'):
    vc, patch = step_parts.traced_as(variant, c)
    with patch:
      exp, host_batch = benchmark.build(vc, 'synthetic')
      states[variant] = benchmark.JaxStep(exp, host_batch, warmup=3).state
  assert model_lib.softmax_dropout is softmax_dropout  # restored after the trace
  for got, want in zip(jax.tree.leaves(states['autodiff_softmax_backward'].params),
                       jax.tree.leaves(states['as_trained'].params)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

  seq = 16
  layer = model_lib.SelfAttention(64, 4, 0.1, 0.1, jax.numpy.bfloat16)
  x, mask = jax.numpy.ones((2, seq, 64), jax.numpy.bfloat16), jax.numpy.ones((2, seq), bool)
  params = layer.init({'params': jax.random.key(0), 'dropout': jax.random.key(1)}, x, mask, False)
  loss = lambda p: layer.apply(p, x, mask, False, rngs={'dropout': jax.random.key(2)}).sum()
  kept = {}
  for variant in ('as_trained', 'autodiff_softmax_backward'):
    with step_parts.traced_as(variant, c)[1]:
      residuals = jax.vjp(loss, params)[1]
    kept[variant] = sum(x.dtype.itemsize for x in jax.tree.leaves(residuals)
                        if hasattr(x, 'shape') and x.shape == (2, 4, seq, seq))
  # Bytes a score element: keep (1) + bf16 probabilities (2) + the next matmul's bf16 input (2),
  # against 16 from JAX's autodiff (jax 0.10-0.11).
  assert kept['as_trained'] == 5 and kept['autodiff_softmax_backward'] >= 10
  with pytest.raises(UserError, match='autodiff_softmax_backward needs --config.attention_drop'):
    step_parts.run(tiny_config(), 1, 0, 1, ('as_trained', 'autodiff_softmax_backward'))


def _equations(jaxpr):
  """Every equation of a jaxpr, those of nested jaxprs (jit, scan, custom_vjp, ...) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else (param,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          yield from _equations(inner)


@pytest.mark.slow
def test_step_parts_cli_times_every_variant():
  proc = subprocess.run(
      [sys.executable, os.path.join('benchmarks', 'step_parts.py'), *BENCH_FLAGS,
       '--config.dropout_rate=0.1', '--rounds=1'], cwd=REPO_ROOT, capture_output=True,
      text=True, timeout=900, check=True, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  result = last_json(proc.stdout)
  assert set(result['step_ms']) == {'as_trained', 'plain_dropout_key', 'no_auc', 'no_dropout',
                                    'apply_if_finite'}
  assert result['cost_ms']['no_auc'] == result['step_ms']['as_trained'] - result['step_ms'][
      'no_auc']
  assert result['auc_pairs_first_step']['no_auc'] == 0 < result['auc_pairs_first_step'][
      'as_trained']
  # The AUC is a metric only: without it the step computes the same loss.
  assert result['first_loss_sums']['no_auc'] == result['first_loss_sums']['as_trained']


@pytest.mark.parametrize('args, message', [
    (['checkpoint_io.py', '--config=configs/demo.py', '--workdir=/tmp/never', '--rounds=0'],
     'error: --rounds=0 must be >= 1'),
    (['profile_top_ops.py', '/nowhere/trace'], 'error: /nowhere/trace does not exist; pass'),
    (['finetune_save_cost.py', 'tiny'], 'usage: PYTHONPATH=. python '),
    (['multiprocess_exit.py', 'abc'], 'usage: python ')])
def test_benchmark_scripts_refuse_bad_arguments_in_one_line(args, message):
  proc = subprocess.run([sys.executable, os.path.join('benchmarks', args[0]), *args[1:]],
                        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT,
                                                JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr
  assert not os.path.exists('/tmp/never')
