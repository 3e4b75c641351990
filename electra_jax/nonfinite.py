"""Guards against non-finite losses and gradients.

optim.skip_if_nonfinite skips an update whose gradients hold NaN/inf and counts it in the
optimizer state (optax.ApplyIfFiniteState); this module reads those counts, keeps skipped steps
out of the logged averages and stops a run that keeps diverging.
"""
import jax
import jax.numpy as jnp
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

  Each step's count is read one step late, so the host never waits for the device just to
  check it; `check_now` reads the latest count (before a save or at the end).
  """

  def __init__(self, limit: int):
    self.limit = limit
    self._pending = None

  def push(self, step: int, count):
    self.check_now()
    self._pending = (step, count)

  def check_now(self):
    if self._pending is None:
      return
    step, count = self._pending
    self._pending = None
    count = int(count)
    if self.limit and count >= self.limit:
      raise UserError(
          f'{count} consecutive steps (up to step {step}) had a non-finite loss or gradients; '
          f'stopping at config.max_consecutive_nonfinite={self.limit}. Their updates were '
          'skipped and no NaN was saved: lower config.learning_rate or check the data, then '
          're-run to resume from the last checkpoint')
