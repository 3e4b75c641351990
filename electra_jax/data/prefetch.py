"""Builds the next global batches on a background thread while the current step runs.

The host work per step (reading this host's rows, decoding, and placing them on the devices
as one global jax.Array) overlaps the step instead of preceding it. Checkpoint-exact: the
state saved is the one after the last batch the loop *consumed*, never after the ones waiting
in the buffer, so a restored run continues with the first batch the old run did not use.
"""
import copy
import queue
import threading
import weakref
from typing import Any, Callable

import grain

_POLL_SECONDS = 0.1  # How often a blocked producer checks whether it should stop.


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
  while not stop.is_set():
    try:
      q.put(item, timeout=_POLL_SECONDS)
      return True
    except queue.Full:
      pass
  return False


def _produce(parent, transform, q: queue.Queue, stop: threading.Event):
  """Producer thread: (batch, parent state after it) pairs, then the exception that ended it."""
  try:
    while not stop.is_set():
      batch = next(parent)
      item = (transform(batch), parent.get_state(), None)
      if not _put(q, item, stop):
        return
  except BaseException as e:  # pylint: disable=broad-except  # StopIteration included.
    _put(q, (None, None, e), stop)


class DevicePrefetcher(grain.DatasetIterator):
  """Wraps a grain iterator: yields `transform(batch)` made up to `buffer_size` steps ahead."""

  def __init__(self, parent: grain.DatasetIterator, transform: Callable[[Any], Any],
               buffer_size: int = 2):
    super().__init__(parent)
    self._transform, self._buffer_size = transform, buffer_size
    self._consumed_state = copy.deepcopy(parent.get_state())
    self._thread = self._stop = self._queue = None

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

  def __next__(self):
    self.start_prefetch()
    batch, state, error = self._queue.get()
    if error is not None:
      self._stop_thread()
      raise error
    self._consumed_state = state
    return batch

  def get_state(self) -> dict:
    return copy.deepcopy(self._consumed_state)

  def set_state(self, state: dict) -> None:
    self._stop_thread()  # Batches made ahead belong to the old position: drop them.
    self._parent.set_state(state)
    self._consumed_state = copy.deepcopy(state)

  def close(self) -> None:
    self._stop_thread()
    super().close()


def to_mesh(iterator: grain.DatasetIterator, mesh, buffer_size: int = 2) -> DevicePrefetcher:
  """Host-local batches -> global jax.Arrays sharded over `mesh`, `buffer_size` steps ahead."""
  from electra_jax import parallel  # pylint: disable=import-outside-toplevel
  return DevicePrefetcher(iterator, lambda batch: parallel.global_batch(batch, mesh),
                          buffer_size)
