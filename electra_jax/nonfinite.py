"""Guards against non-finite losses and gradients.

optim.skip_if_nonfinite skips an update whose gradients hold NaN/inf and counts it in the
optimizer state (optax.ApplyIfFiniteState); this module reads those counts, keeps skipped steps
out of the logged averages and stops a run that keeps diverging.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax.errors import UserError


def _count(opt_state, name: str) -> jax.Array:
  """A counter of the skip's state; 0 for an optimizer without that wrapper (e.g.
  fine-tuning's), which never skips."""
  count = optax.tree_utils.tree_get(opt_state, name)
  return jnp.zeros((), jnp.int32) if count is None else count


def consecutive_skipped(opt_state) -> jax.Array:
  """Updates skipped in a row up to now (0 after a finite step)."""
  return _count(opt_state, 'notfinite_count')


def total_skipped(opt_state) -> jax.Array:
  """Updates skipped since training started (kept in checkpoints with the optimizer state)."""
  return _count(opt_state, 'total_notfinite')


def drop_skipped(sums: dict, opt_state) -> dict:
  """Zeroes a skipped step's metric sums (num_steps included) so averages cover finite steps."""
  skipped = consecutive_skipped(opt_state) > 0
  return jax.tree.map(lambda x: jnp.where(skipped, jnp.zeros_like(x), x), sums)


class ConsecutiveLimit:
  """Stops training after `limit` skipped steps in a row (0: never).

  Each call's counts are read one call late, so the host never waits for the device just to
  check them; `check_now` reads the latest (before a save or at the end).
  """

  def __init__(self, limit: int):
    self.limit = limit
    self._pending = None

  def push(self, steps: range, counts):
    """`counts`: each of `steps`' run of skips (make_train_steps' consecutive_nonfinite)."""
    self.check_now()
    self._pending = (steps, counts)

  def check_now(self):
    if self._pending is None:
      return
    steps, counts = self._pending
    self._pending = None
    if not self.limit:
      return
    # The first step at the limit, as one step a call names it, not the call's last step
    # (the steps after it may be finite).
    counts = np.asarray(jax.device_get(counts))
    over = np.flatnonzero(counts >= self.limit)
    if over.size:
      count, step = int(counts[over[0]]), steps[over[0]]
      raise UserError(
          f'{count} consecutive steps (up to step {step}) had a non-finite loss or gradients; '
          f'stopping at config.max_consecutive_nonfinite={self.limit}. Their updates were '
          'skipped and no NaN was saved: lower config.learning_rate or check the data, then '
          're-run to resume from the last checkpoint')
