"""ELECTRA-Small++, the recipe of the released google/electra-small-* models: ELECTRA-Small
(configs/small.py) with a generator as wide as the discriminator, on 512-token sequences, for
4M steps. Pretrain this to compare with the released Small, or to continue its recipe on your
own language; the paper's Small (generator 1/4, 128 tokens, 1M steps) is configs/small.py.

Sources: the official README (for the released Small "we did not use a small generator", and
it "has already been trained for 4e6 steps"); google-research/electra issues 39 and 68 (the
released Small and Base are the paper's "++" models, the Small generator as wide as its
discriminator). The 512-token sequences are as KoELECTRA-Small reproduced Small++, not from the
official code. The paper trained the ++ models on XLNet's corpus, not public: point
`train_files`, `vocab_file` and `vocab_size` at yours, as for configs/small.py.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.generator_hidden_size = 1.0     # A 12 x 256 generator, as the released one.
  c.max_seq_length = 512
  c.num_train_steps = 4_000_000
  return c
