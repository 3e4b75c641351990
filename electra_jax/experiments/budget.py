"""From pretraining config files and one FLOPs budget to a step count per config.

Configs are loaded by the train command's parser (`path.py` or `path.py:arg`, overridden by
`key=value` strings as --config.key=value would be), FLOPs per step come from
`flops.model_flops_per_step`, and every config gets floor(budget / FLOPs per step) steps, so
runs are matched on compute, not on steps.
"""
import dataclasses
import math
import os
import sys

import ml_collections

from electra_jax import cli
from electra_jax import flops
from electra_jax.errors import UserError

# Keys the comparison sets itself, with what sets them.
MANAGED_KEYS = {'num_train_steps': '--flops_budget'}
# Warmup is capped at this fraction of each run's steps (short budgets would otherwise spend
# most or all of their steps warming up).
MAX_WARMUP_FRACTION = 0.1


@dataclasses.dataclass
class Plan:
  """One config's share of the comparison."""
  name: str                 # short name: file name without .py (plus _arg for path.py:arg)
  spec: str                 # what --config= gets: the path as given (plus :arg)
  config: ml_collections.ConfigDict  # after overrides, with num_train_steps / warmup set
  objective: str
  flops_per_step: float
  num_train_steps: int
  num_warmup_steps: int
  config_warmup_steps: int  # the config's own warmup, before the cap
  points: list              # steps of the budget points (checkpoints that get fine-tuned)

  @property
  def total_flops(self) -> float:
    return self.flops_per_step * self.num_train_steps

  def train_overrides(self, user_overrides: list[str]) -> list[str]:
    """--config.KEY=VALUE flags for the train command: the user's, then the managed keys."""
    return ([f'--config.{o}' for o in user_overrides]
            + [f'--config.num_train_steps={self.num_train_steps}',
               f'--config.num_warmup_steps={self.num_warmup_steps}'])


def config_name(spec: str) -> str:
  path, _, arg = spec.partition(':')
  name = os.path.splitext(os.path.basename(path))[0]
  return f'{name}_{arg}' if arg else name


def load_config(spec: str, overrides: list[str], flag: str = '--override',
                managed: dict | None = None, file_flag: str = '--configs',
                keys_file: str = 'configs/base_config.py') -> ml_collections.ConfigDict:
  """get_config() of a config file with 'KEY=VALUE' overrides, parsed as the train command
  parses --config= and --config.KEY=VALUE (cli.load_config); a mistake is a UserError naming
  the flag it came from: `file_flag` for the file, `flag`=override for an override.

  managed: keys the caller sets itself -> the flag that sets them (an override is an error).
  keys_file: where the valid keys are listed (for the unknown-key message).
  """
  managed = MANAGED_KEYS if managed is None else managed
  for override in overrides:
    key, sep, _ = override.partition('=')
    if not sep or not key:
      raise UserError(f'{flag}={override!r} is not KEY=VALUE; e.g. {flag}=train_batch_size=8')
    if key in managed:
      raise UserError(f'{flag}={override!r}: {key} is set by {managed[key]}; drop it')
  if os.getcwd() not in sys.path:  # Config files import `configs.base_config`.
    sys.path.insert(0, os.getcwd())
  try:
    return cli.load_config(spec, overrides, keys_file)
  except UserError as error:
    # Which argument is wrong: the file alone, else the first override that fails alone.
    try:
      cli.load_config(spec, keys_file=keys_file)
    except UserError as e:
      raise UserError(f'{file_flag}: {e}') from None
    for override in overrides:
      try:
        cli.load_config(spec, [override], keys_file)
      except UserError as e:
        raise UserError(f'{flag}={override!r}: {e}') from None
    raise UserError(f'{flag}: {error}') from None


def budget_points(num_train_steps: int, num_points: int) -> list[int]:
  """Steps of `num_points` checkpoints evenly spaced in FLOPs (= in steps), the last at the end."""
  return [(k * num_train_steps) // num_points for k in range(1, num_points + 1)]


def steps_for_budget(flops_budget: float, flops_per_step: float) -> int:
  return int(math.floor(flops_budget / flops_per_step))


def plan_config(spec: str, overrides: list[str], flops_budget: float,
                num_points: int) -> Plan:
  """Loads one config, applies the overrides and matches its step count to the budget."""
  name = config_name(spec)
  c = load_config(spec, overrides)
  try:
    per_step = flops.model_flops_per_step(c)
  except UserError as e:
    raise UserError(f'config {name} ({spec}): {e}') from None
  steps = steps_for_budget(flops_budget, per_step)
  if steps < num_points:
    need = 'one step' if num_points == 1 else f'{num_points} steps (--budget_points)'
    raise UserError(f'--flops_budget={flops_budget:.4g} is too small for config {name}: one '
                    f'step costs {per_step:.4g} FLOPs, and it needs at least {need}; raise '
                    f'the budget to at least {per_step * num_points:.4g}')
  warmup = min(c.num_warmup_steps, int(MAX_WARMUP_FRACTION * steps))
  config_warmup = c.num_warmup_steps
  c.num_train_steps, c.num_warmup_steps = steps, warmup
  return Plan(name=name, spec=spec, config=c, objective=str(c.get('objective', 'electra')),
              flops_per_step=per_step, num_train_steps=steps, num_warmup_steps=warmup,
              config_warmup_steps=config_warmup, points=budget_points(steps, num_points))


def plan_all(specs: list[str], overrides: list[str], flops_budget: float,
             num_points: int) -> list[Plan]:
  if not specs:
    raise UserError('--configs is empty; pass pretraining config files separated by commas')
  if not flops_budget > 0:
    raise UserError(f'--flops_budget={flops_budget} must be a positive number of FLOPs, e.g. 1e15')
  if num_points < 1:
    raise UserError(f'--budget_points={num_points} must be at least 1')
  names = [config_name(s) for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise UserError(f'--configs names {duplicates[0]!r} twice (runs are named after the file); '
                    'pass each config once, or copy one under another name')
  return [plan_config(s, overrides, flops_budget, num_points) for s in specs]
