"""A tiny ELECTRA on the bundled Jane Austen corpus: trains in about five minutes on a laptop CPU.

Same objective and recipe as the paper, shrunk: a 'demo'-size model (2 layers, H 128; see
electra_jax/config.py) with a 1/4-width generator, a short warmup, no dropout (a few hundred
steps on a small model do not need it, and it costs CPU time), frequent logging, evaluation
and checkpoints.
"""
from configs import base_config


def get_config():
  c = base_config.get_config()
  c.model_size = 'demo'
  c.generator_hidden_size = 0.25
  c.dropout_rate = 0.0
  c.attention_dropout_rate = 0.0
  c.learning_rate = 5e-4
  c.train_batch_size = 32
  c.eval_batch_size = 64
  c.max_seq_length = 128
  c.num_train_steps = 800
  c.num_warmup_steps = 100
  c.log_every_steps = 50
  c.eval_every_steps = 200
  c.num_eval_steps = 10
  c.save_checkpoints_steps = 200
  c.keep_checkpoint_max = 2
  return c
