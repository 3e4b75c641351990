import jax
import numpy as np

from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import objective as objective_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import train_state as ts
from tests.conftest import tiny_config
from tests.test_model_objective import toy_batch


def test_tiny_model_overfits_one_batch():
  c = config_lib.resolve(tiny_config(learning_rate=1e-2, num_train_steps=300,
                                     num_warmup_steps=10, vocab_size=32))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  obj = objective_lib.ElectraObjective.from_config(model, c, (0, 2, 3, 4), 4)
  tx, _ = optim.make_optimizer(c)
  mesh = parallel.make_mesh()
  state = ts.init_state(mesh, jax.random.key(0), model, tx, c.max_seq_length,
                        c.max_predictions_per_seq)
  step = ts.jit_train_step(ts.make_train_step(obj, tx), mesh)
  # Rows count upwards from a random start: learnable from context, so G and then D can fit it.
  batch = jax.device_get(toy_batch(c))
  starts = np.random.default_rng(0).integers(0, 27, (c.train_batch_size, 1))
  pattern = 5 + (starts + np.arange(c.max_seq_length)[None]) % 27
  real_text = (batch['input_ids'] >= 5)
  batch['input_ids'] = np.where(real_text, pattern, batch['input_ids']).astype(np.int32)
  batch = parallel.global_batch(batch, mesh)
  losses = []
  for _ in range(c.num_train_steps):
    state, sums = step(state, batch, jax.random.key(1))
    losses.append(objective_lib.summarize(jax.device_get(sums), 1.0, 50.0)['loss'])
  first, last = np.mean(losses[:5]), np.mean(losses[-5:])
  assert last < 0.5 * first, (first, last)
  assert int(state.step) == c.num_train_steps


def test_train_step_is_a_pure_function_of_state_batch_and_seed():
  c = config_lib.resolve(tiny_config())
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  obj = objective_lib.ElectraObjective.from_config(model, c, (0, 2, 3, 4), 4)
  tx, _ = optim.make_optimizer(c)
  mesh = parallel.make_mesh()
  step = ts.jit_train_step(ts.make_train_step(obj, tx), mesh)
  batch = parallel.global_batch(jax.device_get(toy_batch(c)), mesh)
  outs = []
  for _ in range(2):
    state = ts.init_state(mesh, jax.random.key(0), model, tx, c.max_seq_length,
                          c.max_predictions_per_seq)
    for _ in range(3):
      state, sums = step(state, batch, jax.random.key(1))
    outs.append(jax.device_get((state.params, sums)))
  jax.tree.map(np.testing.assert_array_equal, outs[0], outs[1])
