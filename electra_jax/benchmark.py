"""Times the real pretraining step: tokens/s, step time, model FLOPs, MFU, peak memory.

  python -m electra_jax.benchmark --config=configs/small.py --config.train_batch_size=32 \
      --steps=20 [--warmup=3] [--compare=hf] [--profile_dir=/tmp/prof] [--peak_tflops=X]

Builds the train step exactly as training does (Experiment + train_state.jit_train_step, state
donated), compiles it once, runs `--warmup` untimed steps, then times `--steps` steps, blocking
on each step's results. One batch is reused for every step, so input loading is not measured.
`--compare=hf` then runs a HF transformers + PyTorch implementation of the same objective
(benchmarks/hf_reference.py) in the same process on the same batch and reports both and the
ratio. Prints a table; the last stdout line is a JSON summary.
"""
import os
import platform
import resource
import statistics
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import experiment as experiment_lib
from electra_jax import flops as flops_lib
from electra_jax import model as model_lib
from electra_jax import objective as objective_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import train_state as ts
from electra_jax.data import pipeline
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                'override any key with --config.KEY=VALUE.', lock_config=True)
flags.DEFINE_integer('steps', 20, 'Timed train steps.')
flags.DEFINE_integer('warmup', 3, 'Untimed steps after compilation (first-run effects).')
flags.DEFINE_list('compare', [], "Reference implementations to run after ours: 'hf' (HF "
                  "transformers + PyTorch, generator logits only at masked positions) and/or "
                  "'hf_full' (HF's ElectraForMaskedLM as is: logits at every position).")
flags.DEFINE_enum('data', 'synthetic', ['synthetic', 'corpus'],
                  "'synthetic': random token ids, every row full length (any vocab_size); "
                  "'corpus': the first batch of config.train_files through the real pipeline.")
flags.DEFINE_string('profile_dir', None, 'If set, trace a few extra steps with jax.profiler '
                    'into this directory (TensorBoard / Perfetto) after timing.')
flags.DEFINE_float('peak_tflops', None, 'Peak TFLOP/s per device for MFU when the device is '
                   'not in the built-in table (e.g. CPUs, which have none).')
FLAGS = flags.FLAGS

# Dense peak TFLOP/s per device (vendor figures, no sparsity). bfloat16 matmul peaks; float32
# where the vendor states one (H100/H200 SXM: 67 without tensor cores; TF32 tensor cores 494,
# which XLA uses for float32 matmuls only at jax_default_matmul_precision='tensorfloat32').
PEAK_TFLOPS = {
    'bfloat16': {'TPU v4': 275, 'TPU v5 lite': 197, 'TPU v5e': 197, 'TPU v5p': 459,
                 'TPU v5': 459, 'TPU v6 lite': 918, 'TPU v6e': 918, 'H100': 989, 'H200': 989,
                 'A100': 312},
    'float32': {'H100': 67, 'H200': 67, 'A100': 19.5},
}


def peak_tflops(device_kind: str, dtype: str, override: float | None) -> tuple[float | None, str]:
  """(peak TFLOP/s per device, where it came from); the longest matching table name wins."""
  if override is not None:
    return override, '--peak_tflops'
  table = PEAK_TFLOPS.get(dtype, {})
  matches = [name for name in table if name.lower() in device_kind.lower()]
  if not matches:
    return None, f'no {dtype} peak known for {device_kind!r}; pass --peak_tflops'
  name = max(matches, key=len)
  return float(table[name]), f'table: {name} {dtype} dense'


def synthetic_batch(c, seed: int = 0) -> dict:
  """Full-length rows: [CLS] ids... [SEP] ids... [SEP], two segments, every token real."""
  rng = np.random.default_rng(seed)
  b, s = c.train_batch_size, c.max_seq_length
  ids = rng.integers(5, c.vocab_size, (b, s)).astype(np.int32)
  half = s // 2
  ids[:, 0] = tokenizer_lib.SentencePieceTokenizer.cls_id
  ids[:, half - 1] = ids[:, -1] = tokenizer_lib.SentencePieceTokenizer.sep_id
  segments = np.zeros((b, s), np.int32)
  segments[:, half:] = 1
  return dict(input_ids=ids, input_mask=np.ones((b, s), np.int32), segment_ids=segments)


def build(c, data: str):
  """(experiment, host batch). Synthetic data needs no vocabulary file, so any vocab_size runs."""
  if data == 'corpus':
    exp = experiment_lib.Experiment.create(c)
    batch = next(pipeline.make_train_iterator(exp.config, exp.tokenizer))
    return exp, {k: np.asarray(v) for k, v in batch.items()}
  c = config_lib.resolve(c)
  mesh = parallel.make_mesh()
  parallel.check_batch_divides(c.train_batch_size, mesh, 'train_batch_size')
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  tok = tokenizer_lib.SentencePieceTokenizer
  objective = objective_lib.ElectraObjective.from_config(model, c, tok.special_ids, tok.mask_id)
  tx, schedule = optim.make_optimizer(c)
  exp = experiment_lib.Experiment(c, None, mesh, model, objective, tx, schedule)
  return exp, synthetic_batch(c, c.seed)


def percentile(values, q: float) -> float:
  return float(np.percentile(np.asarray(values), q))


def peak_memory() -> tuple[int | None, str]:
  """Device allocator peak where the backend reports one, else the process's peak RSS."""
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return int(stats['peak_bytes_in_use']), 'device memory_stats peak_bytes_in_use'
  scale = 1 if platform.system() == 'Darwin' else 1024  # ru_maxrss: bytes on macOS, else KiB.
  return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
          'process peak RSS (getrusage; includes host runtime, data and compiler)')


def time_jax(exp, host_batch: dict, steps: int, warmup: int, profile_dir: str | None) -> dict:
  """Compiles, warms up and times the jitted train step; returns timings and the loss trace."""
  c = exp.config
  state = exp.init_state()
  batch = parallel.global_batch(host_batch, exp.mesh)
  rng = jax.random.key(c.seed)
  step_fn = ts.jit_train_step(ts.make_train_step(exp.objective, exp.tx), exp.mesh)
  t = time.perf_counter()
  compiled = step_fn.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  for _ in range(warmup):
    state, sums = compiled(state, batch, rng)
    jax.block_until_ready((state, sums))
  times, losses = [], []
  for _ in range(steps):
    t = time.perf_counter()
    state, sums = compiled(state, batch, rng)
    jax.block_until_ready((state, sums))
    times.append(time.perf_counter() - t)
    losses.append(objective_lib.summarize(jax.device_get(sums), c.gen_weight,
                                          c.disc_weight)['loss'])
  if profile_dir:
    with jax.profiler.trace(profile_dir):
      for _ in range(3):
        state, sums = compiled(state, batch, rng)
        jax.block_until_ready((state, sums))
  return dict(times=times, losses=losses, compile_s=compile_s,
              xla_flops=float(cost.get('flops', 0.0)) if cost else None)


def load_hf_reference():
  """benchmarks/hf_reference.py from the repository checkout (it is not part of the package)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'benchmarks', 'hf_reference.py')
  if not os.path.isfile(path):
    raise UserError(f"--compare=hf needs {path} (run from a clone of the repository)")
  try:
    import torch, transformers  # pylint: disable=import-outside-toplevel,unused-import,multiple-imports
  except ImportError as e:
    raise UserError(f"--compare=hf needs torch and transformers ({e}); install them with "
                    "pip install -e '.[bench]'") from None
  spec = importlib.util.spec_from_file_location('hf_reference', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def summarize(name: str, times, model_flops: float, c, num_devices: int,
              peak: float | None) -> dict:
  tokens = c.train_batch_size * c.max_seq_length
  median = statistics.median(times)
  achieved = model_flops / median / num_devices / 1e12
  return {
      'implementation': name,
      'tokens_per_sec': tokens / median,
      'step_ms': 1e3 * median,
      'step_ms_p10': 1e3 * percentile(times, 10),
      'step_ms_p90': 1e3 * percentile(times, 90),
      'model_tflops_per_sec_per_device': achieved,
      'mfu': achieved / peak if peak else None,
  }


def print_table(rows: list[dict]):
  cols = [('implementation', '{}'), ('tokens_per_sec', '{:,.0f}'), ('step_ms', '{:.1f}'),
          ('step_ms_p10', '{:.1f}'), ('step_ms_p90', '{:.1f}'),
          ('model_tflops_per_sec_per_device', '{:.3f}'), ('mfu', '{:.3f}')]
  header = ['implementation', 'tokens/s', 'step ms (median)', 'p10', 'p90',
            'model TFLOP/s/device', 'MFU']
  cells = [[fmt.format(r[k]) if r[k] is not None else '-' for k, fmt in cols] for r in rows]
  widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
  line = lambda values: '  '.join(v.rjust(w) for v, w in zip(values, widths))
  print(line(header))
  for row in cells:
    print(line(row))


def run_benchmark(config, steps: int, warmup: int, compare=(), data: str = 'synthetic',
                  profile_dir: str | None = None, peak_override: float | None = None) -> dict:
  if steps < 1 or warmup < 0:
    raise UserError(f'--steps={steps} must be >= 1 and --warmup={warmup} >= 0')
  unknown = sorted(set(compare) - {'hf', 'hf_full'})
  if unknown:
    raise UserError(f'--compare={",".join(unknown)} is not known; use hf and/or hf_full')
  hf_reference = load_hf_reference() if compare else None  # Fail before any compile.
  exp, host_batch = build(config, data)
  c = exp.config
  devices = exp.mesh.devices.size
  device = jax.devices()[0]
  model_flops = flops_lib.model_flops_per_step(c)
  peak, peak_source = peak_tflops(device.device_kind, c.dtype, peak_override)
  print(f'Benchmarking the train step: {device.device_kind} x{devices} ({device.platform}), '
        f'jax {jax.__version__}, {c.dtype}, batch {c.train_batch_size} x {c.max_seq_length}, '
        f'{steps} timed steps after {warmup} warmup; data: {data}'
        + (f'; profile -> {profile_dir}' if profile_dir else ''), flush=True)
  if profile_dir:
    profile_dir = os.path.abspath(os.path.expanduser(profile_dir))

  jax_run = time_jax(exp, host_batch, steps, warmup, profile_dir)
  memory, memory_source = peak_memory()
  rows = [summarize('electra_jax', jax_run['times'], model_flops, c, devices, peak)]
  print(f'electra_jax: compiled in {jax_run["compile_s"]:.1f}s; loss {jax_run["losses"][0]:.3f}'
        f' -> {jax_run["losses"][-1]:.3f}', flush=True)

  result = dict(rows[0])
  del result['implementation']
  result.update(
      model_flops_per_step=model_flops, xla_flops_per_step=jax_run['xla_flops'],
      peak_tflops_per_device=peak, peak_source=peak_source,
      peak_memory_bytes=memory, peak_memory_source=memory_source,
      compile_s=jax_run['compile_s'], device_kind=device.device_kind,
      platform=device.platform, device_count=devices, jax_version=jax.__version__,
      dtype=c.dtype, batch=c.train_batch_size, seq=c.max_seq_length, steps=steps,
      warmup=warmup, data=data, dropout_rate=c.dropout_rate,
      attention_dropout_rate=c.attention_dropout_rate, first_loss=jax_run['losses'][0],
      last_loss=jax_run['losses'][-1], profile_dir=profile_dir)

  for name in compare:
    ref = hf_reference.time_reference(
        c, host_batch, steps=steps, warmup=warmup, gather=(name == 'hf'),
        special_ids=tokenizer_lib.SentencePieceTokenizer.special_ids,
        mask_id=tokenizer_lib.SentencePieceTokenizer.mask_id, platform=device.platform)
    row = summarize(name, ref['times'], model_flops, c, devices, peak)
    rows.append(row)
    print(f'{name}: {ref["description"]}; loss {ref["losses"][0]:.3f} -> {ref["losses"][-1]:.3f}',
          flush=True)
    result[f'{name}_tokens_per_sec'] = row['tokens_per_sec']
    result[f'{name}_step_ms'] = row['step_ms']
    result[f'{name}_mfu'] = row['mfu']
    result[f'{name}_peak_memory_bytes'] = ref['peak_memory_bytes']
    result[f'speedup_vs_{name}'] = rows[0]['tokens_per_sec'] / row['tokens_per_sec']
    result[f'{name}_versions'] = ref['versions']
  print_table(rows)
  for name in compare:
    print(f'electra_jax / {name}: {result[f"speedup_vs_{name}"]:.2f}x tokens/s')
  return result


def main(argv):
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {argv[1:]}; flags look like --config.KEY=VALUE')
  cli.print_result(run_benchmark(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.compare,
                                 FLAGS.data, FLAGS.profile_dir, FLAGS.peak_tflops))


def run():
  flags.mark_flags_as_required(['config'])
  cli.run(main)


if __name__ == '__main__':
  run()
