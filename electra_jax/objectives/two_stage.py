"""Two-stage training (paper section 3.2): steps < n train the generator's MLM alone; at step n
the discriminator (embeddings and encoder) starts from the generator's weights and trains on
disc_weight * RTD with the generator frozen. Each stage has its own AdamW and schedule."""
import jax
import jax.numpy as jnp
import optax

from electra_jax.errors import UserError
from electra_jax.objectives import base
from electra_jax.objectives import electra


class TwoStage(electra.Electra):
  name = 'two_stage'

  @classmethod
  def validate(cls, c):
    n = c.two_stage_generator_steps
    checks = (
        (c.generator_hidden_size == 1.0 and c.generator_layers == 1.0,
         f'config.generator_hidden_size={c.generator_hidden_size} and config.generator_layers='
         f"{c.generator_layers} must be 1.0 for objective 'two_stage' (the discriminator starts "
         "from the generator's weights)"),
        (not c.uniform_generator, "config.uniform_generator=True has no generator for "
         "objective 'two_stage' to train"),
        (c.tie == 'none',
         f"config.tie={c.tie!r} must be 'none' for objective 'two_stage' (a frozen "
         'generator cannot share weights with the discriminator being trained)'),
        (0 < n < c.num_train_steps,
         f'config.two_stage_generator_steps={n} must be in (0, config.num_train_steps='
         f'{c.num_train_steps}); it is when the discriminator starts training'),
        (c.num_warmup_steps <= min(n, c.num_train_steps - n),
         f'config.num_warmup_steps={c.num_warmup_steps} exceeds a two_stage stage ({n} and '
         f'{c.num_train_steps - n} steps); each stage warms up anew, lower the warmup'))
    for ok, message in checks:
      if not ok:
        raise UserError(message)

  @classmethod
  def warmup_limit(cls, c) -> int:
    n, total = c.two_stage_generator_steps, c.num_train_steps
    return min(n, total - n) if 0 < n < total else total

  @classmethod
  def optimizer(cls, c, adamw):
    """Two AdamWs, each with its own schedule over its stage and its own count: the generator's
    for steps [0, n), the discriminator's for [n, num_train_steps); each group is frozen
    outside its stage (`active_during`)."""
    n, total = c.two_stage_generator_steps, c.num_train_steps
    gen_tx, gen_schedule = adamw(c, n)
    disc_tx, disc_schedule = adamw(c, total - n)
    tx = optax.multi_transform(
        {'generator': active_during(gen_tx, 0, n),
         'discriminator': active_during(disc_tx, n, None)},
        _groups)
    schedule = lambda step: jnp.where(step < n, gen_schedule(step), disc_schedule(step - n))
    return tx, schedule

  @classmethod
  def flops_stages(cls, c, forward_parts):
    """Stage 1 trains G alone (3 x its forward) for n steps; stage 2 runs the frozen G forward
    only (its samples feed D) and trains D (1 x G + 3 x D). (The implementation also runs D's
    forward in stage 1 and G's backward in stage 2, with zero weight, for uniform metrics;
    that is not counted.)"""
    gen = sum(v for k, v in forward_parts.items() if k.startswith('generator_'))
    disc = sum(v for k, v in forward_parts.items() if k.startswith('discriminator_'))
    return [(0, 3 * gen), (c.two_stage_generator_steps, gen + 3 * disc)]

  @classmethod
  def steps_scaled(cls, c, num_train_steps):
    """The generator's stage keeps its share of the run (at least one step in each stage where
    the run has two)."""
    n = round(c.two_stage_generator_steps * num_train_steps / c.num_train_steps)
    return {'two_stage_generator_steps': max(1, min(n, num_train_steps - 1))}

  def prepare_params(self, params, step):
    """At step n the discriminator (embeddings and encoder) becomes a copy of the generator.
    Done inside the jitted step, so a run resumed from any checkpoint makes the same copy at
    the same step."""
    switch = jnp.asarray(step) == self.two_stage_generator_steps
    take = lambda d, g: jnp.where(switch, g, d)
    copied = dict(params)
    copied['embeddings'] = jax.tree.map(take, params['embeddings'],
                                        params['generator_embeddings'])
    copied['discriminator'] = dict(params['discriminator'], encoder=jax.tree.map(
        take, params['discriminator']['encoder'], params['generator']['encoder']))
    return copied

  def combine(self, gen_term, disc_term):
    if self.step is None:  # Evaluation: the ELECTRA loss.
      return gen_term + disc_term
    in_stage_1 = jnp.asarray(self.step) < self.two_stage_generator_steps
    return jnp.where(in_stage_1, gen_term, disc_term)


def _groups(params) -> dict:
  """'generator' for the generator's parameters (and its own embeddings), else 'discriminator'."""
  return {k: jax.tree.map(lambda _, k=k: 'generator' if base.is_generator(k)
                          else 'discriminator', v) for k, v in params.items()}


def active_during(inner: optax.GradientTransformation, start: int,
                  end: int | None) -> optax.GradientTransformationExtraArgs:
  """`inner` at optimizer steps start <= step < end (extra argument `step`, passed on as the
  stage's own step - start); at other steps its updates are 0 and its state (moments, count)
  does not move: the parameters are frozen."""
  inner = optax.with_extra_args_support(inner)

  def update(updates, state, params=None, *, step, **extra_args):
    active = step >= start if end is None else (step >= start) & (step < end)
    new_updates, new_state = inner.update(updates, state, params, step=step - start,
                                          **extra_args)
    new_updates = jax.tree.map(lambda u: jnp.where(active, u, jnp.zeros_like(u)), new_updates)
    new_state = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_state, state)
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(inner.init, update)
