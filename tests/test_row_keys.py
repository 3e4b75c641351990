"""row_keys: one key per batch row, so dropout is per example without vmapping the model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import row_keys
from tests.conftest import tiny_config

B = 5


def keys_of(seed=0, n=B, impl=None):
  return jax.random.split(jax.random.key(seed, impl=impl), n)


@pytest.mark.parametrize('impl', ['threefry2x32', 'rbg'])
def test_each_row_draws_the_bits_of_its_own_key(impl):
  """Row b gets what a draw vmapped over the keys gives row b (what the vmapped model drew);
  for threefry that is also the draw from keys[b] alone (rbg is not vmap-invariant)."""
  keys = keys_of(impl=impl)
  rows = row_keys.row_keyed(keys)
  for derive in (lambda k: k,
                 lambda k: jax.random.fold_in(k, 123),
                 lambda k: jax.random.split(k, 3)[2]):
    draw = lambda k, d=derive: jax.random.bits(d(k), (4, 7))
    got = np.asarray(jax.random.bits(derive(rows), (B, 4, 7)))
    np.testing.assert_array_equal(got, jax.vmap(draw)(keys))
    if impl == 'threefry2x32':
      for b in range(B):
        np.testing.assert_array_equal(got[b], draw(keys[b]))
  uniform = np.asarray(jax.random.uniform(rows, (B, 6)))
  np.testing.assert_array_equal(uniform, jax.vmap(lambda k: jax.random.uniform(k, (6,)))(keys))
  assert not np.array_equal(got[0], got[1])  # different rows, different bits


def test_raw_key_data_is_read_as_the_default_implementation():
  keys = keys_of()
  raw = row_keys.row_keyed(jax.random.key_data(keys))
  np.testing.assert_array_equal(jax.random.bits(raw, (B, 3)),
                                jax.random.bits(row_keys.row_keyed(keys), (B, 3)))


def test_a_draw_without_the_batch_leading_is_refused():
  with pytest.raises(ValueError, match=r'needs shape \(5, \.\.\.\)'):
    jax.random.bits(row_keys.row_keyed(keys_of()), (4, 5))


def test_model_dropout_from_row_keys_equals_the_model_vmapped_over_rows():
  """The masks and gradients the objective gets are those of each example run alone; with
  remat='full' the backward pass recomputes the layers and must redraw the same masks."""
  c = config_lib.resolve(tiny_config(dropout_rate=0.2, attention_dropout_rate=0.2,
                                     num_layers=1, remat='full'))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = jax.jit(lambda k: model_lib.init_params(model, k, 16, 3))(jax.random.key(0))
  ids = jax.random.randint(jax.random.key(1), (B, 16), 5, c.vocab_size)
  keys = keys_of(3)
  order = jnp.array([4, 2, 0, 1, 3])
  run = lambda p, i, k, train=True: model.apply(
      {'params': p}, i, i * 0, jnp.ones_like(i), not train,
      method=model_lib.Electra.discriminator_logits, rngs={'dropout': k})
  batched = lambda p: run(p, ids, row_keys.row_keyed(keys))
  alone = lambda p: jax.vmap(lambda k, i: run(p, i[None], k)[0])(keys, ids)
  outputs = jax.jit(lambda p: dict(
      batched=batched(p), alone=alone(p), deterministic=run(p, ids, keys[0], train=False),
      # The same examples in another order, each with its own key.
      permuted=run(p, ids[order], row_keys.row_keyed(keys[order]))))(params)
  np.testing.assert_array_equal(outputs['batched'], outputs['alone'])
  assert not np.allclose(outputs['batched'], outputs['deterministic'])  # dropout did act
  # A row's output does not depend on which other rows share the batch.
  np.testing.assert_allclose(outputs['permuted'], outputs['batched'][order], rtol=1e-5,
                             atol=1e-6)
  grads = jax.jit(lambda p: [jax.grad(lambda q: jnp.sum(jnp.sin(f(q))))(p)
                             for f in (batched, alone)])(params)
  for got, want in zip(*map(jax.tree.leaves, grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
