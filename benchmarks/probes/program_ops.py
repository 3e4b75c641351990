"""What the compiled train step is made of: the ops that launch work, by computation.

    python benchmarks/probes/program_ops.py --config=configs/small.py \
        --config.train_batch_size=8 [--config.KEY=VALUE ...]

Compiles the step as the benchmark does (benchmark.JaxStep: the program training calls)
for this machine's backend and counts, in its optimised HLO, the ops outside fused computations
that run work
(fusions, copies, dots, custom calls, reductions, sorts, scatters, whiles, conditionals): a
device-independent proxy for kernel launches, beside the count of array-shaped isfinite checks
and XLA's memory analysis. Session 13 (benchmarks/RESULTS.md) used it to compare the
non-finite skips; a GPU trace (gpu_suite.sh profile) counts the real kernels.
"""
import collections
import json
import re
import sys

sys.path.insert(0, '.')
# pylint: disable=wrong-import-position
import jax
from absl import app
from absl import flags
from ml_collections import config_flags

from electra_jax import benchmark

LAUNCHING = ('fusion', 'copy', 'dot', 'custom-call', 'reduce', 'sort', 'scatter', 'while',
             'conditional', 'convolution', 'all-reduce')


def computations(hlo: str) -> dict:
  """Name -> text of each computation that is not a fusion's body."""
  out = {}
  for block in re.split(r'\n(?=\S)', hlo):
    head = block.split('\n', 1)[0].split()
    if not head:
      continue
    name = head[1] if head[0] == 'ENTRY' else head[0]
    if 'fused' not in name and 'wrapped' not in name:
      out[name] = block
  return out


def main(argv):
  del argv
  step = benchmark.JaxStep(*benchmark.build(flags.FLAGS.config, 'synthetic'), warmup=0)
  compiled, state = step.compiled, step.state
  hlo = compiled.as_text()
  ops = collections.Counter()
  per_computation = {}
  pattern = r'=\s*\S+\s+(' + '|'.join(re.escape(k) for k in LAUNCHING) + r')\('
  for name, text in computations(hlo).items():
    found = collections.Counter(re.findall(pattern, text))
    if found:
      per_computation[name] = sum(found.values())
      ops.update(found)
  memory = compiled.memory_analysis()
  print(json.dumps({
      'state_arrays': len(jax.tree.leaves(state)),
      'param_arrays': len(jax.tree.leaves(state.params)),
      'launching_ops': dict(ops.most_common()),
      'largest_computations': dict(sorted(per_computation.items(),
                                          key=lambda kv: -kv[1])[:4]),
      'array_isfinite': len(re.findall(r'= pred\[\d[^\]]*\][^=]* is-finite\(', hlo)),
      'temp_mb': round(memory.temp_size_in_bytes / 1e6, 2),
      'argument_mb': round(memory.argument_size_in_bytes / 1e6, 2),
      'backend': jax.default_backend(), 'jax_version': jax.__version__}))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.')
  flags.mark_flags_as_required(['config'])
  app.run(main)
