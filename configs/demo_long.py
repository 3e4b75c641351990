"""The demo's recipe for up to an hour on a 2-core CPU: 6,000 steps (24.6M tokens).

  python -m electra_jax.train --config=configs/demo_long.py --workdir=/tmp/electra_demo_long

Same model and keys as configs/demo.py (relative_attention_span=8, learning_rate 1e-3; see
its docstring), with the schedule stretched (a 300-step warmup and linear decay over 6,000
steps, evaluation and checkpoints every 1,000) and a slower generator:
generator_lr_multiplier=0.25. At the demo's full generator speed the held-out AUC flattens at
0.70 while the generator climbs to MLM accuracy 0.36; a quarter of its learning rate keeps it
behind the discriminator (benchmarks/RESULTS.md, issue 19). The optional argument names
another objective on the same recipe, e.g. `configs/demo_long.py:mlm` for the BERT baseline
that `experiments.compare` runs against it at equal FLOPs (README "What to expect from the
demo"); objectives without a generator ignore generator_lr_multiplier.
"""
from configs import demo


def get_config(objective: str = 'electra'):
  c = demo.get_config(objective)
  c.generator_lr_multiplier = 0.25
  c.num_train_steps = 6000
  c.num_warmup_steps = 300
  c.log_every_steps = 100
  c.eval_every_steps = 1000
  c.save_checkpoints_steps = 1000
  return c
