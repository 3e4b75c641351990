"""From pretraining config files and one FLOPs budget to a step count per config.

Configs are loaded by the train command's parser (`path.py` or `path.py:arg`, overridden by
`key=value` strings as --config.key=value would be), FLOPs per step come from
`flops.model_flops_stages`, and every config gets the most steps whose FLOPs fit the budget, so
runs are matched on compute, not on steps. Keys counted in steps (two_stage's
two_stage_generator_steps) keep their share of the run (the objective's `steps_scaled`), and
every planned config is validated here, before anything trains.
"""
import dataclasses
import math
import os
import sys

import ml_collections

from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import flops
from electra_jax import objectives
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
  config: ml_collections.ConfigDict  # after overrides, with the planned keys set
  objective: str
  flops_stages: list        # flops.model_flops_stages of the planned run
  num_train_steps: int
  num_warmup_steps: int
  config_warmup_steps: int  # the config's own warmup, before the cap
  points: list              # steps of the budget points (checkpoints that get fine-tuned)
  scaled: dict              # other keys counted in steps, scaled to the run (two_stage's split)

  @property
  def total_flops(self) -> int:
    return flops.flops_to_step(self.flops_stages, self.num_train_steps)

  @property
  def flops_per_step(self) -> float:
    """The run's average (two_stage's stages differ)."""
    return self.total_flops / self.num_train_steps

  def flops_at(self, step: int) -> int:
    return flops.flops_to_step(self.flops_stages, step)

  def train_overrides(self, user_overrides: list[str]) -> list[str]:
    """--config.KEY=VALUE flags for the train command: the user's, then the planned keys."""
    planned = {**self.scaled, 'num_train_steps': self.num_train_steps,
               'num_warmup_steps': self.num_warmup_steps}
    return ([f'--config.{o}' for o in user_overrides]
            + [f'--config.{k}={v}' for k, v in planned.items()])


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


def budget_points(stages, num_train_steps: int, num_points: int) -> list[int]:
  """Steps of `num_points` checkpoints evenly spaced in FLOPs, the last at the end (for most
  objectives evenly spaced in steps too; not in two_stage, whose steps differ in cost)."""
  total = flops.flops_to_step(stages, num_train_steps)
  points = [flops.step_at_flops(stages, (k * total) // num_points)
            for k in range(1, num_points + 1)]
  # Steps of unequal cost can put two points on one step: each moves to a step of its own
  # (there are at least `num_points` steps), the last staying at the end.
  points[0] = max(points[0], 1)
  for k in range(1, num_points):
    points[k] = max(points[k], points[k - 1] + 1)
  points[-1] = num_train_steps
  for k in range(num_points - 2, -1, -1):
    points[k] = min(points[k], points[k + 1] - 1)
  return points


def _scaled_config(c, objective, steps: int) -> tuple[ml_collections.ConfigDict, dict]:
  """A copy of `c` for a run of `steps` steps, and the keys `steps_scaled` set in it."""
  scaled = objective.steps_scaled(c, steps)
  run = ml_collections.ConfigDict(c.to_dict())
  run.num_train_steps = steps
  run.update(scaled)
  return run, scaled


def run_flops(c, steps: int, parts: dict | None = None) -> float:
  """The model FLOPs of `c` run for `steps` steps, keys counted in steps scaled with them
  (`parts`: flops.forward_flops(c), where the caller has it: it resolves the config)."""
  objective = objectives.get(c.objective)
  run, _ = _scaled_config(c, objective, steps)
  parts = flops.forward_flops(c) if parts is None else parts
  return flops.flops_to_step(objective.flops_stages(run, parts), steps)


def steps_for_budget(c, flops_budget: float) -> int:
  """The most steps whose model FLOPs fit the budget, keys counted in steps scaled with them:
  a step count from the config's average FLOPs per step, then moved a step at a time while
  the scaled run's total says so (rounding the scaled keys moves it a few steps at most)."""
  parts = flops.forward_flops(c)
  total = lambda steps: run_flops(c, steps, parts)
  steps = flops.step_at_flops(
      [(0, total(c.num_train_steps) / c.num_train_steps)], flops_budget)
  while steps > 0 and total(steps) > flops_budget:
    steps -= 1
  while total(steps + 1) <= flops_budget:
    steps += 1
  return steps


def plan_config(spec: str, overrides: list[str], flops_budget: float,
                num_points: int) -> Plan:
  """Loads one config, applies the overrides, matches its step count to the budget and
  validates the planned run (config.resolve), so a bad plan fails before anything trains."""
  name = config_name(spec)
  c = load_config(spec, overrides)
  if c.init_from:
    # The plan counts the config's own sizes; init_from's would replace them.
    raise UserError(f"config {name} ({spec}) sets init_from='{c.init_from}': a comparison "
                    'pretrains every config from scratch on the same FLOPs; drop init_from')
  try:
    resolved = config_lib.resolve(c, training=True)
  except UserError as e:
    raise UserError(f'config {name} ({spec}): {e}') from None
  steps = steps_for_budget(resolved, flops_budget)
  per_step = flops.model_flops_per_step(resolved)
  if steps < num_points:
    need = 'one step' if num_points == 1 else f'{num_points} steps (--budget_points)'
    # Rounded up: the figure printed must itself be enough.
    needed = run_flops(resolved, num_points)
    unit = 10.0 ** (math.floor(math.log10(needed)) - 3)
    raise UserError(f'--flops_budget={flops_budget:.4g} is too small for config {name}: one '
                    f'step costs {per_step:.4g} FLOPs, and it needs at least {need}; raise '
                    f'the budget to at least {math.ceil(needed / unit) * unit:.4g}')
  config_warmup = c.num_warmup_steps
  run, scaled = _scaled_config(c, objectives.get(resolved.objective), steps)
  # A tenth of the run at most, and what its schedule holds (two_stage: its shorter stage), as
  # the run itself would cut it: the plan records the warmup the run trains with.
  warmup = min(c.num_warmup_steps, int(MAX_WARMUP_FRACTION * steps), config_lib.warmup_limit(run))
  run.num_warmup_steps = warmup
  try:
    stages = flops.model_flops_stages(run)
  except UserError as e:
    keys = ', '.join(f'{k}={v}' for k, v in scaled.items())
    raise UserError(f'config {name} ({spec}) planned for {steps} steps'
                    + (f' ({keys}, its share of the run)' if keys else '')
                    + f' at --flops_budget={flops_budget:.4g}: {e}') from None
  return Plan(name=name, spec=spec, config=run, objective=resolved.objective,
              flops_stages=stages, num_train_steps=steps, num_warmup_steps=warmup,
              config_warmup_steps=config_warmup, points=budget_points(stages, steps, num_points),
              scaled=scaled)


def plan_all(specs: list[str], overrides: list[str], flops_budget: float,
             num_points: int) -> list[Plan]:
  if not specs:
    raise UserError('--configs is empty; pass pretraining config files separated by commas')
  if not (math.isfinite(flops_budget) and flops_budget > 0):
    raise UserError(f'--flops_budget={flops_budget} must be a positive, finite number of FLOPs, '
                    'e.g. 1e15')
  if num_points < 1:
    raise UserError(f'--budget_points={num_points} must be at least 1')
  names = [config_name(s) for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise UserError(f'--configs names {duplicates[0]!r} twice (runs are named after the file); '
                    'pass each config once, or copy one under another name')
  return [plan_config(s, overrides, flops_budget, num_points) for s in specs]
