"""Sampling the generator's replacements: Gumbel-max, flat cost cut by a two-level draw."""
import jax
import jax.numpy as jnp

SAMPLER_BLOCK = 128


def gumbel_noise(rng, shape):
  """Gumbel(0, 1) noise with the official release's formula (its 1e-9 guards included)."""
  u = jax.random.uniform(rng, shape, jnp.float32)
  return -jnp.log(-jnp.log(u + 1e-9) + 1e-9)


def gumbel_sample(rng, logits, temperature: float, block: int = SAMPLER_BLOCK):
  """A token from softmax(logits / temperature) per row, by Gumbel-max in two levels.

  Flat Gumbel-max draws one uniform per vocabulary entry (18.5M per ELECTRA-Small step at the
  30,522 vocabulary; most of the step's vocabulary-sized cost). The maximum of Gumbel-perturbed
  logits over a block is Gumbel-distributed around the block's logsumexp, so Gumbel-max over
  the ~V/block block logsumexps picks the block with its exact softmax mass, and Gumbel-max
  inside that block picks the token: the same distribution as flat Gumbel-max (not the same
  draw for a given key), from V/block + block uniforms instead of V.
  """
  logits = logits.astype(jnp.float32) / temperature
  vocab = logits.shape[-1]
  block = min(block, vocab)
  full = vocab // block
  lead = logits.shape[:-1]

  # jax.nn.logsumexp gives -inf for a block whose entries are all -inf.
  block_lse = jax.nn.logsumexp(logits[..., :full * block].reshape(lead + (full, block)), axis=-1)
  if full * block != vocab:  # The last, shorter block.
    tail_lse = jax.nn.logsumexp(logits[..., full * block:], axis=-1, keepdims=True)
    block_lse = jnp.concatenate([block_lse, tail_lse], axis=-1)
  block_key, token_key = jax.random.split(rng)
  chosen = jnp.argmax(block_lse + gumbel_noise(block_key, block_lse.shape), axis=-1)
  # Read `block` entries from the chosen block's start, shifted left to stay inside the row for
  # the short last block; entries before the block's start (the shift) take no part.
  first = (chosen * block).reshape(-1)
  start = jnp.minimum(first, vocab - block)
  window = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, block))(
      logits.reshape(-1, vocab), start)
  in_block = start[:, None] + jnp.arange(block) >= first[:, None]
  window = jnp.where(in_block, window, -jnp.inf).reshape(lead + (block,))
  offset = jnp.argmax(window + gumbel_noise(token_key, window.shape), axis=-1)
  return (start.reshape(lead) + offset).astype(jnp.int32)
