"""CoNLL-2003 from TFDS: NER by default (--config.task=conll2003_chunk for chunking,
conll2003_pos for part-of-speech tags), picked on dev with test reported too.

  python -m electra_jax.finetune --config=configs/finetune/conll2003.py \
      --config.init_checkpoint=WORKDIR --workdir=FT_DIR

It reads no files: your own copy of CoNLL-2003 (or any CoNLL-format set) goes with
configs/finetune/tagging.py and --config.train_file / eval_file.
"""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.task = 'conll2003'
  return c
