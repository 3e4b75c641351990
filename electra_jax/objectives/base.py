"""What every pretraining objective shares: its config fields, masking, the generator's
corruption of the input, and the hooks an objective may override (params layout, config
checks, optimizer, per-step params, export).

An objective is a frozen dataclass, a pure function (params, batch, rng) -> (loss, metric
sums). Subclasses set `name` and `layout` and implement `__call__`; the registry
(objectives/__init__.py) maps config.objective to the class.
"""
import dataclasses
from typing import Any, ClassVar, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax import masking
from electra_jax import row_keys
from electra_jax.data import words
from electra_jax.errors import UserError
from electra_jax.objectives import metrics
from electra_jax.objectives import sampling


# Keys read only to build and train the small generator network (its size, its learning rate).
GENERATOR_KEYS = ('generator_hidden_size', 'generator_layers', 'generator_lr_multiplier')


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which networks and heads an objective's params tree holds (model.py's docstring)."""
  generator: bool  # a small generator, MLM at the masked positions, sampling replacements
  rtd_head: bool   # the full-size network's one logit per token ('head')
  mlm_head: bool   # the full-size network's masked-LM head ('mlm_head')
  # The generator is Electric's two-tower cloze model (every position, on the unmasked input).
  cloze_generator: bool = False
  # The generator has a one-logit head per masked position (adversarial's REINFORCE baseline).
  generator_baseline: bool = False


class Corruption(NamedTuple):
  """The generator's half of a step: its MLM loss and sums, and the input it corrupted."""
  gen_logits: jax.Array  # [B, P, V] at the masked positions
  baseline_logits: Any   # [B, P] the generator's baseline head (layout.generator_baseline) or None
  mlm_loss: jax.Array    # mean MLM loss over the whole batch's masked positions
  gen_sums: dict         # metrics.generator_metric_sums
  corrupted: jax.Array   # [B, S] the input with the generator's samples at masked positions
  labels: jax.Array      # [B, S] float32 1 where corrupted differs from the input (real only)


@dataclasses.dataclass(frozen=True)
class Objective:
  """(params, batch, rng) -> (loss, metric sums) of one pretraining objective."""
  name: ClassVar[str]
  layout: ClassVar[Layout]
  # Whether its 'discriminator' is an ELECTRA replaced-token detector HF can load (export.py).
  exportable: ClassVar[bool] = False
  # The full-size MLM head's slots for FLOPs counting: 'masked' positions or 'all' tokens.
  mlm_head_slots: ClassVar[str] = 'masked'

  model: Any  # model.Electra
  special_ids: Sequence[int]
  mask_id: int
  vocab_size: int
  mask_prob: float
  max_predictions: int
  mask_token_prob: float = 0.85
  random_token_prob: float = 0.0
  mask_with_replacement: bool = False
  temperature: float = 1.0
  disallow_correct: bool = False
  uniform_generator: bool = False
  gen_weight: float = 1.0
  disc_weight: float = 50.0
  two_stage_generator_steps: int = 0
  # Whole-word masking: each vocabulary token's data/words.py kind as int8 bytes (hashable,
  # as the objective's fields are); None: token masking.
  word_kinds: bytes | None = dataclasses.field(default=None, repr=False)
  # The optimizer step being taken; None outside training (evaluation).
  step: Any = None

  @classmethod
  def from_config(cls, model, c, special_ids, mask_id, word_kinds=None):
    """`word_kinds`: the vocabulary's tokenizer.word_kinds(), for config.whole_word_masking
    (None there: words.stand_in_kinds, for a plan or synthetic data without the vocabulary)."""
    if c.whole_word_masking and word_kinds is None:
      word_kinds = words.stand_in_kinds(c.vocab_size)
    return cls(model=model, special_ids=tuple(special_ids), mask_id=mask_id,
               vocab_size=c.vocab_size, mask_prob=c.mask_prob,
               max_predictions=c.max_predictions_per_seq, mask_token_prob=c.mask_token_prob,
               random_token_prob=c.random_token_prob,
               mask_with_replacement=c.mask_with_replacement, temperature=c.temperature,
               disallow_correct=c.disallow_correct, uniform_generator=c.uniform_generator,
               gen_weight=c.gen_weight, disc_weight=c.disc_weight,
               two_stage_generator_steps=c.two_stage_generator_steps,
               word_kinds=(np.asarray(word_kinds, np.int8).tobytes() if c.whole_word_masking
                           else None))

  @classmethod
  def layout_for(cls, c) -> Layout:
    """The params layout under this config: without a generator network when
    config.uniform_generator samples replacements uniformly instead."""
    if c.uniform_generator:
      return dataclasses.replace(cls.layout, generator=False)
    return cls.layout

  @classmethod
  def unread_keys(cls, c) -> tuple[str, ...]:
    """Config keys that cannot change this objective's weights under config `c`: the
    generator's, when it has no generator network (a run differing only in them is reusable)."""
    return () if cls.layout_for(c).generator else GENERATOR_KEYS

  @classmethod
  def validate(cls, c):
    """Raises UserError for config values this objective cannot use (config.resolve)."""
    for key in ('uniform_generator', 'disallow_correct'):
      if c[key] and not cls.layout.generator:
        raise UserError(f'config.{key}=True needs a generator; objective {cls.name!r} has '
                        'none')
    if c.two_stage_generator_steps != 0:
      raise UserError(f'config.two_stage_generator_steps={c.two_stage_generator_steps} is only '
                      f"used by objective 'two_stage' (objective is {cls.name!r}); leave it 0")

  @classmethod
  def warmup_limit(cls, c) -> int:
    """The longest warmup this objective's schedule holds (config.resolve shortens a longer
    one to it): the run; two_stage's shorter stage (each stage warms up anew)."""
    return c.num_train_steps

  @classmethod
  def optimizer(cls, c, adamw) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(update rule, LR schedule of the step) from optim.py's `adamw(c, steps)`, which returns
    one AdamW over `steps` steps and its schedule; two_stage runs two."""
    return adamw(c, c.num_train_steps)

  @classmethod
  def flops_stages(cls, c, forward_parts: dict) -> list[tuple[int, int]]:
    """[(first step, training FLOPs of each step from there on)] from one step's forward FLOPs
    by part (flops.py): forward + backward, 3x, the same at every step. A list, so that an
    objective whose steps differ (two_stage) says where their cost changes."""
    del c
    return [(0, 3 * sum(forward_parts.values()))]

  @classmethod
  def steps_scaled(cls, c, num_train_steps: int) -> dict:
    """Config keys counted in steps, other than num_train_steps, for a run of
    `num_train_steps` steps made from config `c` (compare's FLOPs budget): each keeps its share
    of c's run. None here; two_stage's stage split."""
    del c, num_train_steps
    return {}

  def at_step(self, step) -> 'Objective':
    """This objective for optimizer step `step` (0-based; a traced value inside jit)."""
    return dataclasses.replace(self, step=step)

  def prepare_params(self, params, step):
    """The params step `step` starts from (two_stage copies G into D at its switch)."""
    del step
    return params

  def loss_denominators(self, batch: Mapping[str, jax.Array], rng) -> dict:
    """The whole batch's prediction-slot, distinct masked-position and real-token counts under
    the step's key `rng` (only masking with replacement, where a position may fill two slots,
    and whole-word masking, where the words that fit the budget vary, need the mask itself)."""
    if self.word_kinds is None and not self.mask_with_replacement:
      mlm_count = masking.num_predictions(
          batch['input_ids'], batch['input_mask'], special_ids=self.special_ids,
          mask_prob=self.mask_prob, max_predictions=self.max_predictions)
      return _counts(batch, mlm_count, mlm_count)
    mask_keys = self._row_keys(rng, batch['input_ids'].shape[0], None)[0]
    m = self._mask(mask_keys, batch)
    return _counts(batch, jnp.sum(m.masked_weights), jnp.sum(m.write_weights))

  @staticmethod
  def _row_keys(rng, batch_size, example_ids):
    """[4, B] keys: each row's for its masking, generator, samples and full-size network."""
    keys = masking.example_keys(rng, batch_size, example_ids)
    return jnp.moveaxis(jax.vmap(lambda k: jax.random.split(k, 4))(keys), 1, 0)

  def _mask(self, mask_keys, batch) -> masking.MaskedBatch:
    word_kinds = None if self.word_kinds is None else np.frombuffer(self.word_kinds, np.int8)
    return masking.mask_batch(
        mask_keys, batch['input_ids'], batch['input_mask'], special_ids=self.special_ids,
        mask_id=self.mask_id, vocab_size=self.vocab_size, mask_prob=self.mask_prob,
        max_predictions=self.max_predictions, mask_token_prob=self.mask_token_prob,
        random_token_prob=self.random_token_prob, with_replacement=self.mask_with_replacement,
        word_kinds=word_kinds)

  def __call__(self, params, batch: Mapping[str, jax.Array], rng, deterministic=False,
               example_ids=None, denominators=None):
    """Returns (loss, metric sums).

    Randomness is drawn per example from fold_in(rng, example_ids[b]) (default: the row index),
    so a batch split into micro-batches with their global `example_ids` draws the same masks,
    samples and dropout as the whole batch. `denominators` (from `loss_denominators` of the
    whole batch) make each micro-batch's loss its share of the whole batch's loss.
    """
    s = self.masked_step(params, batch, rng, deterministic, example_ids, denominators)
    loss, sums = self.loss(s)
    # Distinct positions predicted, for the reported masked_fraction (whole-word masking may
    # choose fewer than the budget).
    return loss, dict(sums, masked_count=jnp.sum(s.masked.write_weights))

  def masked_step(self, params, batch: Mapping[str, jax.Array], rng, deterministic=False,
                  example_ids=None, denominators=None) -> 'Step':
    """The Step a call of the objective computes its loss from: the batch masked, and each
    row's keys for the generator, its samples and the full-size network (see __call__)."""
    mask_keys, gen_keys, sample_keys, disc_keys = self._row_keys(
        rng, batch['input_ids'].shape[0], example_ids)
    m = self._mask(mask_keys, batch)
    if denominators is None:
      denominators = _counts(batch, jnp.sum(m.masked_weights), jnp.sum(m.write_weights))
    return Step(self, params, batch, m, denominators, deterministic, gen_keys, sample_keys,
                disc_keys)

  def loss(self, s: 'Step'):
    """(loss, metric sums) of one step's inputs; what a subclass implements."""
    raise NotImplementedError

  def replaced_logits(self, params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """[B, S] logits of the full-size network's probability that each token of `batch`, as
    given, is not the original (detect.py; no dropout): an ELECTRA discriminator's own logit.
    Objectives whose per-token head means something else override this; those without one
    (layout.rtd_head False) have no such probability."""
    return self.apply(params, 'discriminator_logits', None, True, batch['input_ids'],
                      batch['segment_ids'], batch['input_mask'])

  def detect_corrupted(self, s: 'Step') -> tuple[jax.Array, jax.Array]:
    """(the input a training step builds from s's batch [B, S], `replaced_logits` of it as
    that step computes them), for detect.py's --sample."""
    corrupted = s.corrupt().corrupted
    return corrupted, self.replaced_logits(s.params, dict(s.batch, input_ids=corrupted))

  def apply(self, params, method: str, keys, deterministic, *inputs):
    """model.apply(method) with each row's dropout drawn from its own key in `keys` [B]."""
    variables = {'params': params}
    cfg = self.model.cfg
    if deterministic or not cfg.has_dropout:
      return self.model.apply(variables, *inputs, True, method=method)
    return self.model.apply(variables, *inputs, False, method=method,
                            rngs={'dropout': row_keys.row_keyed(keys)})


@dataclasses.dataclass(frozen=True)
class Step:
  """One call's inputs after masking, with the per-row keys of each random part."""
  objective: Objective
  params: Any
  batch: Mapping[str, jax.Array]
  masked: masking.MaskedBatch
  denominators: dict
  deterministic: bool
  gen_keys: jax.Array
  sample_keys: jax.Array
  disc_keys: jax.Array

  @property
  def real(self):
    """[B, S] float32 1 at real (non-padding) tokens."""
    return self.batch['input_mask'].astype(jnp.float32)

  def full_size(self, method: str, *inputs):
    """The full-size network's `method` on `inputs` (segment ids and mask added)."""
    ids, rest = inputs[0], inputs[1:]
    return self.objective.apply(self.params, method, self.disc_keys, self.deterministic, ids,
                                self.batch['segment_ids'], self.batch['input_mask'], *rest)

  def corrupt(self) -> Corruption:
    """Runs the generator on the masked input and puts its samples at the masked positions."""
    o, m = self.objective, self.masked
    input_ids = self.batch['input_ids']
    if o.uniform_generator:  # The official uniform_generator: all logits 0, no network.
      gen_logits = jnp.zeros(m.masked_lm_ids.shape + (o.vocab_size,), jnp.float32)
      baseline_logits = None
    else:
      gen_logits, baseline_logits = o.apply(
          self.params, 'generator_outputs', self.gen_keys, self.deterministic, m.masked_ids,
          self.batch['segment_ids'], self.batch['input_mask'], m.masked_positions)
    mlm_losses = optax.softmax_cross_entropy_with_integer_labels(gen_logits, m.masked_lm_ids)
    # The samples are constants for the rest of the step: no gradient reaches G through them.
    sampled = sample_replacements(self.sample_keys, jax.lax.stop_gradient(gen_logits),
                                  m.masked_lm_ids, o.temperature, o.disallow_correct)
    corrupted = masking.scatter_positions(input_ids, m.masked_positions, sampled,
                                          m.write_weights)
    # A sample that equals the original token counts as original.
    labels = (corrupted != input_ids).astype(jnp.float32) * self.real
    mlm_loss = weighted_mean(mlm_losses, m.masked_weights, self.denominators['mlm_count'])
    gen_sums = metrics.generator_metric_sums(gen_logits, m.masked_lm_ids, m.masked_weights,
                                             mlm_losses, sampled)
    return Corruption(gen_logits, baseline_logits, mlm_loss, gen_sums, corrupted, labels)

  def full_mlm(self, logits, targets, weights, denominator):
    """The full-size network's cross-entropy: (mean loss, full_mlm_* sums)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (weighted_mean(losses, weights, denominator),
            metrics.full_mlm_metric_sums(logits, targets, losses, weights))


def sample_replacements(keys, gen_logits, targets, temperature: float, disallow_correct: bool):
  """A token per masked slot from softmax(gen_logits / temperature), row b from keys[b].

  disallow_correct: the official release's `logits / T - 1000 * one_hot(target)`, so the
  generator (almost) never samples the original token and every masked position is replaced.
  """
  return jax.vmap(sampling.gumbel_sample, (0, 0, None))(
      keys, _disallowing(gen_logits, targets, temperature, disallow_correct), temperature)


def sample_log_probs(gen_logits, sampled, targets, temperature: float, disallow_correct: bool):
  """log q(sampled) [B, P] under the distribution sample_replacements draws from."""
  logits = _disallowing(gen_logits, targets, temperature, disallow_correct) / temperature
  log_q = jax.nn.log_softmax(logits.astype(jnp.float32))
  return jnp.take_along_axis(log_q, sampled[..., None], -1)[..., 0]


def _disallowing(gen_logits, targets, temperature: float, disallow_correct: bool):
  if not disallow_correct:
    return gen_logits
  return gen_logits - 1000.0 * temperature * jax.nn.one_hot(
      targets, gen_logits.shape[-1], dtype=gen_logits.dtype)


def is_generator(top_level_key: str) -> bool:
  """Whether a top-level params key is the generator's own ('generator', and with tie='none'
  'generator_embeddings'); shared embeddings belong to the discriminator."""
  return top_level_key.startswith('generator')


def _counts(batch, mlm_count, masked_positions) -> dict:
  """The losses' denominators: prediction slots (`mlm_count`; drawn with replacement, a
  position may fill two), distinct masked positions, and real tokens (`disc_count`)."""
  return {'mlm_count': mlm_count, 'masked_positions': masked_positions,
          'disc_count': jnp.sum(batch['input_mask'].astype(jnp.float32))}


def weighted_mean(values, weights, denominator=None):
  """sum(values * weights) / sum(weights), or over a given denominator (the whole batch's)."""
  denominator = jnp.sum(weights) if denominator is None else denominator
  return jnp.sum(values * weights) / (denominator + 1e-6)


def masked_position_indicator(input_ids, m: masking.MaskedBatch):
  """[B, S] float32: 1 at the masked positions of `m`, 0 elsewhere."""
  zeros = jnp.zeros(input_ids.shape, jnp.int32)
  ones = jnp.ones(m.masked_positions.shape, jnp.int32)
  return masking.scatter_positions(zeros, m.masked_positions, ones,
                                   m.write_weights).astype(jnp.float32)
