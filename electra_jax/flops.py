"""Analytic model FLOPs of one ELECTRA optimizer step (the MaxText convention).

Counted so that every implementation of the same model gets the same number, whatever it
really executes: weight matmuls cost 2 FLOPs per weight per token in the forward pass,
attention 4·B·S²·H per layer (QKᵀ and PV, not halved: ELECTRA attends both ways), and the
backward pass twice the forward (×3 in all). Embedding lookups, LayerNorm, softmax, biases,
sampling and losses are not counted. The generator is counted at its own width; its head and
tied vocabulary projection only at the `max_predictions_per_seq` masked slots of each sequence
(the gather-first model computes nothing else), the discriminator's head at every position.

The parts are those the objective's layout (objectives/) has: a generator or not, the
full-size network's per-token head and/or MLM head (dense H->E, then E->vocab) at the masked
slots or, for all_tokens_mlm, every position; Electric's two-tower cloze generator runs two
encoders and its head at every position; adversarial's generator adds its baseline head at
the masked slots. Weight sharing (config.tie) changes no FLOPs:
tied weights are still applied once per network. An objective whose steps differ (two_stage)
says where their cost changes in its `flops_stages` hook; FLOPs per step is the run's average.
"""
from electra_jax import config as config_lib
from electra_jax import objectives


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
  objective = objectives.get(c.objective)
  layout = objective.layout_for(c)
  parts = {}
  if layout.generator:
    parts.update({
        'generator_encoder': 2 * tokens * encoder_matmul_params(
            e, hg, gen['intermediate_size'], gen['num_layers']),
        'generator_attention': attention_flops(b, s, hg, gen['num_layers']),
        # dense(H_G -> E), then the tied projection E -> vocab, at the masked slots only.
        'generator_head': 2 * masked * (hg * e + e * v),
    })
    if layout.generator_baseline:  # adversarial's dense(H_G -> 1) at the masked slots.
      parts['generator_head'] += 2 * masked * hg
  if layout.cloze_generator:  # Electric: two towers, dense(2 H_G -> E) + vocab everywhere.
    parts['generator_encoder'] *= 2
    parts['generator_attention'] *= 2
    parts['generator_head'] = 2 * tokens * (2 * hg * e + e * v)
  parts.update({
      'discriminator_encoder': 2 * tokens * encoder_matmul_params(
          e, h, c.intermediate_size, c.num_layers),
      'discriminator_attention': attention_flops(b, s, h, c.num_layers),
  })
  if layout.rtd_head:
    # dense(H -> H) + dense(H -> 1) at every position.
    parts['discriminator_head'] = 2 * tokens * (h * h + h)
  if layout.mlm_head:
    # dense(H -> E) + tied E -> vocab: at the masked slots, or every position (all tokens).
    slots = tokens if objective.mlm_head_slots == 'all' else masked
    parts['discriminator_mlm_head'] = 2 * slots * (h * e + e * v)
  return parts


def model_flops_stages(config) -> list[tuple[int, int]]:
  """[(first step, model FLOPs of each step from there on)] of the run (the objective's
  `flops_stages` hook): one stage unless the objective's steps differ (two_stage)."""
  c = config_lib.resolve(config)
  return objectives.get(c.objective).flops_stages(c, forward_flops(c))


def flops_to_step(stages, step: int) -> int:
  """Model FLOPs of the first `step` steps of a run with these `flops_stages` (exact)."""
  bounds = [first for first, _ in stages[1:]] + [max(step, stages[-1][0])]
  return sum(max(0, min(step, end) - first) * per_step
             for (first, per_step), end in zip(stages, bounds))


def step_at_flops(stages, flops_spent: float) -> int:
  """The last step by which a run with these `flops_stages` has spent at most `flops_spent`."""
  step = 0
  for k, (first, per_step) in enumerate(stages):
    end = stages[k + 1][0] if k + 1 < len(stages) else None
    step = first + int((flops_spent - flops_to_step(stages, first)) // per_step)
    if end is None or step < end:
      return step
  return step


def model_flops_per_step(config) -> float:
  """Model FLOPs of one optimizer step over the global batch (forward + backward = 3×),
  averaged over the run's config.num_train_steps where the objective's steps differ.

  `config`: an experiment ConfigDict (resolved or not; presets are filled in here).
  """
  steps = config.num_train_steps  # resolve (in model_flops_stages) leaves it as it is.
  return flops_to_step(model_flops_stages(config), steps) / steps


def utilization(model_flops_per_step: float, steps: int, seconds: float, num_devices: int,
                peak_tflops: float | None) -> dict:
  """Model TFLOP/s per device and MFU (None where the device's peak is unknown, as on CPUs)
  of `steps` steps taking `seconds`: the one formula of the benchmark and the training log."""
  achieved = model_flops_per_step * steps / max(seconds, 1e-9) / num_devices / 1e12
  return {'model_tflops_per_sec_per_device': achieved,
          'mfu': achieved / peak_tflops if peak_tflops else None}
