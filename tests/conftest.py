"""Shared fixtures: tiny configs that compile and run in seconds on a CPU."""
import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)


def tiny_config(**overrides):
  """The demo config shrunk to a 2-layer, 32-wide model over a 64-token toy vocabulary."""
  from configs import demo  # pylint: disable=import-outside-toplevel
  c = demo.get_config()
  c.update(dict(model_size='demo', embedding_size=16, hidden_size=32, num_layers=2,
                num_heads=2, intermediate_size=64, generator_hidden_size=0.5, vocab_size=64,
                max_seq_length=32, train_batch_size=8, eval_batch_size=8,
                num_train_steps=100, num_warmup_steps=10, learning_rate=1e-3,
                # Dropout multiplies XLA compile time on CPU; tests that need it turn it on.
                dropout_rate=0.0, attention_dropout_rate=0.0))
  c.update(overrides)
  return c


@pytest.fixture
def tiny():
  return tiny_config
