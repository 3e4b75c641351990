"""SIGTERM / Ctrl-C as a request to stop: the loop finishes its current step (pretraining: its
call of config.steps_per_execution steps), saves and exits 0 (a spot VM's notice, a scheduler's
preemption), so the same command resumes where it stopped. With several processes both go to
JAX's preemption service, which stops every process at the same step."""
import os
import signal
import sys
import threading
import time

import jax

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Seconds after the first Ctrl-C before another one quits at once.
SECOND_CTRL_C_AFTER = 1.0


class StopRequest:
  """`signal` is None until SIGTERM or SIGINT arrives, then its number. `unit`: what the loop
  finishes first, as the notice names it."""

  def __init__(self, unit: str = 'step'):
    self.unit = unit
    self.signal = None
    self._previous = {}
    self._first_sigint_at = 0.0
    self._noticed = False
    # Several processes: Ctrl-C becomes the SIGTERM of JAX's preemption service (a stop here
    # alone would leave the others in the next collective); `signal` stays None.
    self._to_preemption_service = False

  def __call__(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self._first_sigint_at:
      # Ctrl-C twice: now, not after the call (a first compile of Large takes minutes); the
      # newest checkpoint stands and the same command resumes from it. Not a SIGINT right
      # after the first: a terminal's Ctrl-C that a wrapper (compare) forwards arrives twice.
      if time.monotonic() - self._first_sigint_at > SECOND_CTRL_C_AFTER:
        raise KeyboardInterrupt
      return
    if signum == signal.SIGINT:
      self._first_sigint_at = time.monotonic()
    if not self._noticed:
      self._noticed = True
      who = 'every process stops' if self._to_preemption_service else 'stopping'
      print(f'{signal.Signals(signum).name}: {who} after the current {self.unit}, then saving'
            + ('; Ctrl-C again to quit at once' if signum == signal.SIGINT else ''),
            file=sys.stderr, flush=True)
    if self._to_preemption_service:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self.signal = signum

  def install(self) -> 'StopRequest':
    # With several processes, SIGTERM belongs to JAX's preemption service, which tells every
    # host to stop at the same step (ckpt.reached_preemption); a handler here would replace it.
    # Handlers can only be set from the main thread (a library caller may not be on it).
    if threading.current_thread() is not threading.main_thread():
      return self
    if jax.process_count() == 1:
      signals = SIGNALS
    else:
      from electra_jax import distributed  # pylint: disable=import-outside-toplevel
      self._to_preemption_service = distributed.preemption_service_running()
      signals = (signal.SIGINT,) if self._to_preemption_service else ()
    for sig in signals:
      self._previous[sig] = signal.signal(sig, self)
    return self

  def restore(self):
    """Puts back the handlers install() replaced (an in-process caller keeps its own)."""
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
