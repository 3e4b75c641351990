"""Analytic model FLOPs of one training step (MaxText convention), for dry runs and MFU.

Counted: every weight matmul as 2 FLOPs per multiply-add per token, attention scores and
context as 4 * B * S^2 * H per layer (not halved: ELECTRA attends both ways), for the generator
and the discriminator, forward x 3 for forward + backward. The generator's head and its tied
vocabulary projection run only at the B x max_predictions_per_seq gathered positions.
Embedding lookups, LayerNorm, softmax and the optimizer update are not counted.
"""
from electra_jax import config as config_lib


def _encoder_flops(tokens: int, batch: int, seq: int, embedding: int, hidden: int,
                   intermediate: int, layers: int) -> float:
  """Forward FLOPs of one transformer stack (with its E -> H projection if E != H)."""
  per_token = layers * (2 * 4 * hidden * hidden + 2 * 2 * hidden * intermediate)
  if embedding != hidden:
    per_token += 2 * embedding * hidden
  attention = layers * 4 * batch * seq * seq * hidden
  return float(tokens * per_token + attention)


def model_flops_per_step(config) -> float:
  """FLOPs of one optimizer step (generator + discriminator, forward + backward) on the whole
  global batch of a resolved config (config_lib.resolve)."""
  c = config
  batch, seq = c.train_batch_size, c.max_seq_length
  tokens = batch * seq
  gen = config_lib.generator_sizes(c)
  disc = _encoder_flops(tokens, batch, seq, c.embedding_size, c.hidden_size,
                        c.intermediate_size, c.num_layers)
  disc += tokens * (2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size)  # RTD head
  generator = _encoder_flops(tokens, batch, seq, c.embedding_size, gen['hidden_size'],
                             gen['intermediate_size'], c.num_layers)
  predictions = batch * c.max_predictions_per_seq
  generator += predictions * (2 * gen['hidden_size'] * c.embedding_size  # MLM head dense
                              + 2 * c.embedding_size * c.vocab_size)     # tied vocab logits
  return 3.0 * (disc + generator)
