"""ELECTRA-Large with the paper's pretraining hyper-parameters (ELECTRA.md, Table 6).

400k steps as in the paper's ELECTRA-Large-400k; `--config.num_train_steps=1750000` for the
long run. Data keys stay on the bundled demo corpus and vocabulary; point `train_files`,
`vocab_file` and `vocab_size` at your own (the paper used the 30,522-token BERT WordPiece vocab).
"""
from configs import base_config


def get_config():
  c = base_config.get_config()
  c.model_size = 'large'            # 24 layers, H 1024, FFN 4096, 16 heads, E 1024
  c.generator_hidden_size = 0.25
  c.mask_prob = 0.25
  c.learning_rate = 2e-4
  c.train_batch_size = 2048
  c.max_seq_length = 512
  c.num_train_steps = 400_000
  c.num_warmup_steps = 10_000
  return c
