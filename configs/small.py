"""ELECTRA-Small with the paper's pretraining hyper-parameters (ELECTRA.md, Table 6).

Data keys stay on the bundled demo corpus and vocabulary; point `train_files`, `vocab_file`
and `vocab_size` at your own (the paper used the 30,522-token BERT uncased WordPiece vocab).
"""
from configs import base_config


def get_config():
  c = base_config.get_config()
  c.model_size = 'small'            # 12 layers, H 256, FFN 1024, 4 heads, E 128
  c.generator_hidden_size = 0.25
  c.mask_prob = 0.15
  c.learning_rate = 5e-4
  c.train_batch_size = 128
  c.max_seq_length = 128
  c.num_train_steps = 1_000_000
  c.num_warmup_steps = 10_000
  # 100 steps a call of the compiled program (the same weights as 1): Small's step is short
  # enough that the host's per-call work bound it. H100, bundled corpus, bf16 (RESULTS.md,
  # sessions 19 and 22): 22.0 ms a step at 1 a call, 14.4 ms at 100 (the kernels' pace).
  # Calls still end at every log, evaluation and save (their intervals are multiples of 100).
  c.steps_per_execution = 100
  return c
