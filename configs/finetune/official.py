"""GLUE fine-tuning with the official release's exact optimisation and data (configure_finetuning
and model/optimization.py), where this framework's defaults differ:

  python -m electra_jax.finetune --config=configs/finetune/official.py --config.task=mrpc \
      --config.init_checkpoint=WORKDIR --workdir=FT_DIR

Adam without bias correction, the decay running during warmup, the batch's loss summed, the
official layer-wise decay exponents, MRPC and STS-B in both sentence orders, the task head
started Glorot-uniform, for SQuAD (--config.task=squad_v2 --config.max_seq_length=512) the
official span head, and for tagging (--config.task=conll2003, or task=tagging with your files)
the span tags re-encoded BIOES and its head (no dropout, segment id 1). Where the official
code's defaults leave the paper, this keeps the paper's: Small fine-tunes at 3e-4 (1e-4 there:
--config.learning_rate=1e-4), and chunking at 128 tokens (256 there: --config.max_seq_length=256).
One difference stays: a tagged sentence longer than max_seq_length pieces is read in windows
(doc_stride), where the official code cuts it.
"""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.update(dict(adam_bias_correction=False, warmup_times_decay=True, loss_reduction='sum',
                official_layerwise_decay=True, double_unordered=True, head_init='glorot',
                span_head='official', tag_encoding='bioes', tag_head='official'))
  return c
