"""The most expensive ops of a `benchmark --profile_dir` trace, per device track, and how busy
each track was.

  python benchmarks/profile_top_ops.py PROFILE_DIR_OR_perfetto_trace.json.gz [--top=10]
      [--steps=N] [--hlo=PROFILE_DIR/train_step.hlo.txt]

Reads the Perfetto JSON that jax.profiler writes beside the xplane (no TensorBoard needed).
For every track of an accelerator (`/device:GPU:0` streams, `XLA Ops`, ...) it sums the time of
each op name and the union of the op intervals over the traced span: 1 - busy is that track's
idle share (host-device gaps, launch latency). CPU traces nest and overlap their events; read
those in Perfetto instead.

With the step's optimised HLO (the benchmark writes train_step.hlo.txt beside the trace) it
also splits the busiest track's kernels by where they come from in the model: each fusion's
op_name (e.g. `transpose(jvp(Electra.generator_logits))/generator/encoder`, layers folded into
layer_N), per traced step: the steps the trace holds come from PROFILE_DIR/traced_steps.json,
which the benchmark and train write (a call runs config.steps_per_execution steps; --steps
overrides it). Kernels the HLO does not name (cuBLAS, memsets) are listed by name.
Last, the host's CUDA-graph events: how often XLA re-recorded the step's graph and how long the
launches took.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys


def load_events(path: str) -> tuple[list[dict], dict, dict]:
  """(events, {pid: process name}, {(pid, tid): thread name})."""
  if not os.path.exists(path):
    sys.exit(f'error: {path} does not exist; pass the --profile_dir of python -m '
             'electra_jax.benchmark, or a perfetto_trace.json.gz in it')
  if os.path.isdir(path):
    found = sorted(glob.glob(os.path.join(path, '**', 'perfetto_trace.json.gz'), recursive=True))
    if not found:
      sys.exit(f'error: no perfetto_trace.json.gz under {path}; profile with '
               'python -m electra_jax.benchmark --profile_dir=DIR')
    path = found[-1]
  with gzip.open(path, 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  names = lambda kind, key: {key(e): e['args']['name'] for e in events
                             if e.get('ph') == 'M' and e.get('name') == kind}
  return (events, names('process_name', lambda e: e['pid']),
          names('thread_name', lambda e: (e['pid'], e.get('tid'))))


def busy_fraction(ops: list[dict]) -> float:
  """Union of the op intervals over the span from the first start to the last end."""
  intervals = sorted((e['ts'], e['ts'] + e['dur']) for e in ops)
  busy, end = 0.0, float('-inf')
  for lo, hi in intervals:
    if hi > end:
      busy += hi - max(lo, end)
      end = hi
  span = max(hi for _, hi in intervals) - intervals[0][0]
  return busy / span if span else 0.0


def device_tracks(events, processes) -> list[tuple[tuple, list[dict]]]:
  """[((pid, tid), ops)] of the accelerator tracks, the most op time first."""
  tracks = collections.defaultdict(list)
  for e in events:
    if e.get('ph') == 'X' and processes.get(e['pid'], '').startswith('/device:'):
      tracks[(e['pid'], e.get('tid'))].append(e)
  return sorted(tracks.items(), key=lambda kv: -sum(e['dur'] for e in kv[1]))


def summarize(tracks, processes, threads, top: int = 10) -> list[dict]:
  """One summary per device_tracks() track: op time by name (top N), count, share, busy."""
  out = []
  for key, ops in tracks:
    totals, counts = collections.Counter(), collections.Counter()
    for e in ops:
      totals[e['name']] += e['dur']
      counts[e['name']] += 1
    op_time = sum(totals.values())
    out.append(dict(
        track=f'{processes[key[0]]} / {threads.get(key, key[1])}', num_ops=len(ops),
        op_time_us=op_time, busy=busy_fraction(ops),
        top=[dict(name=n, total_us=t, count=counts[n], share=t / op_time if op_time else 0.0)
             for n, t in totals.most_common(top)]))
  return out


def hlo_op_names(hlo_text: str) -> dict:
  """{kernel name as the trace spells it: op_name of the HLO instruction}. The trace writes an
  instruction `loop_add_fusion.49` as `loop_add_fusion_49`."""
  found = re.finditer(r'^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*?metadata=\{op_name="([^"]*)"',
                      hlo_text, re.M)
  return {re.sub(r'[.\-]', '_', m.group(1)): m.group(2) for m in found}


def scope_of(op_name: str, depth: int = 3) -> str:
  """The first `depth` parts of an op_name, without the jit(...) of the step, layers folded."""
  op_name = re.sub(r'layer_\d+', 'layer_N', re.sub(r'^jit\([^)]*\)/', '', op_name))
  return '/'.join(op_name.split('/')[:depth])


def by_scope(ops: list[dict], op_names: dict, steps: int) -> list[dict]:
  """Kernels and time per step by source scope, most kernels first."""
  counts, totals = collections.Counter(), collections.Counter()
  for e in ops:
    name = re.sub(r'[.\-]', '_', e['name'])
    unnamed = '(unnamed) ' + re.sub(r'_\d+$', '', name)  # one row per kernel kind
    scope = scope_of(op_names[name]) if name in op_names else unnamed
    counts[scope] += 1
    totals[scope] += e['dur']
  return [dict(scope=k, kernels_per_step=n / steps, us_per_step=totals[k] / steps)
          for k, n in counts.most_common()]


# Host-side events of a GPU step: XLA re-records the step's CUDA graph (`update`) when a buffer
# it uses moved since the last launch, then launches it.
HOST_EVENTS = ('command_buffer::update', 'command_buffer::execute', 'cuGraphLaunch')


def host_summary(events) -> list[dict]:
  """Count and median milliseconds of each HOST_EVENTS kind (by name prefix) in the trace."""
  out = []
  for kind in HOST_EVENTS:
    durations = sorted(e['dur'] for e in events
                       if e.get('ph') == 'X' and e.get('name', '').startswith(kind))
    if durations:
      out.append(dict(event=kind, count=len(durations),
                      median_ms=durations[len(durations) // 2] / 1e3))
  return out


# Written beside the traces by `benchmark --profile_dir` and `train --profile_dir`
# (electra_jax/step_trace.py's TRACED_STEPS_FILE): {"steps": N}.
TRACED_STEPS_FILE = 'traced_steps.json'


def traced_steps(path: str, override: int | None) -> int:
  """Train steps in the trace: --steps, else the profile directory's traced_steps.json."""
  if override is not None:
    if override < 1:
      sys.exit(f'error: --steps={override} must be at least 1')
    return override
  found = os.path.join(path, TRACED_STEPS_FILE) if os.path.isdir(path) else None
  if not (found and os.path.isfile(found)):
    sys.exit(f'error: no {TRACED_STEPS_FILE} in {path} to say how many steps the trace holds '
             '(pass the profile directory, not the trace file, or --steps=N)')
  with open(found) as f:
    return int(json.load(f)['steps'])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('path', help='a --profile_dir directory or a perfetto_trace.json.gz')
  parser.add_argument('--top', type=int, default=10, help='ops listed per track')
  parser.add_argument('--steps', type=int, help='train steps in the trace (default: the '
                      f"profile directory's {TRACED_STEPS_FILE}, which the benchmark and train "
                      'write)')
  parser.add_argument('--hlo', help='the optimised HLO of the traced step; default: '
                      'train_step.hlo.txt in the profile directory, if there')
  args = parser.parse_args()
  hlo = args.hlo or (os.path.join(args.path, 'train_step.hlo.txt')
                     if os.path.isdir(args.path) else None)
  hlo = hlo if hlo and os.path.isfile(hlo) else None
  steps = traced_steps(args.path, args.steps) if hlo else None  # Only per-step figures need it.
  events, processes, threads = load_events(args.path)
  grouped = device_tracks(events, processes)
  tracks = summarize(grouped, processes, threads, top=args.top)
  if not tracks:
    sys.exit('error: the trace has no accelerator (/device:...) tracks; CPU traces nest their '
             'events: open them in Perfetto (ui.perfetto.dev) or TensorBoard instead')
  for t in tracks:
    print(f'\n{t["track"]}: {t["num_ops"]} ops, {t["op_time_us"] / 1e3:.2f} ms of op time, '
          f'busy {100 * t["busy"]:.1f} % of its span')
    print(f'{"share":>6}  {"total ms":>9}  {"count":>6}  op')
    for r in t['top']:
      print(f'{100 * r["share"]:5.1f}%  {r["total_us"] / 1e3:9.3f}  {r["count"]:6d}  '
            f'{r["name"][:110]}')
  scopes = []
  if hlo:
    with open(hlo) as f:
      op_names = hlo_op_names(f.read())
    scopes = by_scope(grouped[0][1], op_names, steps)
    print(f'\nKernels of {tracks[0]["track"]} by source scope, per step ({steps} traced):')
    print(f'{"kernels":>8}  {"ms":>7}  scope')
    for r in scopes[:2 * args.top]:
      print(f'{r["kernels_per_step"]:8.1f}  {r["us_per_step"] / 1e3:7.3f}  {r["scope"][:110]}')
    if len(scopes) > 2 * args.top:
      print(f'(and {len(scopes) - 2 * args.top} more scopes in the JSON line)')
  host = host_summary(events)
  if host:
    print('\nHost (CUDA graphs): ' + '; '.join(
        f'{h["event"]} x{h["count"]}, median {h["median_ms"]:.2f} ms' for h in host))
  print(json.dumps(dict(tracks=tracks, scopes=scopes, traced_steps=steps, host=host)))


if __name__ == '__main__':
  main()
