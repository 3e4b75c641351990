"""One PRNG key that holds a key per batch row: per-example dropout without vmapping the model.

Dropout masks must depend on the example, not on where it sits (device, micro-batch), so each
row draws from its own key. Vmapping `model.apply` over rows did that but made XLA materialise
per-row copies of broadcasts (LayerNorm scales, biases): ~5 % of a CPU step. Instead, the
model gets one key of a custom PRNG implementation whose data is the [B] row keys:

  jax.random.bits(row_keyed(keys), (B, ...))[b] == jax.random.bits(keys[b], (...))

and fold_in / split act on every row key alike, so Flax's `make_rng` (a fold_in of the module
path) gives each Dropout layer, per row, exactly the key the vmapped model gave it: the masks
are bit-identical to the vmapped ones. Every random draw from such a key must have the batch
as its leading dimension (true of every Dropout input here).
"""
import functools

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp

_ROW_IMPL = 'threefry2x32'


def _row_key(data):
  return jax.random.wrap_key_data(data, impl=_ROW_IMPL)


@functools.lru_cache(maxsize=None)
def rows_prng_impl(batch_size: int):
  """The PRNG implementation whose key data is [batch_size, 2] threefry keys (one per size)."""
  def seed(s):
    return jax.random.key_data(jax.random.split(jax.random.key(s, impl=_ROW_IMPL),
                                                batch_size))

  def split(data, shape):
    out = jax.vmap(lambda r: jax.random.key_data(jax.random.split(_row_key(r), shape)))(data)
    return jnp.moveaxis(out, 0, len(shape))  # [*shape, B, 2]: each new key keeps B rows

  def fold_in(data, value):
    return jax.vmap(lambda r: jax.random.key_data(jax.random.fold_in(_row_key(r), value)))(
        data)

  def random_bits(data, bit_width, shape):
    if not shape or shape[0] != batch_size:
      raise ValueError(f'a row-keyed draw needs shape ({batch_size}, ...), got {shape}: '
                       'draw with the batch as the leading dimension')
    dtype = jnp.dtype(f'uint{bit_width}')
    return jax.vmap(lambda r: jax.random.bits(_row_key(r), shape[1:], dtype))(data)

  return jax_random.define_prng_impl(
      key_shape=(batch_size, 2), seed=seed, split=split, random_bits=random_bits,
      fold_in=fold_in, name=f'rows_of_{_ROW_IMPL}_{batch_size}', tag=f'rows{batch_size}')


def row_keyed(keys: jax.Array) -> jax.Array:
  """[B] threefry keys (typed, or raw [B, 2] uint32) -> one key whose draws give row b the
  bits of keys[b]."""
  data = jax.random.key_data(keys) if jax.dtypes.issubdtype(keys.dtype,
                                                            jax.dtypes.prng_key) else keys
  return jax.random.wrap_key_data(data, impl=rows_prng_impl(data.shape[0]))
