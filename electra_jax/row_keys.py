"""One PRNG key that holds a key per batch row: per-example dropout without vmapping the model.

Dropout masks must depend on the example, not on where it sits (device, micro-batch), so each
row draws from its own key. Vmapping `model.apply` over rows did that but made XLA materialise
per-row copies of broadcasts (LayerNorm scales, biases): ~5 % of a CPU step. Instead, the
model gets one key of a custom PRNG implementation whose data is the [B] row keys:

  jax.random.bits(row_keyed(keys), (B, *shape))[b] == jax.random.bits(keys[b], shape)

(exactly: the draw jax.vmap over `keys` makes, which for rbg keys differs from the unbatched
one), and fold_in / split act on every row key alike, so Flax's `make_rng` (a fold_in of the
module path) gives each Dropout layer, per row, exactly the key the vmapped model gave it: the
masks are bit-identical to the vmapped ones. Every random draw from such a key must have the batch
as its leading dimension (true of every Dropout input here).
"""
import functools

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp


@functools.lru_cache(maxsize=None)
def rows_prng_impl(batch_size: int, row_impl: str, row_key_shape: tuple):
  """The PRNG implementation whose key data is [batch_size, *row_key_shape]: one `row_impl`
  key ('threefry2x32', 'rbg', ...) per row. One per (size, implementation)."""
  row_key = lambda data: jax.random.wrap_key_data(data, impl=row_impl)

  def seed(s):
    return jax.random.key_data(jax.random.split(jax.random.key(s, impl=row_impl), batch_size))

  def split(data, shape):
    out = jax.vmap(lambda r: jax.random.key_data(jax.random.split(row_key(r), shape)))(data)
    return jnp.moveaxis(out, 0, len(shape))  # [*shape, B, ...]: each new key keeps B rows

  def fold_in(data, value):
    return jax.vmap(lambda r: jax.random.key_data(jax.random.fold_in(row_key(r), value)))(
        data)

  def random_bits(data, bit_width, shape):
    if not shape or shape[0] != batch_size:
      raise ValueError(f'a row-keyed draw needs shape ({batch_size}, ...), got {shape}: '
                       'draw with the batch as the leading dimension')
    dtype = jnp.dtype(f'uint{bit_width}')
    return jax.vmap(lambda r: jax.random.bits(row_key(r), shape[1:], dtype))(data)

  return jax_random.define_prng_impl(
      key_shape=(batch_size, *row_key_shape), seed=seed, split=split, random_bits=random_bits,
      fold_in=fold_in, name=f'rows_of_{row_impl}_{batch_size}', tag=f'rows{batch_size}')


def row_keyed(keys: jax.Array) -> jax.Array:
  """[B] keys (typed, or raw uint32 data of the default implementation) -> one key whose
  draws give row b the bits of keys[b]."""
  if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
    data, row_impl = jax.random.key_data(keys), str(jax.random.key_impl(keys))
  else:
    data, row_impl = keys, jax.config.jax_default_prng_impl
  impl = rows_prng_impl(data.shape[0], row_impl, tuple(data.shape[1:]))
  return jax.random.wrap_key_data(data, impl=impl)
