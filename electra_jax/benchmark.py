r"""Times the real pretraining step: tokens/s, step time, model FLOPs, MFU, peak memory.

  python -m electra_jax.benchmark --config=configs/small.py --config.train_batch_size=32 \
      --steps=20 [--warmup=3] [--compare=hf] [--profile_dir=/tmp/prof] [--peak_tflops=X]

Builds the program the training loop calls (Experiment.jit_train_steps: state and metric
window donated, config.steps_per_execution steps a call), compiles it once, runs `--warmup`
untimed steps, then times `--steps` steps, blocking on each call's results, then `--steps`
more called back to back with one wait at the end (pipelined_step_ms: the pace of the training
loop, which does not wait for each call). Step counts are rounded up to whole calls; a
step's time is its call's over the call's steps. One batch is reused for every step, so input
loading is not measured.
`--compare=hf` then runs a HF transformers + PyTorch implementation of the same objective
(benchmarks/hf_reference.py) in the same process on the same batch and reports both and the
ratio. Prints a table; the last stdout line is a JSON summary.
"""
import os
import statistics
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from electra_jax import atomic
from electra_jax import chips
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import cpu_devices
from electra_jax import device_memory
from electra_jax import experiment as experiment_lib
from electra_jax import flops as flops_lib
from electra_jax import model as model_lib
from electra_jax.objectives import metrics as objective_metrics
from electra_jax import parallel
from electra_jax import paths
from electra_jax import step_trace
from electra_jax import train_state as ts
from electra_jax.data import pipeline
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

FLAGS = flags.FLAGS


def synthetic_batch(c, seed: int = 0) -> dict:
  """Full-length rows: [CLS] ids... [SEP] ids... [SEP], two segments, every token real."""
  first = len(tokenizer_lib.SPECIAL_TOKENS)  # The text's ids come after the special tokens.
  if c.vocab_size <= first:
    raise UserError(f'config.vocab_size={c.vocab_size} leaves no token for synthetic rows '
                    f'beside the {first} special tokens; use a vocabulary bigger than {first}')
  rng = np.random.default_rng(seed)
  b, s = c.train_batch_size, c.max_seq_length
  ids = rng.integers(first, c.vocab_size, (b, s)).astype(np.int32)
  half = s // 2
  ids[:, 0] = tokenizer_lib.SentencePieceTokenizer.cls_id
  ids[:, half - 1] = ids[:, -1] = tokenizer_lib.SentencePieceTokenizer.sep_id
  segments = np.zeros((b, s), np.int32)
  segments[:, half:] = 1
  return dict(input_ids=ids, input_mask=np.ones((b, s), np.int32), segment_ids=segments)


def build(c, data: str):
  """(experiment, host batch). Synthetic data needs no vocabulary file, so any vocab_size runs
  (above the special tokens)."""
  if data == 'corpus':
    exp = experiment_lib.Experiment.create(c)
    batch = next(pipeline.make_train_iterator(exp.config, exp.tokenizer))
    return exp, {k: np.asarray(v) for k, v in batch.items()}
  exp = experiment_lib.Experiment.create(c, read_vocab=False)
  return exp, synthetic_batch(exp.config, exp.config.seed)


def attention_path(c, device) -> str:
  """Who computes the discriminator's attention in the train step on `device`."""
  if c.attention_dropout_rate:
    return 'xla (attention dropout)'  # Dropout on the probabilities: no fused call.
  return model_lib.fused_attention_implementation(
      c.attention_implementation, c.dtype, c.hidden_size // c.num_heads, 2,
      c.relative_attention_span > 0, device)


def percentile(values, q: float) -> float:
  return float(np.percentile(np.asarray(values), q))


def whole_calls(steps: int, steps_per_call: int) -> int:
  """`steps` rounded up to whole calls of `steps_per_call` steps (as training runs them)."""
  return -(-steps // steps_per_call) * steps_per_call


class JaxStep:
  """The program the training loop calls (Experiment.jit_train_steps: state and metric window
  donated, config.steps_per_execution steps a call, here each on the same batch), compiled
  once and warmed up. Times are per step: a call's time over its steps."""

  def __init__(self, exp, host_batch: dict, warmup: int):
    c = self.config = exp.config
    self.steps_per_call = c.steps_per_execution
    self.mesh = exp.mesh
    self.state = exp.init_state()
    self.batches = parallel.global_batch(
        {k: np.stack([v] * self.steps_per_call) for k, v in host_batch.items()}, exp.mesh,
        steps_axis=True)
    self.rng = jax.random.key(c.seed)
    self.zeros = ts.window_zeros(exp.train_step(), exp.abstract_state(), self.batches, self.rng)
    t = time.perf_counter()
    self.compiled = exp.jit_train_steps().lower(
        self.state, self.new_window(), self.batches, self.rng).compile()
    self.compile_s = time.perf_counter() - t
    cost = self.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # XLA counts a loop's body once: the steps_per_execution loop's, so this is one step's
    # count, and the grad_accum_steps micro-batch loop's, so one micro-batch's: times k for the
    # step's (as tpu_plan.roofline; the optimizer update outside that loop, a small part, is
    # then counted k times too). And it counts one device's partition of the SPMD program:
    # times the devices for the whole step's.
    self.xla_flops = (float(cost['flops']) * c.grad_accum_steps * exp.mesh.devices.size
                      if cost and 'flops' in cost else None)
    # Host seconds a call took to return, per step (JAX dispatches asynchronously, so this is
    # the host's share of a step; near the step time, the step is bound by the host).
    self.dispatch_s = []
    self.run(whole_calls(warmup, self.steps_per_call))
    self.dispatch_s.clear()  # Timed steps only.

  def new_window(self) -> dict:
    return parallel.replicated_arrays(self.zeros, self.mesh)

  def call(self, window):
    """One call; returns the window (the steps' metric sums added into `window`)."""
    t = time.perf_counter()
    self.state, window, _ = self.compiled(self.state, window, self.batches, self.rng)
    self.dispatch_s.append((time.perf_counter() - t) / self.steps_per_call)
    return window

  def run(self, steps: int) -> tuple[list[float], list[float]]:
    """`steps` (whole calls), blocking on each call: per step, its seconds and loss (those of
    its call: the call's time over its steps, the call's mean loss)."""
    times, losses = [], []
    for _ in range(steps // self.steps_per_call):
      window = self.new_window()
      t = time.perf_counter()
      window = self.call(window)
      jax.block_until_ready((self.state, window))
      times += [(time.perf_counter() - t) / self.steps_per_call] * self.steps_per_call
      c = self.config
      losses += [objective_metrics.summarize(jax.device_get(window), c.gen_weight,
                                             c.disc_weight)['loss']] * self.steps_per_call
    return times, losses

  def run_pipelined(self, steps: int) -> float:
    """Seconds a step when the host does not wait for each call: `steps` (whole calls) back to
    back, one block at the end, as the training loop runs. Against the blocking step time it
    says how much of the host's work overlaps the device's."""
    window = self.new_window()
    t = time.perf_counter()
    for _ in range(steps // self.steps_per_call):
      window = self.call(window)
    jax.block_until_ready((self.state, window))
    return (time.perf_counter() - t) / steps

  def profile(self, profile_dir: str, calls: int = 3):
    # The Perfetto JSON beside the xplane reads without TensorBoard (e.g. a per-op table); the
    # trace names fusions only, so the optimised HLO that says what each computes goes beside
    # it (from the executable: XLA's dump flags write nothing when the persistent cache hits).
    with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(self.call(self.new_window()))
    atomic.write_text(paths.join(profile_dir, 'train_step.hlo.txt'), self.compiled.as_text())
    # A call runs steps_per_execution steps: profile_top_ops.py's per-step figures read this.
    step_trace.write_traced_steps(profile_dir, calls * self.steps_per_call)


def load_hf_reference():
  """benchmarks/hf_reference.py from the repository checkout (it is not part of the package)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'benchmarks', 'hf_reference.py')
  if not os.path.isfile(path):
    raise UserError(f"--compare=hf needs {path} (run from a clone of the repository)")
  try:
    # pylint: disable-next=import-outside-toplevel,unused-import,multiple-imports
    import torch, transformers
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
  return {
      'implementation': name,
      'tokens_per_sec': tokens / median,
      'step_ms': 1e3 * median,
      'step_ms_p10': 1e3 * percentile(times, 10),
      'step_ms_p90': 1e3 * percentile(times, 90),
      **flops_lib.utilization(model_flops, 1, median, num_devices, peak),
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
                  profile_dir: str | None = None, peak_override: float | None = None,
                  rounds: int = 1) -> dict:
  if steps < 1 or warmup < 0 or rounds < 1:
    raise UserError(f'--steps={steps} and --rounds={rounds} must be >= 1, --warmup={warmup} >= 0')
  if profile_dir:
    profile_dir = step_trace.checked_directory(profile_dir)
  if peak_override is not None and not 0 < peak_override < float('inf'):
    raise UserError(f"--peak_tflops={peak_override:g} must be the device's peak TFLOP/s, a "
                    'positive finite number (e.g. 989 for an H100 in bfloat16)')
  unknown = sorted(set(compare) - {'hf', 'hf_full'})
  if unknown:
    raise UserError(f'--compare={",".join(unknown)} is not known; use hf and/or hf_full')
  hf_reference = load_hf_reference() if compare else None  # Fail before any compile.
  if hf_reference:
    hf_reference.check_config(config_lib.resolve(config), f'--compare={",".join(compare)}',
                              jax.device_count(), jax.devices()[0].platform)
  exp, host_batch = build(config, data)
  c = exp.config
  per_call = c.steps_per_execution
  if steps != whole_calls(steps, per_call):
    print(f'note: --steps={steps} rounded up to {whole_calls(steps, per_call)}, whole calls '
          f'of config.steps_per_execution={per_call}', flush=True)
    steps = whole_calls(steps, per_call)
  warmup = whole_calls(warmup, per_call)  # As run (and reported): whole calls too.
  devices = exp.mesh.devices.size
  device = jax.devices()[0]
  model_flops = flops_lib.model_flops_per_step(c)
  peak, peak_source = chips.peak_tflops(device.device_kind, c.dtype, peak_override)
  attention = attention_path(c, device)
  print(f'Benchmarking the train step: {device.device_kind} x{devices} ({device.platform}), '
        f'jax {jax.__version__}, {c.dtype}, batch {c.train_batch_size} x {c.max_seq_length}, '
        f'dropout {c.dropout_rate}/{c.attention_dropout_rate}, attention {attention}, '
        f'{rounds} round(s) of {steps} timed steps after {warmup} warmup; data: {data}; '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}', flush=True)

  ours = JaxStep(exp, host_batch, warmup)
  print(f'electra_jax: compiled in {ours.compile_s:.1f}s', flush=True)
  refs = {}
  for name in compare:
    refs[name] = hf_reference.ReferenceStep(
        c, host_batch, gather=(name == 'hf'),
        special_ids=tokenizer_lib.SentencePieceTokenizer.special_ids,
        mask_id=tokenizer_lib.SentencePieceTokenizer.mask_id, platform=device.platform)
    refs[name].run(warmup)
    print(f'{name}: {refs[name].description}', flush=True)

  # Rounds alternate the implementations, so a load change on a shared machine hits both.
  times = {name: [] for name in ['electra_jax', *compare]}
  losses = {name: [] for name in times}
  round_ratios = {name: [] for name in compare}
  for r in range(rounds):
    for name in times:
      t, l = (ours if name == 'electra_jax' else refs[name]).run(steps)
      times[name] += t
      losses[name] += l
      if name != 'electra_jax':
        round_ratios[name].append(statistics.median(t) / statistics.median(
            times['electra_jax'][r * steps:(r + 1) * steps]))
    if rounds > 1:
      print(f'round {r + 1}/{rounds}: ' + ', '.join(
          f'{n} {1e3 * statistics.median(times[n][r * steps:]):.1f} ms' for n in times),
            flush=True)
  dispatch_ms = 1e3 * statistics.median(ours.dispatch_s)
  print(f'electra_jax: the host returns from a call after {dispatch_ms * per_call:.2f} ms, '
        f'{dispatch_ms:.2f} ms a step (median; {per_call} step(s) a call; the rest of the step '
        'time is waiting for the device)', flush=True)
  pipelined_ms = 1e3 * ours.run_pipelined(steps)
  print(f'electra_jax: {pipelined_ms:.2f} ms a step over {steps} steps called back to back '
        '(no wait per call, as in training)', flush=True)
  memory = device_memory.peak()
  if profile_dir:
    ours.profile(profile_dir)
    print(f'Profile of 3 calls ({3 * per_call} steps) written to {profile_dir}',
          flush=True)

  rows = [summarize(name, times[name], model_flops, c, devices, peak) for name in times]
  for name in times:
    print(f'{name}: loss {losses[name][0]:.3f} -> {losses[name][-1]:.3f}')
  print_table(rows)
  result = {k: v for k, v in rows[0].items() if k != 'implementation'}
  result.update(
      model_flops_per_step=model_flops, xla_flops_per_step=ours.xla_flops,
      peak_tflops_per_device=peak, peak_source=peak_source,
      **memory,
      host_dispatch_ms=dispatch_ms, pipelined_step_ms=pipelined_ms, compile_s=ours.compile_s,
      device_kind=device.device_kind, platform=device.platform, device_count=devices,
      jax_version=jax.__version__, dtype=c.dtype, batch=c.train_batch_size,
      seq=c.max_seq_length, steps=steps, rounds=rounds, warmup=warmup, data=data,
      dropout_rate=c.dropout_rate,
      attention_dropout_rate=c.attention_dropout_rate, attention=attention,
      remat=c.remat, objective=c.objective, whole_word_masking=c.whole_word_masking,
      steps_per_execution=c.steps_per_execution,
      xla_flags=os.environ.get('XLA_FLAGS'),
      first_loss=losses['electra_jax'][0], last_loss=losses['electra_jax'][-1],
      profile_dir=profile_dir)
  for row in rows[1:]:
    name = row['implementation']
    result[f'{name}_tokens_per_sec'] = row['tokens_per_sec']
    result[f'{name}_step_ms'] = row['step_ms']
    result[f'{name}_mfu'] = row['mfu']
    result[f'{name}_peak_memory_bytes'] = refs[name].peak_memory_bytes()
    result[f'{name}_first_loss'] = losses[name][0]
    result[f'speedup_vs_{name}'] = rows[0]['tokens_per_sec'] / row['tokens_per_sec']
    result[f'speedup_vs_{name}_per_round'] = round_ratios[name]
    result[f'{name}_versions'] = refs[name].versions
    print(f'electra_jax / {name}: {result[f"speedup_vs_{name}"]:.2f}x tokens/s'
          + (f' (per round: {", ".join(f"{x:.2f}" for x in round_ratios[name])})'
             if rounds > 1 else ''))
  return result


def _define_flags():
  """Flags are defined when the command runs, so importing this module beside another
  command's module (tests, notebooks) does not clash on --config."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_integer('steps', 20, 'Timed train steps (per round; rounded up to whole '
                       'calls of config.steps_per_execution).')
  flags.DEFINE_integer('rounds', 1, 'With --compare: alternate the implementations this many '
                       'times, --steps each (fairer ratios on a machine whose load changes).')
  flags.DEFINE_integer('warmup', 3, 'Untimed steps after compilation (first-run effects; '
                       'rounded up to whole calls).')
  flags.DEFINE_list('compare', [], "Reference implementations to run after ours: 'hf' (HF "
                    "transformers + PyTorch, generator logits only at masked positions) and/or "
                    "'hf_full' (HF's ElectraForMaskedLM as is: logits at every position).")
  flags.DEFINE_enum('data', 'synthetic', ['synthetic', 'corpus'],
                    "'synthetic': random token ids, every row full length (any vocab_size above "
                    "the 5 special tokens); "
                    "'corpus': the first batch of config.train_files through the real pipeline.")
  flags.DEFINE_string('profile_dir', None, 'If set, trace a few extra steps with jax.profiler '
                      'into this directory (TensorBoard / Perfetto) after timing.')
  flags.DEFINE_float('peak_tflops', None, 'Peak TFLOP/s per device for MFU when the device is '
                     'not in the built-in table (e.g. CPUs, which have none).')
  cpu_devices.define_flag()


def main(argv):
  del argv  # cli.run refuses stray arguments.
  cpu_devices.configure_for(FLAGS.config, FLAGS.cpu_devices)
  # A benchmark refused after its --profile_dir was made leaves none behind.
  with paths.new_dirs_removed_on_failure(FLAGS.profile_dir):
    result = run_benchmark(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.compare, FLAGS.data,
                           FLAGS.profile_dir, FLAGS.peak_tflops, FLAGS.rounds)
  cli.print_result(result)


def run():
  """Console entry point (electra-benchmark)."""
  _define_flags()
  flags.mark_flags_as_required(['config'])
  cli.run(main)


if __name__ == '__main__':
  run()
