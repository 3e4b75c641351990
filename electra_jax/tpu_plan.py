"""`train --dry_run --topology=SLICE [--sweep]`: the real train step compiled ahead of time for a
TPU slice, on a machine without one (topology.py), with its memory per chip against HBM and a
roofline prediction of its speed.

The step is the run's own (Experiment.jit_train_step: shardings over a Mesh of the slice's
devices, donated state, remat, grad accumulation, dtype, FSDP), lowered with abstract inputs and
compiled by libtpu. Memory per chip is the compiled program's (memory_analysis): arguments +
outputs + temporaries + generated code - what donation aliases, as MaxText's train_compile
counts it. A step the compiler cannot fit is reported with the temporaries it asked for.

The prediction is a roofline, not a measurement, and a lower bound on the step time: the
slower of XLA's FLOPs per chip at the chip's bf16 peak and the least HBM traffic of the step
(arguments read, outputs written, temporaries written and read once) at its HBM bandwidth. It
leaves out collectives over ICI (gradient all-reduce, FSDP all-gathers), how well the kernels
use the MXUs, per-op and host overheads and input loading, so a real step is slower and real
MFU lower. XLA's cost analysis counts a loop body once: with grad_accum_steps=k its FLOPs are
multiplied by k (the optimizer update, outside the loop, is a fraction of a percent of them).
"""
import dataclasses
import importlib.metadata
import re
import time

import jax
import jax.numpy as jnp

from electra_jax import dry_run
from electra_jax import experiment as experiment_lib
from electra_jax import parallel
from electra_jax import topology
from electra_jax.data import pipeline
from electra_jax.errors import UserError

GiB = 2**30
REMATS = ('none', 'save_dots', 'full')
# Settings whose predicted step times differ by less than this count as equally fast; the sweep
# then prefers no FSDP, less remat and less accumulation (collectives are not in the roofline).
TIE = 0.01
_OOM = re.compile(r'HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM '
                  r'\(([\d.]+)([KMGT]?)\)')
_UNITS = {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


def abstract_inputs(exp):
  """(state, batch, rng) as sharded ShapeDtypeStructs: what the loop feeds the step."""
  c, mesh = exp.config, exp.mesh
  batch_sharding = parallel.batch_sharding(mesh)
  shape = (c.train_batch_size, c.max_seq_length)
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding)
           for k in pipeline.FEATURES}
  key = jax.eval_shape(jax.random.key, 0)
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=parallel.replicated(mesh))
  return exp.abstract_state(), batch, rng


def compile_step(exp):
  """(compiled step, None), or (None, the compiler's out-of-memory message)."""
  try:
    return exp.jit_train_step().lower(*abstract_inputs(exp)).compile(), None
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    return None, str(e).strip().splitlines()[0]


def out_of_memory_bytes(message: str) -> tuple[int | None, int | None]:
  """(bytes the program asked for, bytes available) from the TPU compiler's OOM message."""
  match = _OOM.search(message)
  if not match:
    return None, None
  to_bytes = lambda value, unit: int(float(value) * _UNITS[unit])
  return to_bytes(*match.group(1, 2)), to_bytes(*match.group(3, 4))


def memory(compiled, chip) -> dict:
  """Per-chip memory of a compiled step (memory_analysis) against the chip's HBM."""
  m = compiled.memory_analysis()
  parts = dict(argument_bytes=m.argument_size_in_bytes, output_bytes=m.output_size_in_bytes,
               temp_bytes=m.temp_size_in_bytes,
               generated_code_bytes=m.generated_code_size_in_bytes,
               alias_bytes=m.alias_size_in_bytes)
  total = (parts['argument_bytes'] + parts['output_bytes'] + parts['temp_bytes']
           + parts['generated_code_bytes'] - parts['alias_bytes'])
  return dict(parts, memory_bytes_per_chip=total,
              xla_peak_memory_bytes=getattr(m, 'peak_memory_in_bytes', None),
              fits=total <= chip.usable_hbm_bytes, hbm_fraction=total / chip.usable_hbm_bytes)


def roofline(compiled, chip, c, memory_parts: dict, model_flops_per_chip: float) -> dict:
  """Predicted step time and MFU of a compiled step: a lower bound on time (module doc)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  k = c.grad_accum_steps
  xla_flops = float(cost['flops']) * k
  # The least HBM traffic of the step: every argument read, every output written, and the
  # temporaries written and read once. (XLA's 'bytes accessed' is no HBM figure on TPU: it also
  # counts operands inside fusions and copies into on-chip memory, 3x the operand and result
  # bytes of a two-matmul chain measured here; it is reported, not used.)
  hbm_bytes = (memory_parts['argument_bytes'] + memory_parts['output_bytes']
               + 2 * memory_parts['temp_bytes'])
  compute_s, hbm_s = xla_flops / chip.peak_bf16_flops, hbm_bytes / chip.hbm_bytes_per_sec
  step_s = max(compute_s, hbm_s)
  return dict(
      xla_flops_per_chip=xla_flops, min_hbm_bytes_per_chip=hbm_bytes,
      xla_bytes_accessed_per_chip=float(cost['bytes accessed']) * k,
      predicted_compute_s=compute_s, predicted_hbm_s=hbm_s, predicted_step_s=step_s,
      predicted_bound='compute' if compute_s >= hbm_s else 'HBM bandwidth',
      predicted_mfu=model_flops_per_chip / step_s / chip.peak_bf16_flops,
      predicted_tokens_per_sec=c.train_batch_size * c.max_seq_length / step_s,
      predicted_days=step_s * c.num_train_steps / 86400)


def plan(config, chip, topology_name: str, devices, name: str | None = None) -> dict:
  """The compiled plan of `config` on a TPU slice: dry_run.plan's shapes, the compiled
  memory per chip, and the roofline prediction; flat, for the JSON line."""
  exp = experiment_lib.Experiment.create(config, devices, read_vocab=False)
  p = dry_run.plan(exp)
  t = time.time()
  compiled, oom = compile_step(exp)
  p.update(topology=name or topology_name, libtpu_topology=topology_name, chip=chip.name,
           libtpu_version=importlib.metadata.version('libtpu'), dtype=exp.config.dtype,
           remat=exp.config.remat, fsdp_axis_size=exp.config.fsdp_axis_size,
           num_train_steps=exp.config.num_train_steps,
           compile_s=round(time.time() - t, 1), usable_hbm_bytes=chip.usable_hbm_bytes,
           hbm_bytes=chip.hbm_bytes, peak_bf16_flops=chip.peak_bf16_flops,
           hbm_bytes_per_sec=chip.hbm_bytes_per_sec)
  if compiled is None:
    needed, _ = out_of_memory_bytes(oom)
    p.update(fits=False, compiler_out_of_memory=oom, memory_bytes_per_chip=None,
             temp_bytes_needed=needed, predicted_step_s=None)
    return p
  p.update(memory(compiled, chip))
  p.update(roofline(compiled, chip, exp.config, p, p['model_flops_per_step_per_device']))
  return p


def _gib(b) -> str:
  return f'{b / GiB:.2f} GiB'


def describe(p: dict) -> str:
  """The compiled plan's lines, after dry_run.describe's."""
  lines = [dry_run.describe(p), (
      f"topology    {p['topology']} = libtpu {p['libtpu_topology']}: {p['num_devices']} "
      f"{p['device_kind']} chips on {p['num_processes']} host(s); remat {p['remat']}, "
      f"fsdp_axis_size {p['fsdp_axis_size']}, {p['dtype']}; compiled by libtpu "
      f"{p['libtpu_version']} in {p['compile_s']:.0f}s")]
  usable = f"{_gib(p['usable_hbm_bytes'])} usable HBM per chip"
  if p['memory_bytes_per_chip'] is None:
    needed = p['temp_bytes_needed']
    lines.append(f"memory      DOES NOT FIT: the compiler needs "
                 f"{_gib(needed) if needed else '?'} of temporaries, more than the {usable} "
                 f"({p['compiler_out_of_memory']})")
    return '\n'.join(lines)
  lines.append(
      f"memory      per chip: arguments {_gib(p['argument_bytes'])} + outputs "
      f"{_gib(p['output_bytes'])} + temporaries {_gib(p['temp_bytes'])} + code "
      f"{_gib(p['generated_code_bytes'])} - donated (aliased) {_gib(p['alias_bytes'])} = "
      f"{_gib(p['memory_bytes_per_chip'])} of {usable}: "
      f"{'fits' if p['fits'] else 'DOES NOT FIT'} ({100 * p['hbm_fraction']:.0f} %)")
  lines.append(
      f"prediction  a roofline, not a measurement: step >= {p['predicted_step_s']:.3g} s, "
      f"{p['predicted_bound']}-bound ({p['xla_flops_per_chip'] / 1e12:.1f} TFLOP per chip at "
      f"{p['peak_bf16_flops'] / 1e12:.0f} TFLOP/s = {p['predicted_compute_s']:.3g} s; "
      f"at least {p['min_hbm_bytes_per_chip'] / 1e9:.1f} GB at "
      f"{p['hbm_bytes_per_sec'] / 1e9:.0f} GB/s = {p['predicted_hbm_s']:.3g} s): MFU <= "
      f"{100 * p['predicted_mfu']:.0f} %, "
      f"{p['predicted_tokens_per_sec'] / 1e6:.2f}M tokens/s, {p['num_train_steps']} steps in "
      f">= {p['predicted_days']:.1f} days\n"
      '            leaves out collectives over ICI, MXU efficiency, per-op and host overheads:'
      ' real steps are slower')
  if p['dtype'] == 'float32':
    lines.append('hint        config.dtype=float32: TPU runs usually take '
                 '--config.dtype=bfloat16 (about half the activation memory)')
  return '\n'.join(lines)


@dataclasses.dataclass
class SweepRow:
  fsdp_axis_size: int
  remat: str
  grad_accum_steps: int
  per_device_micro_batch: int
  fits: bool
  memory_bytes_per_chip: int | None  # None when the compiler ran out of memory
  temp_bytes_needed: int | None
  predicted_step_s: float | None
  predicted_mfu: float | None
  predicted_days: float | None
  compile_s: float


def sweep_settings(config, num_devices: int, remats, fsdps):
  """(fsdp, remat, [accumulation steps, fewest first]) to try; each list stops where the
  global batch no longer splits over devices x steps."""
  batch = config.train_batch_size
  accums = []
  k = 1
  while batch % (num_devices * k) == 0:
    accums.append(k)
    k *= 2
  for fsdp in fsdps:
    if num_devices % fsdp:
      continue
    for remat in remats:
      yield fsdp, remat, accums


def sweep(config, chip, topology_name: str, devices, remats=REMATS, fsdps=(1, 8), name=None,
          say=print) -> tuple[list[SweepRow], SweepRow | None]:
  """Compiles each (fsdp, remat) with the fewest accumulation steps that fit (more steps only
  add time); returns the rows and the fastest predicted row that fits (None if none does)."""
  rows = []
  for fsdp, remat, accums in sweep_settings(config, len(devices), remats, fsdps):
    for accum in accums:
      c = config.copy_and_resolve_references()
      c.update(remat=remat, fsdp_axis_size=fsdp, grad_accum_steps=accum)
      p = plan(c, chip, topology_name, devices, name)
      row = SweepRow(fsdp, remat, accum, p['per_device_micro_batch'], p['fits'],
                     p['memory_bytes_per_chip'], p.get('temp_bytes_needed'),
                     p['predicted_step_s'], p.get('predicted_mfu'), p.get('predicted_days'),
                     p['compile_s'])
      rows.append(row)
      say(format_row(row), flush=True)
      if row.fits:
        break
  fitting = [r for r in rows if r.fits]
  if not fitting:
    return rows, None
  fastest = min(r.predicted_step_s for r in fitting)
  near = [r for r in fitting if r.predicted_step_s <= fastest * (1 + TIE)]
  return rows, min(near, key=lambda r: (r.fsdp_axis_size, REMATS.index(r.remat),
                                        r.grad_accum_steps))


TABLE_HEADER = ('fsdp  remat      accum  micro-batch/chip  memory/chip          fits  '
                'step (pred.)  MFU (pred.)  days (pred.)')


def format_row(r: SweepRow) -> str:
  memory = (_gib(r.memory_bytes_per_chip) if r.memory_bytes_per_chip is not None else
            f'> usable (needs {_gib(r.temp_bytes_needed)} temp)' if r.temp_bytes_needed else
            '> usable')
  step = f'{r.predicted_step_s:.3g} s' if r.predicted_step_s else '-'
  mfu = f'{100 * r.predicted_mfu:.0f} %' if r.predicted_mfu else '-'
  days = f'{r.predicted_days:.1f}' if r.predicted_days else '-'
  return (f'{r.fsdp_axis_size:<5d} {r.remat:<10s} {r.grad_accum_steps:<6d} '
          f'{r.per_device_micro_batch:<17d} {memory:<20s} {"yes" if r.fits else "no":<5s} '
          f'{step:<13s} {mfu:<12s} {days}')


def run(config, topology_name: str, sweep_remats=None, sweep_fsdps=None, say=print) -> dict:
  """The --dry_run --topology command: one compiled plan, or the sweep when sweep_remats /
  sweep_fsdps are given; prints the report and returns the JSON line's record."""
  chip, libtpu_name = topology.parse(topology_name)
  batch, n = config.train_batch_size, topology.num_chips(libtpu_name)
  if batch % n:
    raise UserError(f'config.train_batch_size={batch} does not split over the {n} chips of '
                    f'--topology={topology_name}; use a multiple of {n} or a slice whose chip '
                    f'count divides {batch}')
  # Before anything is printed or compiled: an empty list compiled nothing, said 'Nothing
  # fits' and exited 0.
  if sweep_remats is not None and (not sweep_remats or not set(sweep_remats) <= set(REMATS)):
    raise UserError(f'--sweep_remat={",".join(sweep_remats)}: give some of {",".join(REMATS)}')
  if sweep_fsdps is not None and all(n % f for f in sweep_fsdps):
    raise UserError(f'--sweep_fsdp={",".join(map(str, sweep_fsdps))}: no value divides the {n} '
                    f'chips of --topology={topology_name}, so nothing would be compiled; use '
                    f'some of {",".join(str(d) for d in range(1, n + 1) if n % d == 0)}')
  devices = topology.devices(chip, libtpu_name)
  note = None
  if config.eval_batch_size % n:
    # Evaluation is no part of the train step: plan it, but say what a run would stop on.
    note = (f'config.eval_batch_size={config.eval_batch_size} does not split over the {n} '
            f'chips: a run would stop on it; pass --config.eval_batch_size={n} (or a multiple)')
    config = config.copy_and_resolve_references()
    config.eval_batch_size = n
  if sweep_remats is None and sweep_fsdps is None:
    p = plan(config, chip, libtpu_name, devices, topology_name)
    say(describe(p) + (f'\nnote        {note}' if note else ''), flush=True)
    return dict(p, note=note) if note else p
  fsdps = [f for f in sweep_fsdps if n % f == 0]
  skipped = [f for f in sweep_fsdps if n % f]
  say(f'Sweeping {topology_name} = libtpu {libtpu_name} ({n} {chip.device_kind} chips, '
      f'{_gib(chip.usable_hbm_bytes)} usable HBM each): global batch {batch} x '
      f'{config.max_seq_length}, {config.dtype}; remat {",".join(sweep_remats)} x fsdp '
      f'{",".join(map(str, fsdps))}'
      + (f' (fsdp {",".join(map(str, skipped))} skipped: does not divide {n})' if skipped else '')
      + '; per setting the fewest accumulation steps that fit. Predictions are a roofline '
      '(no ICI collectives, no overheads): lower bounds on step time.', flush=True)
  say(TABLE_HEADER, flush=True)
  rows, best = sweep(config, chip, libtpu_name, devices, sweep_remats, fsdps, topology_name,
                     say)
  if note:
    say(f'Note: {note}', flush=True)
  if best is None:
    say('Nothing fits: try a larger slice, more accumulation (a smaller global batch per '
        "step), remat 'full' or a larger fsdp_axis_size.", flush=True)
  else:
    say(f'Fastest predicted setting that fits: --config.fsdp_axis_size={best.fsdp_axis_size} '
        f'--config.remat={best.remat} --config.grad_accum_steps={best.grad_accum_steps} '
        f'({best.predicted_step_s:.3g} s per step, >= {best.predicted_days:.1f} days for '
        f'{config.num_train_steps} steps; a prediction)', flush=True)
  return dict(dry_run=True, sweep=True, topology=topology_name, libtpu_topology=libtpu_name,
              chip=chip.name, num_devices=n, usable_hbm_bytes=chip.usable_hbm_bytes,
              global_batch=batch, seq_length=config.max_seq_length, dtype=config.dtype,
              rows=[dataclasses.asdict(r) for r in rows],
              best=dataclasses.asdict(best) if best else None, **({'note': note} if note else {}))
