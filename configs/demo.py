"""A tiny ELECTRA on the bundled Jane Austen corpus: learns visibly in minutes on a laptop CPU.

Same objective and hyper-parameter recipe as the paper, shrunk: a 'demo'-size model (see
electra_jax/config.py), short warmup, frequent logging, evaluation and checkpoints.
"""
from configs import base_config


def get_config():
  c = base_config.get_config()
  c.model_size = 'demo'
  c.generator_hidden_size = 0.5
  c.learning_rate = 2e-3
  c.train_batch_size = 32
  c.eval_batch_size = 64
  c.max_seq_length = 128
  c.num_train_steps = 1500
  c.num_warmup_steps = 150
  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.num_eval_steps = 10
  c.save_checkpoints_steps = 500
  c.keep_checkpoint_max = 2
  return c
