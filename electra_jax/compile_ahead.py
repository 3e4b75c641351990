"""Compiles the training loop's first call on a thread while the set-up goes on, and on an
accelerator the evaluation step while the first calls run.

Before its first step a run initialises (or restores) the state, which compiles a program of
its own (Small's initialisation: 16 s on a 2-core CPU, one threefry draw per array), and the
first call compiles the train step (31 s there; 1.5-2 minutes on a GPU with autotuning). The
two compiles are independent, so the train step's runs beside the set-up (XLA compiles without
the GIL) and jit's call then finds its executable (same function, shapes, shardings). The
batches come from the prefetcher's first item (peek), so the shapes are the loop's own.

The evaluation step compiled in the loop paused the first evaluation (13.8 s of Small's 324-s
run on an H200, benchmarks/RESULTS.md session 23). On a GPU or TPU the device runs the train
calls while the host's cores are mostly free, so it compiles beside them, for the eval set's
first batch; on a CPU the compile would take the cores the steps run on (and skew the first
windows' throughput), so the first evaluation compiles it there as before.

Purely a head start: if anything here fails, the loop's own call compiles (and raises) as it
would have without it.
"""
import threading
import time

import jax

from electra_jax import parallel
from electra_jax import train_state as ts


class _OnThread:
  """Runs the subclass's _compile(*args) on a daemon thread from construction on."""

  def _start(self, *args):
    self._thread = threading.Thread(target=self._compile, args=args, daemon=True,
                                    name=f'electra-{type(self).__name__}')
    self._thread.start()

  def wait(self) -> None:
    """Returns once the compile has finished (or failed)."""
    self._thread.join()


class FirstCallCompile(_OnThread):
  """Starts compiling `train_steps` for the first item of `train_iter` on a thread.

  `state`: the restored state, or the abstract state where it is still to be initialised.
  """

  def __init__(self, train_steps, train_step, state, abstract_state, train_iter, mesh,
               base_rng):
    self.seconds = None  # From the first batch's wait to the compiled step; None if it failed.
    self.window_zeros = None  # The loop's zeroed metric sums (ts.window_zeros), once traced.
    self._start(train_steps, train_step, state, abstract_state, train_iter, mesh, base_rng)

  def _compile(self, train_steps, train_step, state, abstract_state, train_iter, mesh,
               base_rng):
    start = time.time()
    try:
      batches = train_iter.peek()
      if batches is None:  # The data failed: the loop's next() raises it.
        return
      zeros = ts.window_zeros(train_step, abstract_state, batches, base_rng)
      rep = parallel.replicated(mesh)
      window = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep) for k, v in zeros.items()}
      train_steps.lower(state, window, batches, base_rng).compile()
      self.window_zeros = zeros
      self.seconds = time.time() - start
    except Exception:  # pylint: disable=broad-except  # The loop's call compiles and reports.
      pass


def compiles_eval_alongside(device) -> bool:
  """Whether FirstEvalCompile pays on `device`: not on a CPU (see the module's docstring)."""
  return device.platform != 'cpu'


class FirstEvalCompile(_OnThread):
  """Starts compiling `eval_step` for the first batch of `batches` (a zero-argument callable
  giving an iterator of the eval set's global batches, as the evaluation passes them) on a
  thread."""

  def __init__(self, eval_step, abstract_params, batches):
    self._start(eval_step, abstract_params, batches)

  def _compile(self, eval_step, abstract_params, batches):
    try:
      batch = next(batches(), None)
      if batch is not None:  # No eval data: the evaluation says so.
        eval_step.lower(abstract_params, batch, jax.random.key(0)).compile()
    except Exception:  # pylint: disable=broad-except  # The evaluation compiles and reports.
      pass
