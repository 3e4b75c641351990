"""What parts of the real train step cost: row-keyed dropout, the exact AUC, the non-finite skip.

  python benchmarks/step_parts.py --config=configs/small.py [--config.KEY=VALUE ...] \
      [--steps=30] [--warmup=3] [--rounds=3] [--variants=as_trained,no_auc,...]

Dropout draws each row's mask from that row's own key (electra_jax/row_keys.py), so results do
not depend on how the batch is split over devices; the discriminator's AUC metric is exact (a
sort of every token's logit, objectives/metrics.py). Both run inside the jitted step. This
builds the step exactly as `electra_jax.benchmark` does, once as trained and once per variant
with one part swapped out while it is traced (this script's patches, not a switch of the
product):

  plain_dropout_key  Flax's usual dropout: one key for the whole batch (not topology-invariant)
  no_auc             the AUC sums replaced by zeros
  no_dropout         dropout_rate = attention_dropout_rate = 0 (what all dropout costs)
  apply_if_finite    optax.apply_if_finite as the non-finite skip instead of
                     optim.skip_if_nonfinite (same results, plus an isfinite reduction of
                     every gradient array): a negative cost is what skip_if_nonfinite saves

Only when named in --variants:

  flat_optimizer     the same optimizer chain over a few long vectors, not one array per
                     parameter: each network's decayed and undecayed parameters joined into
                     one vector each (gradients joined, updates split back every step), and
                     the logged gradient norm over one joined vector. The same arithmetic (sums
                     in another order); XLA:GPU runs the per-array Adam and norms as ~950
                     small kernels in Base's step (benchmarks/RESULTS.md, session 15): a
                     positive cost is what fewer, longer kernels would save.
  autodiff_softmax_backward  attention's softmax and dropout (model.softmax_dropout) with
                     the backward JAX's autodiff derives, as the model had it before
                     2026-11-27 (needs --config.attention_dropout_rate > 0): besides the bf16
                     dropped probabilities the next matmul keeps, it keeps 14 bytes a score
                     element (the masked f32 scores, the f32 exp, the f32 dropped
                     probabilities, two bool masks) where the model's own backward keeps 3 (the
                     bf16 probabilities and the keep mask). A negative cost is what the
                     model's backward saves
  f32_scores         attention's q.k matmul writing float32 scores (and the 1/sqrt(head_dim)
                     after it), as the model did before 2026-11-27; it writes them in the
                     compute dtype now (model.attention_scores). Where attention dropout
                     makes the model write the [batch, heads, seq, seq] scores (needs
                     --config.attention_dropout_rate > 0) a negative cost is what bf16 scores
                     save; first_loss_sums should agree with as_trained's to bf16 rounding

and only where the trained step's attention is cuDNN's (an NVIDIA GPU, bfloat16,
--config.attention_dropout_rate=0: benchmark.attention_path):

  xla_attention      config.attention_implementation='xla': XLA's attention instead; a
                     negative cost is what cuDNN saves; first_loss_sums should agree with
                     as_trained's to bf16 rounding

The variants are timed in alternating rounds (a load change hits all alike), each round
--steps rounded up to whole calls of config.steps_per_execution steps. Prints a table;
the last stdout line is JSON: each variant's median step time, `cost_ms` of the swapped
part (as trained minus the variant) and `temp_mb`, XLA's temporary memory for the compiled
program (what the step keeps from its forward for its backward among others).
"""
import contextlib
import statistics
from unittest import mock

import jax
import jax.numpy as jnp
import optax
from absl import flags
from ml_collections import config_flags

from electra_jax import benchmark
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import cpu_devices
from electra_jax import model
from electra_jax import optim
from electra_jax import row_keys
from electra_jax.errors import UserError
from electra_jax.objectives import metrics as objective_metrics

FLAGS = flags.FLAGS
VARIANTS = ('as_trained', 'plain_dropout_key', 'no_auc', 'no_dropout', 'apply_if_finite')
# Not in the default --variants.
OPTIONAL_VARIANTS = ('flat_optimizer', 'f32_scores', 'autodiff_softmax_backward')
GPU_VARIANTS = ('xla_attention',)  # Not in the default --variants: they need cuDNN.
# Variants of the path that writes attention's scores (attention dropout > 0).
SCORE_VARIANTS = ('f32_scores', 'autodiff_softmax_backward')
_GROUPS = (('weights', True), ('bias', False))  # optim.weight_decay_mask reads these names.
_make_optimizer = optim.make_optimizer


def _joined(tree, decays):
  """{network: {'weights': its decayed arrays raveled and joined, 'bias': the others}}."""
  joined = {}
  for top, sub in tree.items():
    pairs = list(zip(jax.tree.leaves(sub), jax.tree.leaves(decays[top])))
    joined[top] = {name: jnp.concatenate([x.reshape(-1) for x, d in pairs if d == wanted]
                                         or [jnp.zeros((0,), jnp.float32)])
                   for name, wanted in _GROUPS}
  return joined


def _split(joined, like, decays):
  """_joined's inverse: arrays shaped and nested as `like`."""
  out = {}
  for top, sub in like.items():
    leaves, treedef = jax.tree.flatten(sub)
    offsets, parts = {name: 0 for name, _ in _GROUPS}, []
    for x, d in zip(leaves, jax.tree.leaves(decays[top])):
      name = 'weights' if d else 'bias'
      parts.append(joined[top][name][offsets[name]:offsets[name] + x.size].reshape(x.shape))
      offsets[name] += x.size
    out[top] = jax.tree.unflatten(treedef, parts)
  return out


def _flat(tx: optax.GradientTransformationExtraArgs) -> optax.GradientTransformationExtraArgs:
  """`tx` over _joined vectors: its state holds them, its update takes and gives trees."""
  def init(params):
    return tx.init(_joined(params, optim.weight_decay_mask(params)))

  def update(updates, state, params=None, **extra_args):
    decays = optim.weight_decay_mask(updates)
    joined_params = None if params is None else _joined(params, decays)
    joined, state = tx.update(_joined(updates, decays), state, joined_params, **extra_args)
    return _split(joined, updates, decays), state
  return optax.GradientTransformationExtraArgs(init, update)


def _flat_optimizer(c):
  tx, schedule = _make_optimizer(c)
  return _flat(tx), schedule


def _joined_norm(tree):
  return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate(
      [x.reshape(-1).astype(jnp.float32) for x in jax.tree.leaves(tree)]))))


def _f32_scores(q, k):
  return jnp.einsum('bqhd,bkhd->bhqk', q, k,
                    preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])


@contextlib.contextmanager
def _flat_patches():
  with mock.patch.object(optim, 'make_optimizer', _flat_optimizer), \
       mock.patch.object(optax.tree, 'norm', _joined_norm):
    yield


def traced_as(variant: str, config):
  """(config, context manager active while the variant's experiment is built and its step
  traced)."""
  c = config.copy_and_resolve_references()
  if variant == 'apply_if_finite':
    optax_skip = lambda tx: optax.apply_if_finite(tx, max_consecutive_errors=2**31 - 1)
    return c, mock.patch.object(optim, 'skip_if_nonfinite', optax_skip)
  if variant == 'plain_dropout_key':
    return c, mock.patch.object(row_keys, 'row_keyed', lambda keys: keys[0])
  if variant == 'no_auc':
    zeros = lambda *args: (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
    return c, mock.patch.object(objective_metrics, 'auc_pair_counts', zeros)
  if variant == 'no_dropout':
    c.dropout_rate = c.attention_dropout_rate = 0.0
  if variant == 'xla_attention':
    c.attention_implementation = 'xla'
  if variant == 'flat_optimizer':
    return c, _flat_patches()
  if variant == 'f32_scores':
    return c, mock.patch.object(model, 'attention_scores', _f32_scores)
  if variant == 'autodiff_softmax_backward':
    return c, mock.patch.object(model, 'softmax_dropout',
                                 model.autodiff_softmax_dropout)
  return c, contextlib.nullcontext()


def run(config, steps: int, warmup: int, rounds: int, variants=VARIANTS) -> dict:
  if steps < 1 or warmup < 0 or rounds < 1:
    raise UserError(f'--steps={steps} and --rounds={rounds} must be >= 1, --warmup={warmup} >= 0')
  known = VARIANTS + OPTIONAL_VARIANTS + GPU_VARIANTS
  unknown = [v for v in variants if v not in known]
  if unknown or 'as_trained' not in variants:
    raise UserError(f'--variants={",".join(variants)}: give as_trained and any of '
                    f'{", ".join(known[1:])}')
  c = config_lib.resolve(config)
  for variant in SCORE_VARIANTS:
    if variant in variants and not c.attention_dropout_rate:
      raise UserError(f'--variants={variant} needs --config.attention_dropout_rate > 0 (is 0): '
                      'without attention dropout the model writes no scores')
  if 'xla_attention' in variants:
    if c.attention_dropout_rate:
      raise UserError(f'--variants=xla_attention needs --config.attention_dropout_rate=0 (is '
                      f'{c.attention_dropout_rate}): with attention dropout the model '
                      'computes attention itself, in XLA')
    device = jax.devices()[0]
    if benchmark.attention_path(c, device) != 'cudnn':
      raise UserError(f'--variants=xla_attention compares with cuDNN\'s attention, which this '
                      f'step does not use ({device.device_kind}, dtype {c.dtype}): leave it out '
                      'here')
  variants = [v for v in known if v in variants]
  compiled, first_sums = {}, {}
  for variant in variants:
    c, patch = traced_as(variant, config)
    with patch:
      exp, host_batch = benchmark.build(c, 'synthetic')  # A fresh Experiment: a fresh trace.
      compiled[variant] = benchmark.JaxStep(exp, host_batch, warmup)
    step = compiled[variant]
    first_sums[variant] = jax.device_get(step.call(step.new_window()))  # After the warmup.
    print(f'{variant}: compiled in {compiled[variant].compile_s:.1f}s', flush=True)
  times = {v: [] for v in variants}
  steps = benchmark.whole_calls(steps, compiled['as_trained'].steps_per_call)
  for _ in range(rounds):
    for variant in variants:
      times[variant] += compiled[variant].run(steps)[0]
  ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
  c = compiled['as_trained'].config
  # XLA's temporary memory: what the step keeps between its forward and backward, among
  # others (a variant that writes fewer [batch, heads, seq, seq] arrays needs less).
  temp_mb = {v: _temp_mb(compiled[v].compiled) for v in variants}
  print(f'{"variant":>22}  {"step ms (median)":>16}  {"cost of the part ms":>19}  temp MB')
  for v in variants:
    cost = f'{ms["as_trained"] - ms[v]:.2f}' if v != 'as_trained' else '-'
    print(f'{v:>22}  {ms[v]:16.2f}  {cost:>19}  {temp_mb[v]}')
  device = jax.devices()[0]
  return {
      'step_ms': ms,
      'cost_ms': {v: ms['as_trained'] - ms[v] for v in variants if v != 'as_trained'},
      'auc_pairs_first_step': {v: float(s['auc_pairs']) for v, s in first_sums.items()},
      'first_loss_sums': {v: float(s['disc_loss_sum']) for v, s in first_sums.items()},
      'temp_mb': temp_mb,
      'device_kind': device.device_kind, 'platform': device.platform,
      'jax_version': jax.__version__, 'dtype': c.dtype, 'batch': c.train_batch_size,
      'seq': c.max_seq_length, 'dropout_rate': c.dropout_rate,
      'attention_dropout_rate': c.attention_dropout_rate, 'steps': steps, 'rounds': rounds,
      'warmup': warmup,
  }


def _temp_mb(compiled):
  try:
    return round(compiled.memory_analysis().temp_size_in_bytes / 1e6, 1)
  except Exception:  # pylint: disable=broad-except  # A backend without the analysis.
    return None


def main(argv):
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {argv[1:]}; flags look like --config.KEY=VALUE')
  cpu_devices.configure_for(FLAGS.config, FLAGS.cpu_devices)
  cli.print_result(run(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.rounds,
                       tuple(FLAGS.variants)))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_integer('steps', 30, 'Timed steps per variant per round.')
  flags.DEFINE_integer('warmup', 3, 'Untimed steps after compilation.')
  flags.DEFINE_integer('rounds', 3, 'Rounds over the variants.')
  flags.DEFINE_list('variants', list(VARIANTS), 'The variants to time (as_trained always).')
  cpu_devices.define_flag()
  flags.mark_flags_as_required(['config'])
  cli.run(main)
