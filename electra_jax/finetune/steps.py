"""Per-task losses and the pure train objective / prediction functions the loop jits.

Every loss is per example (float32) so evaluation can weight out padding; training uses the
mean. Classification: softmax cross-entropy; tagging: its sum over the sentence's words (at
each word's first piece, as the official tagging code); regression: squared error on the scaled
target;
SQuAD: (start CE + end CE) / 2 on every window (one without the answer targets [CLS], as in the
official code), plus answerable_weight times the answerability sigmoid cross-entropy: SQuAD 2.0
with the 'xlnet' span head (label: this window holds the answer), SQuAD 1.1 and 2.0 with the
'official' one (label: the question has an answer, on all its windows, as qa_tasks.py); the
'bert' head has no answerability output ([CLS] as start and end is its no-answer).
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from electra_jax import masking
from electra_jax import row_keys
from electra_jax.finetune import tasks as tasks_lib


def per_example_loss(task, outputs, batch, answerable_weight: float, span_head: str = 'xlnet'):
  if task.kind == tasks_lib.CLASSIFICATION:
    return optax.softmax_cross_entropy_with_integer_labels(outputs, batch['label'])
  if task.kind == tasks_lib.TAGGING:
    losses = optax.softmax_cross_entropy_with_integer_labels(outputs, batch['label'])
    return jnp.sum(losses * batch['word_start'], axis=-1)
  if task.kind == tasks_lib.REGRESSION:
    return jnp.square(outputs[:, 0] - batch['label'])
  start, end, answerable = outputs
  loss = 0.5 * (optax.softmax_cross_entropy_with_integer_labels(start, batch['start_position'])
                + optax.softmax_cross_entropy_with_integer_labels(end, batch['end_position']))
  if span_head == 'bert':
    return loss
  if span_head == 'official':
    has_answer = batch['question_answerable'].astype(jnp.float32)
  elif tasks_lib.is_squad_v2(task):
    has_answer = batch['answerable'].astype(jnp.float32)
  else:
    return loss
  return loss + answerable_weight * optax.sigmoid_binary_cross_entropy(answerable, has_answer)


@dataclasses.dataclass(frozen=True)
class TaskObjective:
  """(params, batch, rng) -> (loss, sums). The loss is the batch's mean per-example loss, or its
  sum (`reduction`, config.loss_reduction). The same at every step (train_state's `at_step` /
  `prepare_params` leave it and the params as they are).

  Row b's dropout is drawn from fold_in(rng, example_ids[b]) (default: the row index), so the
  micro-batches of grad_accum_steps, given their rows' global ids, drop what the whole batch
  would; `denominators` (loss_denominators of the whole batch) make each micro-batch's mean
  its share of the whole batch's."""
  model: Any
  task: Any
  answerable_weight: float
  reduction: str = 'mean'
  span_head: str = 'xlnet'

  def loss_denominators(self, batch, rng) -> dict:
    del rng
    return {'examples': jnp.float32(batch['input_ids'].shape[0])}

  def __call__(self, params, batch, rng, deterministic=False, example_ids=None,
               denominators=None):
    rngs = {}
    if not deterministic and self.model.cfg.has_dropout:
      keys = masking.example_keys(rng, batch['input_ids'].shape[0], example_ids)
      rngs = {'dropout': row_keys.row_keyed(keys)}
    outputs = self.model.apply({'params': params}, batch, deterministic=deterministic, rngs=rngs)
    losses = per_example_loss(self.task, outputs, batch, self.answerable_weight, self.span_head)
    num_examples = jnp.float32(losses.shape[0])
    loss_sum = jnp.sum(losses)
    whole_batch = denominators['examples'] if denominators else num_examples
    loss = loss_sum if self.reduction == 'sum' else loss_sum / whole_batch
    return loss, dict(loss_sum=loss_sum, num_examples=num_examples)

  def at_step(self, step) -> 'TaskObjective':
    del step
    return self

  def prepare_params(self, params, step):
    del step
    return params


def make_predict(model, task, c):
  """(params, batch, rng) -> per-example loss and predictions, without dropout."""

  def predict(params, batch, rng):
    del rng
    variables = {'params': params}
    outputs = model.apply(variables, batch, deterministic=True)
    result = dict(loss=per_example_loss(task, outputs, batch, c.answerable_weight, c.span_head))
    if task.kind in (tasks_lib.CLASSIFICATION, tasks_lib.TAGGING):
      result['prediction'] = jnp.argmax(outputs, axis=-1)
      result['probabilities'] = jax.nn.softmax(outputs.astype(jnp.float32), axis=-1)
    elif task.kind == tasks_lib.REGRESSION:
      result['prediction'] = outputs[:, 0]
    else:
      result.update(model.apply(variables, batch, c.beam_size, c.max_answer_length,
                                method=model.span_beam))
    return result

  return predict
