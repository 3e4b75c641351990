"""A fine-tuned classifier or regressor as transformers' ElectraForSequenceClassification, a
tagger as its ElectraForTokenClassification and a SQuAD run with span_head='bert' as its
ElectraForQuestionAnswering (the same heads as ours: one linear layer).

Our head is one linear layer on the [CLS] state (the official release's); transformers' is
out_proj(gelu(dense(x))). GELU's identity gelu(u) - gelu(-u) = u makes ours exactly one of
theirs: dense unit 2c computes our logit c, unit 2c + 1 its negation, every other unit 0
(gelu(0) = 0), and out_proj takes unit 2c minus unit 2c + 1. So C outputs need 2C <= hidden
size. The exported model gives our logits up to float rounding; trained further in
transformers it is an ordinary head starting from that point (its dropout after the GELU, which
ours lacks, then acts on the paired units).

Regression (STS-B's 0-5 scale divided by 5 for training) is written on the task's own scale:
transformers' output is our prediction times `label_scale`, what `predict` reports.
"""
import numpy as np

from electra_jax.errors import UserError
from electra_jax.finetune import tasks as tasks_lib
from electra_jax.hf import configs
from electra_jax.hf import weights

SEQUENCE, TOKEN = 'ElectraForSequenceClassification', 'ElectraForTokenClassification'
QUESTION_ANSWERING = 'ElectraForQuestionAnswering'


def architecture(task) -> str:
  if task.kind == tasks_lib.SPAN:
    return QUESTION_ANSWERING
  return TOKEN if task.kind == tasks_lib.TAGGING else SEQUENCE


def check_exportable(task, model_config, config):
  """A UserError naming what transformers' heads cannot hold (config: the run's)."""
  pooling, span_head = config.classifier_pooling, config.span_head
  if task.kind == tasks_lib.TAGGING and config.tag_head != 'transformers':
    raise UserError(f"config.tag_head={config.tag_head!r}: this tagger read every token as "
                    "segment 1, which transformers' ElectraForTokenClassification is not fed "
                    "(segment 0 unless told); fine-tune with --config.tag_head=transformers to "
                    'export, or use python -m electra_jax.predict --workdir=FT_DIR for tags')
  if task.kind == tasks_lib.SPAN and span_head != 'bert':
    raise UserError(f"config.span_head={span_head!r}: this SQuAD head (end given the start, "
                    "answerability) has no transformers class; fine-tune with "
                    "--config.span_head=bert (transformers' ElectraForQuestionAnswering) to "
                    'export, or use python -m electra_jax.predict --workdir=FT_DIR for answers')
  if task.kind not in (tasks_lib.TAGGING, tasks_lib.SPAN) and pooling != 'cls':
    raise UserError(f"config.classifier_pooling={pooling!r}: transformers' ELECTRA classifier "
                    "reads the [CLS] state only; fine-tune with classifier_pooling='cls' to "
                    'export')
  if model_config.relative_attention_span:
    raise UserError(f'relative_attention_span={model_config.relative_attention_span}: '
                    "transformers' ELECTRA has no relative attention bias, so this network "
                    'cannot be exported; use python -m electra_jax.predict --workdir=FT_DIR')
  if (task.kind in (tasks_lib.CLASSIFICATION, tasks_lib.REGRESSION)
      and 2 * task.num_outputs > model_config.hidden_size):
    raise UserError(f'{task.num_outputs} classes need a hidden size of at least '
                    f'{2 * task.num_outputs} to export (transformers\' head holds ours in '
                    f'pairs of units); this network has {model_config.hidden_size}')


def state_dict(params, model_config, task) -> dict[str, np.ndarray]:
  """The transformers state dict (float32 numpy) of a fine-tuned run's params
  {'electra': {'embeddings', 'discriminator': {'encoder'}}, 'head': {'output'}}."""
  state = weights.params_to_hf(params['electra'], model_config, 'discriminator',
                               with_head=False)
  kernel = np.asarray(params['head']['output']['kernel'], np.float32)  # [H, C]
  bias = np.asarray(params['head']['output']['bias'], np.float32)      # [C]
  if task.kind in (tasks_lib.TAGGING, tasks_lib.SPAN):  # SQuAD: columns start, end.
    name = 'qa_outputs' if task.kind == tasks_lib.SPAN else 'classifier'
    state.update({f'{name}.weight': np.ascontiguousarray(kernel.T), f'{name}.bias': bias})
    return state
  hidden, classes = kernel.shape
  dense_w = np.zeros((hidden, hidden), np.float32)  # torch Linear: [out, in]
  dense_b = np.zeros(hidden, np.float32)
  dense_w[0:2 * classes:2], dense_w[1:2 * classes:2] = kernel.T, -kernel.T
  dense_b[0:2 * classes:2], dense_b[1:2 * classes:2] = bias, -bias
  out_w = np.zeros((classes, hidden), np.float32)
  out_w[np.arange(classes), 2 * np.arange(classes)] = task.label_scale
  out_w[np.arange(classes), 2 * np.arange(classes) + 1] = -task.label_scale
  state.update({'classifier.dense.weight': dense_w, 'classifier.dense.bias': dense_b,
                'classifier.out_proj.weight': out_w,
                'classifier.out_proj.bias': np.zeros(classes, np.float32)})
  return state


def config_dict(model_config, task, dropout_rate: float, pad_token_id: int) -> dict:
  """config.json: the discriminator's ElectraConfig plus the task's labels."""
  hf = configs.hf_config_dict(model_config, 'discriminator', pad_token_id)
  hf.update(architectures=[architecture(task)], classifier_dropout=dropout_rate,
            finetuning_task=task.name)
  if task.kind == tasks_lib.SPAN:
    hf['num_labels'] = 2  # qa_outputs: start and end.
    return hf
  names = task.label_names or ('LABEL_0',)  # A regression's one output.
  hf.update(id2label={str(i): name for i, name in enumerate(names)},
            label2id={name: i for i, name in enumerate(names)})
  if task.kind != tasks_lib.TAGGING:
    hf['problem_type'] = ('regression' if task.kind == tasks_lib.REGRESSION
                          else 'single_label_classification')
  return hf
