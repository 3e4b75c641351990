"""Compiles the training loop's first call on a thread while the set-up goes on.

Before its first step a run initialises (or restores) the state, which compiles a program of
its own (Small's initialisation: 16 s on a 2-core CPU, one threefry draw per array), and the
first call compiles the train step (31 s there; 1.5-2 minutes on a GPU with autotuning). The
two compiles are independent, so the train step's runs beside the set-up (XLA compiles without
the GIL) and jit's call then finds its executable (same function, shapes, shardings). The
batches come from the prefetcher's first item (peek), so the shapes are the loop's own.

Purely a head start: if anything here fails, the loop's own call compiles (and raises) as it
would have without it.
"""
import threading
import time

import jax

from electra_jax import parallel
from electra_jax import train_state as ts


class FirstCallCompile:
  """Starts compiling `train_steps` for the first item of `train_iter` on a thread.

  `state`: the restored state, or the abstract state where it is still to be initialised.
  """

  def __init__(self, train_steps, train_step, state, abstract_state, train_iter, mesh,
               base_rng):
    self.seconds = None  # From the first batch's wait to the compiled step; None if it failed.
    self.window_zeros = None  # The loop's zeroed metric sums (ts.window_zeros), once traced.
    self._thread = threading.Thread(
        target=self._compile, name='electra-compile-ahead', daemon=True,
        args=(train_steps, train_step, state, abstract_state, train_iter, mesh, base_rng))
    self._thread.start()

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

  def wait(self) -> None:
    """Returns once the compile has finished (or failed)."""
    self._thread.join()
