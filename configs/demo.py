"""A tiny ELECTRA on the bundled Jane Austen corpus: five to seven minutes on a 2-core CPU.

The paper's objective, shrunk to a 'demo'-size model (2 layers, H 128; see
electra_jax/config.py) with a 1/4-width generator, a short warmup, no dropout (a few hundred
steps on a small model do not need it, and it costs CPU time), frequent logging, evaluation and
checkpoints. Two keys differ from the paper's recipe because a few CPU minutes need them
(README "What to expect from the demo"; the study is in benchmarks/RESULTS.md, issue 19):
- relative_attention_span=8: a learned attention bias by key-query offset, starting as a local
  window. With the paper's absolute positions alone, a 2-layer discriminator's attention stays
  uniform for thousands of steps and its held-out AUC sits at 0.52-0.53; with it, 0.63 at 800
  steps. Not the paper's architecture, so this demo cannot be exported to transformers:
  `--config.relative_attention_span=0` trains the paper's (exportable) network.
- learning_rate 1e-3 (paper's Small: 5e-4): a short run needs the larger steps.
Ten steps a call of the compiled program (steps_per_execution): the same training as one a
call (the weights to float32 rounding), and on a 2-core CPU 1.4x the steps/s of one a call in
the benchmark, 1.25-1.38x the demo's tokens/s (benchmarks/RESULTS.md, session 20).
The optional argument names another objective on the same recipe, e.g. `configs/demo.py:mlm`
for the BERT baseline (README "What to expect from the demo"); objectives without a
generator ignore its keys.
"""
from configs import base_config


def get_config(objective: str = 'electra'):
  c = base_config.get_config()
  c.objective = objective
  c.model_size = 'demo'
  c.generator_hidden_size = 0.25
  c.relative_attention_span = 8
  c.dropout_rate = 0.0
  c.attention_dropout_rate = 0.0
  c.learning_rate = 1e-3
  c.train_batch_size = 32
  c.eval_batch_size = 64
  c.max_seq_length = 128
  c.num_train_steps = 1200
  c.num_warmup_steps = 100
  c.log_every_steps = 50
  c.eval_every_steps = 200
  c.num_eval_steps = 10
  c.save_checkpoints_steps = 200
  c.steps_per_execution = 10
  c.keep_checkpoint_max = 2
  return c
