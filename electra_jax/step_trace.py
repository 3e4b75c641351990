"""A jax.profiler trace of chosen steps of the training loop (`train --profile_dir`).

The benchmark traces the step alone on synthetic batches; this traces the real loop: the input
pipeline's thread, metric windows, checkpoint saves and the gaps between steps the device
waits through. It writes what `jax.profiler.trace` writes (an xplane for TensorBoard's profile
plugin or XProf, and a Perfetto JSON that `benchmarks/profile_top_ops.py` reads) under
DIR/plugins/profile/<time>/, and DIR/traced_steps.json, the number of steps it holds. Only
process 0 traces (one host's view; names would clash).
"""
import time

import jax

from electra_jax import atomic
from electra_jax import paths
from electra_jax.errors import UserError

# Without --profile_steps: the three steps after this process's first call, which compiles.
DEFAULT_SKIP, DEFAULT_STEPS = 1, 3
# Beside a profile directory's traces: {"steps": N}, the train steps its newest trace holds.
# benchmarks/profile_top_ops.py reads it for its per-step figures (a call of the compiled
# program runs config.steps_per_execution steps, so calls are not steps).
TRACED_STEPS_FILE = 'traced_steps.json'


def write_traced_steps(directory: str, steps: int):
  atomic.write_json(paths.join(directory, TRACED_STEPS_FILE), dict(steps=steps))


def parse_steps(text: str) -> tuple[int, int] | None:
  """'A:B' -> (A, B), the first and last step traced (as metrics.jsonl numbers them)."""
  if not text:
    return None
  try:
    first, last = (int(part) for part in text.split(':'))
  except ValueError:
    first = last = 0
  if not 1 <= first <= last:
    raise UserError(f'--profile_steps={text} must be FIRST:LAST with 1 <= FIRST <= LAST, '
                    'e.g. --profile_steps=100:105')
  return first, last


def checked_directory(directory: str) -> str:
  """--profile_dir proved a writable local directory now (made if need be): a trace that
  cannot be written must not end a long run, or a benchmark, after its work is done."""
  if paths.is_remote(directory):
    raise UserError(f'--profile_dir={directory} must be a local directory (jax.profiler '
                    'writes local files); copy the trace to the bucket afterwards')
  return paths.check_writable_dir(directory, '--profile_dir')


class StepTrace:
  """Starts the trace before step `first` runs and stops it once step `last` has finished."""

  def __init__(self, directory: str | None, steps: tuple[int, int] | None):
    """Checks the flags before anything runs; `plan` picks the steps once the start is known."""
    if steps and not directory:
      raise UserError('--profile_steps needs --profile_dir=DIR (a local directory)')
    self.directory = checked_directory(directory) if directory else None
    self.steps, self.active, self.first, self.last = steps, False, None, None
    self.seconds = 0.0  # Spent starting and writing traces: the loop leaves it out of throughput.

  def plan(self, first_step: int, num_train_steps: int, enabled: bool = True,
           first_call_steps: int = 1) -> str | None:
    """`first_step`: the step the loop starts from (it runs first_step + 1 on); `enabled`:
    false on processes other than 0; `first_call_steps`: the steps of the loop's first call.
    Returns a note when no step of the run is traced.

    The loop runs steps in calls (config.steps_per_execution; prefetch.call_size): a trace
    holds whole calls, from the one that runs step `first` to the one that runs `last`; the
    default steps then follow the first call (which compiles)."""
    if not (self.directory and enabled):
      self.directory = None
      return None
    steps = self.steps
    if steps is None:
      start = first_step + first_call_steps + DEFAULT_SKIP
      steps = (start, start + DEFAULT_STEPS - 1)
    self.first, self.last = max(steps[0], first_step + 1), min(steps[1], num_train_steps)
    if self.first > self.last:
      self.directory = None
      return (f'--profile_steps={steps[0]}:{steps[1]}: no step of this run (steps '
              f'{first_step + 1} to {num_train_steps}) is in that range; nothing traced')
    return None

  def before(self, first: int, last: int):
    """Steps `first` to `last` are about to run (one call)."""
    if self.directory and not self.active and first <= self.first <= last:
      self.first = first  # The trace holds the whole call.
      start = time.time()
      jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
      self.active = True
      self.seconds += time.time() - start

  def after(self, step: int, outputs) -> str | None:
    """`step`: the step that just ran; `outputs` its results. Returns a line to print when
    the trace is written."""
    if self.active and step >= self.last:
      jax.block_until_ready(outputs)
      return self.close(step)
    return None

  def close(self, step: int) -> str | None:
    """Writes the trace; `step`: the last step run (a run that stops early keeps its steps)."""
    if not self.active:
      return None
    start = time.time()
    jax.profiler.stop_trace()
    write_traced_steps(self.directory, step - self.first + 1)
    self.active = False
    self.seconds += time.time() - start
    return f'profile of steps {self.first} to {step} written to {self.directory}'
