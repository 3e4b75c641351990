"""Optimizer: global-norm clipping then AdamW with warmup + linear decay, all optax.

The whole chain sits inside skip_if_nonfinite (optax.apply_if_finite's contract and state): a
step whose gradients hold NaN/inf leaves parameters and optimizer state unchanged and is counted
(see nonfinite.py).
"""
import jax
import jax.numpy as jnp
import optax

from electra_jax import objectives
from electra_jax.objectives import base as objective_base

# Parameters named like this are LayerNorm scales/offsets or biases: never weight-decayed. The
# relative attention table (relative_position_bias) is decayed, as the position embeddings are:
# a learned table by position, not an offset (the demo's figures were measured so).
NO_DECAY_NAMES = ('bias', 'scale', 'output_bias')


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int,
                           decay_power: float = 1.0,
                           warmup_times_decay: bool = False) -> optax.Schedule:
  """Linear warmup over warmup_steps, and the decay peak * (1 - step / total_steps) ** power.

  warmup_times_decay: the official release's product peak * decay(step) * min(1, step / warmup)
  (the decay runs during warmup); else warm up to the full peak, then decay.
  """
  if decay_power != 1.0 or warmup_times_decay:
    return _power_schedule(peak, warmup_steps, total_steps, decay_power, warmup_times_decay)
  # The linear default as optax schedules (its numbers unchanged since the first release).
  if warmup_steps == 0:
    return optax.linear_schedule(peak, 0.0, total_steps)
  after_warmup = peak * (1.0 - warmup_steps / total_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup_steps),
       optax.linear_schedule(after_warmup, 0.0, max(total_steps - warmup_steps, 1))],
      [warmup_steps])


def _power_schedule(peak, warmup_steps, total_steps, power, warmup_times_decay):
  def schedule(step):
    t = jnp.asarray(step, jnp.float32)
    decay = peak * (1.0 - jnp.minimum(t, total_steps) / total_steps) ** power
    if warmup_steps == 0:
      return decay
    warm = jnp.minimum(1.0, t / warmup_steps)
    return decay * warm if warmup_times_decay else jnp.where(t < warmup_steps, peak * warm, decay)
  return schedule


def weight_decay_mask(params):
  """True for every parameter that gets weight decay (embeddings included)."""
  def decays(path, _):
    return getattr(path[-1], 'key', None) not in NO_DECAY_NAMES
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(c) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The pretraining optimizer and its learning-rate schedule (a function of the step).

  The objective's `optimizer` hook builds the AdamW part from `adamw` (two_stage runs two, each
  over its stage); its update takes the optimizer step as the extra argument `step`
  (train_state passes it).
  """
  adamw_tx, schedule = objectives.get(c.objective).optimizer(c, adamw)
  tx = adamw_tx
  adds = chain_steps(c)
  if adds['generator_lr_multiplier']:
    tx = optax.chain(adamw_tx, scale_generator_updates(c.generator_lr_multiplier))
  if adds['max_grad_norm']:
    tx = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), tx)
  return skip_if_nonfinite(tx), schedule


# The optimizer's optional steps: (the key that adds one, whether a value does, the values
# that do, those that do not). They shape its state: a resumed run keeps them (values may change).
CHAIN_STEPS = (('generator_lr_multiplier', lambda v: v != 1.0, '!= 1.0', '1.0'),
               ('max_grad_norm', lambda v: v > 0, '> 0', '0'))


def chain_steps(c) -> dict[str, bool]:
  """Which of CHAIN_STEPS config `c` adds, by key."""
  return {key: adds(c[key]) for key, adds, _, _ in CHAIN_STEPS}


def skip_if_nonfinite(
    inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """optax.apply_if_finite (never giving up) with the gradients' global norm as its check.

  apply_if_finite reduces every gradient array once more for its isfinite test; a NaN/inf
  anywhere already makes the global norm non-finite, and the per-array sums of squares behind
  it are the ones clipping and the logged grad_norm take (XLA computes them once): some 1,200
  fewer ops in the compiled Small step (benchmarks/RESULTS.md, session 13). Same state, so
  checkpoints and nonfinite.py read it alike, and the same lax.cond around the update, which
  keeps the optimizer state updated in place (a select in its stead made XLA copy moments).
  A norm that overflows float32 (above 1.8e19) also counts as non-finite. A non-finite update
  is never applied: the loop stops first at config.max_consecutive_nonfinite.
  """
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return optax.ApplyIfFiniteState(
        notfinite_count=jnp.zeros([], jnp.int32), last_finite=jnp.array(True, jnp.bool_),
        total_notfinite=jnp.zeros([], jnp.int32), inner_state=inner.init(params))

  def update(updates, state, params=None, **extra_args):
    finite = jnp.isfinite(optax.tree.norm(updates))
    new_updates, inner_state = jax.lax.cond(
        finite, lambda: inner.update(updates, state.inner_state, params, **extra_args),
        lambda: (jax.tree.map(jnp.zeros_like, updates), state.inner_state))
    return new_updates, optax.ApplyIfFiniteState(
        notfinite_count=jnp.where(finite, 0, optax.safe_increment(state.notfinite_count)),
        last_finite=finite,
        total_notfinite=jnp.where(finite, state.total_notfinite,
                                  optax.safe_increment(state.total_notfinite)),
        inner_state=inner_state)

  return optax.GradientTransformationExtraArgs(init, update)


def adamw(c, num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """One AdamW per config whose schedule (warmup, then decay to 0) spans `num_steps` steps."""
  schedule = learning_rate_schedule(c.learning_rate, c.num_warmup_steps, num_steps,
                                    c.lr_decay_power, c.warmup_times_decay)
  return _adamw(c, schedule), schedule


def _adamw(c, schedule):
  """optax.adamw's chain, with Adam's bias correction per config.adam_bias_correction."""
  return optax.chain(
      scale_by_adam(c.adam_b1, c.adam_b2, c.adam_epsilon, c.adam_bias_correction),
      optax.add_decayed_weights(c.weight_decay_rate, weight_decay_mask),
      scale_by_learning_rate(schedule))


def scale_by_learning_rate(schedule) -> optax.GradientTransformationExtraArgs:
  """optax.scale_by_learning_rate(schedule) at the run's step when the update is given it
  (extra argument `step`; pretraining's train_state does), else at its own count. A skipped
  non-finite step leaves the count behind (skip_if_nonfinite keeps the whole state), so
  counting would shift warmup and decay by every skip and end the run above 0. Same state
  (optax.ScaleByScheduleState), so checkpoints restore as before."""
  counted = optax.scale_by_learning_rate(schedule)

  def update(updates, state, params=None, *, step=None, **extra_args):
    del extra_args
    if step is None:
      return counted.update(updates, state, params)
    step_size = -schedule(step)
    updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(counted.init, update)


def scale_by_adam(b1: float, b2: float, eps: float,
                  bias_correction: bool = True) -> optax.GradientTransformation:
  """Adam's direction m / (sqrt(v) + eps); without bias correction as the official ELECTRA
  (and BERT) AdamWeightDecayOptimizer computes it, from the raw moments.

  Without it the first steps are larger than bias-corrected Adam's (for a steady gradient about
  6x at step 10, 3x at step 100, 1.3x at step 1,000 with b1 0.9 and b2 0.999), and eps weighs
  more while v is still small. Same state (optax.ScaleByAdamState) either way, so a checkpoint
  restores under both settings.
  """
  if bias_correction:
    return optax.scale_by_adam(b1, b2, eps)

  def init(params):
    return optax.scale_by_adam(b1, b2, eps).init(params)

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    direction = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    count = optax.safe_increment(state.count)
    return direction, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def scale_generator_updates(factor: float) -> optax.GradientTransformation:
  """Multiplies the generator's updates by `factor`: its learning rate is lr * factor
  (config.generator_lr_multiplier; weight decay included, as AdamW scales it by lr too)."""
  return optax.stateless(lambda updates, params=None: {
      k: jax.tree.map(lambda u: u * factor, v) if objective_base.is_generator(k) else v
      for k, v in updates.items()})


def _path_keys(path) -> list:
  return [getattr(p, 'key', None) for p in path]


def layerwise_lr_multipliers(params, decay: float, num_layers: int, official: bool = False):
  """Fine-tuning learning-rate factor per parameter (layer-wise LR decay, ELECTRA §fine-tuning).

  The task head gets 1, encoder layer i (0 = bottom) decay^(num_layers - i), so the top layer
  gets decay^1, and the embeddings (with their E->H projection) decay^(num_layers + 1).
  `official`: the official release's _get_layer_lrs, decay^(num_layers + 2 - depth) with depth
  0 for the embeddings and i + 1 for layer i: every exponent one higher (top layer decay^2, a
  known bug there, but the paper's GLUE numbers used it).
  """
  shift = 1 if official else 0

  def multiplier(path, _):
    keys = [k for k in _path_keys(path) if isinstance(k, str)]
    for key in keys:
      if key.startswith('layer_') and key[len('layer_'):].isdigit():
        return decay ** (num_layers - int(key[len('layer_'):]) + shift)
    if 'embeddings' in keys or 'embeddings_project' in keys:
      return decay ** (num_layers + 1 + shift)
    return 1.0
  return jax.tree_util.tree_map_with_path(multiplier, params)


def scale_by_multipliers(multipliers) -> optax.GradientTransformation:
  """Multiplies each parameter's update by its (constant) factor: a per-parameter LR scale."""
  return optax.stateless(
      lambda updates, params=None: jax.tree.map(lambda u, m: u * m, updates, multipliers))


def make_finetune_optimizer(c, params, num_layers: int, total_steps: int,
                            warmup_steps: int) -> tuple[optax.GradientTransformation,
                                                        optax.Schedule]:
  """Clipping, AdamW on the warmup + linear-decay schedule, then layer-wise LR decay.

  Scaling AdamW's whole update (step and decoupled weight decay) by a parameter's factor is
  the same as giving that parameter the learning rate lr * factor.
  """
  schedule = learning_rate_schedule(c.learning_rate, warmup_steps, total_steps,
                                    c.lr_decay_power, c.warmup_times_decay)
  parts = []
  if c.max_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(c.max_grad_norm))
  parts.append(_adamw(c, schedule))
  if c.layerwise_lr_decay != 1.0:
    parts.append(scale_by_multipliers(layerwise_lr_multipliers(
        params, c.layerwise_lr_decay, num_layers, c.official_layerwise_decay)))
  return optax.chain(*parts), schedule
