"""The most expensive ops of a `benchmark --profile_dir` trace, per device track, and how busy
each track was.

  python benchmarks/profile_top_ops.py PROFILE_DIR_OR_perfetto_trace.json.gz [--top=10]

Reads the Perfetto JSON that jax.profiler writes beside the xplane (no TensorBoard needed).
For every track of an accelerator (`/device:GPU:0` streams, `XLA Ops`, ...) it sums the time of
each op name and the union of the op intervals over the traced span: 1 - busy is that track's
idle share (host-device gaps, launch latency). CPU traces nest and overlap their events; read
those in Perfetto instead.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import sys


def load_events(path: str) -> tuple[list[dict], dict, dict]:
  """(events, {pid: process name}, {(pid, tid): thread name})."""
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


def summarize(events, processes, threads, top: int = 10) -> list[dict]:
  """One summary per accelerator track: op time by name (top N), count, share, busy."""
  tracks = collections.defaultdict(list)
  for e in events:
    if e.get('ph') == 'X' and processes.get(e['pid'], '').startswith('/device:'):
      tracks[(e['pid'], e.get('tid'))].append(e)
  out = []
  for key, ops in sorted(tracks.items(), key=lambda kv: -sum(e['dur'] for e in kv[1])):
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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('path', help='a --profile_dir directory or a perfetto_trace.json.gz')
  parser.add_argument('--top', type=int, default=10, help='ops listed per track')
  args = parser.parse_args()
  tracks = summarize(*load_events(args.path), top=args.top)
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
  print(json.dumps(dict(tracks=tracks)))


if __name__ == '__main__':
  main()
