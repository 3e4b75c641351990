"""Builds the next global batches on a background thread while the current step runs.

The host work per step (reading this host's rows, decoding, and placing them on the devices
as one global jax.Array) overlaps the step instead of preceding it. The batches made ahead
are not a position: a checkpoint stores the examples the loop consumed (train.py), and a
restored run builds its iterator from there.
"""
import queue
import threading
import weakref
from typing import Any, Callable, Iterator

import numpy as np

_POLL_SECONDS = 0.1  # How often a blocked producer checks whether it should stop.


def _close(iterator) -> None:
  """Closes an iterator that can be closed (e.g. a data loader's), else nothing."""
  close = getattr(iterator, 'close', None)
  if close is not None:
    close()


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
  while not stop.is_set():
    try:
      q.put(item, timeout=_POLL_SECONDS)
      return True
    except queue.Full:
      pass
  return False


def _produce(parent, transform, q: queue.Queue, stop: threading.Event):
  """Producer thread: transformed batches, then the exception that ended it."""
  try:
    while not stop.is_set():
      if not _put(q, (transform(next(parent)), None), stop):
        return
  except BaseException as e:  # pylint: disable=broad-except  # StopIteration included.
    _put(q, (None, e), stop)


class DevicePrefetcher:
  """Wraps an iterator: yields `transform(batch)` made up to `buffer_size` steps ahead."""

  def __init__(self, parent: Iterator, transform: Callable[[Any], Any], buffer_size: int = 2):
    self._parent = parent
    self._transform, self._buffer_size = transform, buffer_size
    self._thread = self._stop = self._queue = None
    self._peeked = None  # (batch, error) taken by peek(), the next __next__'s item.

  def start_prefetch(self) -> None:
    if self._thread is None:
      self._stop = threading.Event()
      self._queue = queue.Queue(self._buffer_size)
      self._thread = threading.Thread(
          target=_produce, args=(self._parent, self._transform, self._queue, self._stop),
          name='electra-data-prefetch', daemon=True)
      self._thread.start()
      # A dropped prefetcher (e.g. after train_and_evaluate returns) stops its thread.
      self._finalizer = weakref.finalize(self, self._stop.set)

  def _stop_thread(self):
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = self._stop = self._queue = None

  def __iter__(self):
    return self

  def __next__(self):
    batch, error = self._take()
    self._peeked = None
    if error is not None:
      raise error
    return batch

  def peek(self):
    """The item the next __next__ returns (or None where it raises), without consuming it:
    for compiling the first train call from its batches while the state initialises."""
    return self._take()[0]

  def _take(self):
    if self._peeked is None:
      self.start_prefetch()
      self._peeked = self._queue.get()
      if self._peeked[1] is not None:
        self._stop_thread()
    return self._peeked

  def close(self) -> None:
    self._stop_thread()
    _close(self._parent)


def call_size(step: int, steps_per_execution: int, boundaries=(),
              stop_at: int | None = None) -> int:
  """Steps of the train call that runs after `step`: up to the next multiple of
  steps_per_execution, or of a boundary (a positive interval the loop acts at: log, eval, save,
  the last step) if one comes first, and never past `stop_at` (--stop_after_steps' step)."""
  size = min(b - step % b for b in (steps_per_execution, *boundaries) if b > 0)
  return size if stop_at is None or step >= stop_at else min(size, stop_at - step)


class StepChunks:
  """The batches of the steps one train call runs (config.steps_per_execution = k), stacked on
  a new leading axis: k at a time, each call ending at the next multiple of k or of a boundary
  (call_size), so the loop logs, evaluates and saves after the very step it names, and a run
  resumed between multiples (e.g. saved with another k) comes back onto them."""

  def __init__(self, parent: Iterator, first_step: int, steps_per_execution: int,
               boundaries=(), stop_at: int | None = None):
    self._parent, self._step, self._k = parent, first_step, steps_per_execution
    self._boundaries, self._stop_at = tuple(boundaries), stop_at

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    size = call_size(self._step, self._k, self._boundaries, self._stop_at)
    batches = [next(self._parent) for _ in range(size)]
    self._step += size
    return {key: np.stack([b[key] for b in batches]) for key in batches[0]}

  def close(self) -> None:
    _close(self._parent)


def to_mesh(iterator: Iterator, mesh, buffer_size: int = 2,
            steps_axis: bool = False) -> DevicePrefetcher:
  """Host-local batches -> global jax.Arrays sharded over `mesh`, `buffer_size` items ahead
  (`steps_axis`: items are StepChunks)."""
  from electra_jax import parallel  # pylint: disable=import-outside-toplevel
  return DevicePrefetcher(iterator, lambda batch: parallel.global_batch(batch, mesh, steps_axis),
                          buffer_size)
