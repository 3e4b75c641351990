"""Shared fixtures: tiny configs that compile and run in seconds on a CPU."""
import os
import sys
import tempfile

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

# The suite compiles hundreds of tiny train steps and runs few steps of each: most of its time
# went to LLVM optimising XLA's CPU code (a 1-layer step: 16 s to compile, 8 s without these
# passes). Set before JAX starts, for this process and every command the tests start; the
# compiled programs compute the same operations (benchmarks/RESULTS.md, session 10).
FAST_COMPILE_XLA_FLAGS = ('--xla_backend_optimization_level=0 '
                          '--xla_llvm_disable_expensive_passes=true')
if FAST_COMPILE_XLA_FLAGS not in os.environ.get('XLA_FLAGS', ''):  # (a subprocess has them)
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_XLA_FLAGS}".strip()


def pytest_xdist_auto_num_workers(config):
  """`pytest -n auto`: one worker a CPU this process may use, at most 8 (each holds a JAX
  runtime and starts commands of its own)."""
  del config
  usable = (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')  # Linux
            else os.cpu_count() or 1)
  return max(1, min(usable, 8))


@pytest.fixture(scope='session', autouse=True)
def library_temp_files(tmp_path_factory):
  """Libraries' own temporary files, in this process and the commands tests start, go under
  pytest's temporary root (which pytest prunes) instead of piling up in /tmp: TFDS leaves an
  empty tmp*tfds directory behind every builder of a dataset not yet prepared."""
  root = str(tmp_path_factory.mktemp('tempfile'))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('TMPDIR', root)
    patch.setattr(tempfile, 'tempdir', root)
    yield root


def under_ulimit(*flags) -> list[str]:
  """A command prefix that runs the command under bash's `ulimit FLAGS` (e.g. '-f', '16'); a
  preexec_fn would fork the multithreaded pytest process."""
  return ['bash', '-c', f'ulimit {" ".join(flags)} && exec "$@"', '-']


def xla_flags_with(*flags):
  """XLA_FLAGS for a test's subprocess: the suite's flags plus `flags` (e.g. a device count)."""
  return ' '.join([os.environ['XLA_FLAGS'], *flags])


def tiny_config(**overrides):
  """The demo config shrunk to a 2-layer, 32-wide model over a 64-token toy vocabulary."""
  from configs import demo  # pylint: disable=import-outside-toplevel
  c = demo.get_config()
  c.update(dict(model_size='demo', embedding_size=16, hidden_size=32, num_layers=2,
                num_heads=2, intermediate_size=64, generator_hidden_size=0.5, vocab_size=64,
                max_seq_length=32, train_batch_size=8, eval_batch_size=8,
                num_train_steps=100, num_warmup_steps=10, learning_rate=1e-3,
                # Dropout multiplies XLA compile time on CPU; tests that need it turn it on.
                dropout_rate=0.0, attention_dropout_rate=0.0,
                # The paper's architecture (transformers-exportable); tests of the option set it.
                relative_attention_span=0,
                # One step a call: tiny runs' intervals would cut the demo's 10 into calls of
                # several lengths, each a compile; tests of calls set it.
                steps_per_execution=1))
  c.update(overrides)
  return c


@pytest.fixture
def tiny():
  return tiny_config


def saved_state(workdir, step):
  """The train state a run saved at `step`, on this process's first device."""
  from electra_jax import checkpoint  # pylint: disable=import-outside-toplevel
  ckpt = checkpoint.Checkpointer(checkpoint.directory_of(workdir), read_only=True)
  try:
    return ckpt.read_state(int(step))
  finally:
    ckpt.close()


def tiny_trainer(**overrides):
  """(config, objective, initial state, jitted train step, mesh) for a tiny model on all devices."""
  # pylint: disable=import-outside-toplevel
  import jax
  from electra_jax import config as config_lib, model as model_lib, objectives
  from electra_jax import optim, parallel, train_state as ts
  c = config_lib.resolve(tiny_config(**overrides))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  objective = objectives.build(model, c, (0, 2, 3, 4), 4)
  tx, _ = optim.make_optimizer(c)
  mesh = parallel.make_mesh()
  state = ts.init_state(mesh, jax.random.key(0), model, tx, c.max_seq_length,
                        c.max_predictions_per_seq)
  return c, objective, state, ts.jit_train_step(ts.make_train_step(objective, tx), mesh), mesh
