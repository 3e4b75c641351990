"""How much a pure bigram detector gets on the demo discriminator's task (issue 3 diagnosis).

Counts bigrams over 90 % of the demo training examples, replaces 15 % of the real tokens of
2,000 held-out examples with draws from the unigram distribution, scores each token by minus
its PMI with both neighbours, and prints the ROC AUC. Run from the repository root:
    python benchmarks/probes/bigram_ceiling.py
"""
import sys; sys.path.insert(0, '.')
import numpy as np
from configs import demo
from electra_jax import config as config_lib
from electra_jax.data import tokenizer as tok_lib, pipeline
from scipy.stats import rankdata
c = config_lib.resolve(demo.get_config())
tok = tok_lib.load_tokenizer(c.vocab_file, c.vocab_size)
ex = pipeline.build_train_examples(c, tok)
ids, mask = ex['input_ids'], ex['input_mask']
print(ids.shape, mask.mean())
V = c.vocab_size
n = len(ids); tr, te = ids[: int(n*.9)], ids[int(n*.9):]; mte = mask[int(n*.9):]
big = np.zeros((V, V), np.float32)
for row in tr:
  np.add.at(big, (row[:-1], row[1:]), 1)
uni = np.bincount(tr.ravel(), minlength=V).astype(np.float64); uni[:5] = 0
p = uni / uni.sum()
rng = np.random.default_rng(0)
te = te[:2000]; mte = mte[:2000]
special = np.isin(te, list(tok.special_ids))
sel = (rng.random(te.shape) < 0.15) & (mte > 0) & ~special
cor = np.where(sel, rng.choice(V, size=te.shape, p=p), te)
lab = (cor != te)
k = 0.1
row_tot = big.sum(1) + k * V; col_tot = big.sum(0) + k * V
def lp_next(a, b):  # log P(b | a) - log P(b)
  return np.log((big[a, b] + k) / row_tot[a]) - np.log(col_tot[b] / col_tot.sum())
score = np.zeros(te.shape)
score[:, 1:] -= lp_next(cor[:, :-1], cor[:, 1:])
score[:, :-1] -= lp_next(cor[:, :-1], cor[:, 1:])
w = (mte > 0).ravel()
y, s = lab.ravel()[w], score.ravel()[w]
r = rankdata(s); npos = y.sum(); nneg = len(y) - npos
print('bigram PMI AUC', (r[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))
