"""Analytic model FLOPs of one ELECTRA optimizer step (the MaxText convention).

Counted so that every implementation of the same model gets the same number, whatever it
really executes: weight matmuls cost 2 FLOPs per weight per token in the forward pass,
attention 4·B·S²·H per layer (QKᵀ and PV, not halved: ELECTRA attends both ways), and the
backward pass twice the forward (×3 in all). Embedding lookups, LayerNorm, softmax, biases,
sampling and losses are not counted. The generator is counted at its own width; its head and
tied vocabulary projection only at the `max_predictions_per_seq` masked slots of each sequence
(the gather-first model computes nothing else), the discriminator's head at every position.

Per objective (config.objective) the parts are those its model runs: 'mlm' has no generator
and a full-size MLM head (dense H->E, then E->vocab) at the masked slots; 'replace_mlm' the
generator plus that head; 'all_tokens_mlm' the generator, the MLM head at every position and
the per-token (copy) head; 'electra_15' is counted as 'electra'. Weight sharing (config.tie)
changes no FLOPs: tied weights are still applied once per network.

'two_stage' differs by stage. Stage 1 (the first two_stage_generator_steps steps) trains the
generator alone: 3 × its forward. Stage 2 runs the frozen generator forward only (its samples
feed D) and trains D: 1 × generator + 3 × discriminator. `model_flops_per_step` returns the
average over the run's num_train_steps. (The implementation also runs D's forward in stage 1
and G's backward in stage 2, with zero weight, for uniform metrics; that is not counted.)
"""
from electra_jax import config as config_lib


def encoder_matmul_params(embedding_size: int, hidden: int, intermediate: int,
                          num_layers: int) -> int:
  """Weights one token meets in an encoder: E->H projection (if any), QKV, output, FFN."""
  project = embedding_size * hidden if embedding_size != hidden else 0
  per_layer = 4 * hidden * hidden + 2 * hidden * intermediate
  return project + num_layers * per_layer


def attention_flops(batch: int, seq: int, hidden: int, num_layers: int) -> int:
  """Forward FLOPs of QKᵀ and PV over all heads and layers."""
  return 4 * batch * seq * seq * hidden * num_layers


def forward_flops(config) -> dict:
  """Forward FLOPs of one global batch, split by part (for tables and checks)."""
  c = config_lib.resolve(config)
  b, s, p = c.train_batch_size, c.max_seq_length, c.max_predictions_per_seq
  e, v, h = c.embedding_size, c.vocab_size, c.hidden_size
  gen = config_lib.generator_sizes(c)
  hg = gen['hidden_size']
  tokens, masked = b * s, b * p
  parts = {}
  if c.objective != 'mlm':
    parts.update({
        'generator_encoder': 2 * tokens * encoder_matmul_params(
            e, hg, gen['intermediate_size'], c.num_layers),
        'generator_attention': attention_flops(b, s, hg, c.num_layers),
        # dense(H_G -> E), then the tied projection E -> vocab, at the masked slots only.
        'generator_head': 2 * masked * (hg * e + e * v),
    })
  parts.update({
      'discriminator_encoder': 2 * tokens * encoder_matmul_params(
          e, h, c.intermediate_size, c.num_layers),
      'discriminator_attention': attention_flops(b, s, h, c.num_layers),
  })
  if c.objective in ('electra', 'electra_15', 'two_stage', 'all_tokens_mlm'):
    # dense(H -> H) + dense(H -> 1) at every position.
    parts['discriminator_head'] = 2 * tokens * (h * h + h)
  if c.objective in ('mlm', 'replace_mlm', 'all_tokens_mlm'):
    # dense(H -> E) + tied E -> vocab: at the masked slots, or every position (all tokens).
    slots = tokens if c.objective == 'all_tokens_mlm' else masked
    parts['discriminator_mlm_head'] = 2 * slots * (h * e + e * v)
  return parts


def model_flops_per_step(config) -> float:
  """Model FLOPs of one optimizer step over the global batch (forward + backward = 3×).

  `config`: an experiment ConfigDict (resolved or not; presets are filled in here). For
  objective='two_stage' the average step of the whole run (module docstring).
  """
  parts = forward_flops(config)
  c = config_lib.resolve(config)
  if c.objective != 'two_stage':
    return float(3 * sum(parts.values()))
  gen = sum(v for k, v in parts.items() if k.startswith('generator_'))
  disc = sum(v for k, v in parts.items() if k.startswith('discriminator_'))
  n, total = c.two_stage_generator_steps, c.num_train_steps
  return float((n * 3 * gen + (total - n) * (gen + 3 * disc)) / total)
