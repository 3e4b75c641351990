"""Test helper: the train step with chosen steps' loss made NaN, wrapped from outside.

The product has no hook for this inside its jitted step; tests wrap the objective instead.
`python -m tests.nan_steps 3,5 --config=... --workdir=...` is the train command with steps 3
and 5 (1-based, as logged) poisoned: their loss, hence every gradient, is NaN.
"""
import sys

import jax.numpy as jnp

from electra_jax import train
from electra_jax import train_state as ts


class NaNAtSteps:
  """`objective` (objectives.base.Objective) with a NaN loss at `steps`; otherwise the same."""

  def __init__(self, objective, steps):
    self._objective = objective
    self._steps = tuple(steps)

  def __getattr__(self, name):
    return getattr(self._objective, name)

  def at_step(self, step):
    inner = self._objective.at_step(step)
    bad = jnp.isin(step + 1, jnp.asarray(self._steps, jnp.int32))

    def objective(*args, **kwargs):
      loss, sums = inner(*args, **kwargs)
      # A product, not jnp.where: the gradients must be NaN too, as with a diverging run.
      return loss * jnp.where(bad, jnp.nan, 1.0).astype(loss.dtype), sums

    return objective


def main():
  steps = [int(s) for s in sys.argv.pop(1).split(',')]
  make_train_step = ts.make_train_step
  ts.make_train_step = lambda objective, *args, **kwargs: make_train_step(
      NaNAtSteps(objective, steps), *args, **kwargs)
  train.run()


if __name__ == '__main__':
  main()
