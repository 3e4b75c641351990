"""The same 2-layer demo discriminator in HF transformers + PyTorch on the 'duplicate' probe.

15 % of real tokens are replaced by their left neighbour; the model must flag them (a purely
local task). Prints window loss and AUC every 25 steps. Needs the test extra (torch,
transformers). Run from the repository root:
    python benchmarks/probes/hf_duplicate_probe.py [lr=1e-3] [eps=1e-6] [steps=200]
"""
import sys; sys.path.insert(0, '.')
import numpy as np, torch
from transformers import ElectraConfig, ElectraForPreTraining
from scipy.stats import rankdata
from configs import demo
from electra_jax import config as config_lib
from electra_jax.data import tokenizer as tok_lib, pipeline
args = dict(a.split('=') for a in sys.argv[1:])
c = demo.get_config(); c.max_seq_length = 64
c = config_lib.resolve(c)
tok = tok_lib.load_tokenizer(c.vocab_file, c.vocab_size)
it = pipeline.make_train_iterator(c, tok)
torch.manual_seed(0)
cfg = ElectraConfig(vocab_size=c.vocab_size, embedding_size=128, hidden_size=128, num_hidden_layers=2,
  num_attention_heads=2, intermediate_size=512, hidden_dropout_prob=0., attention_probs_dropout_prob=0.)
m = ElectraForPreTraining(cfg)
lr = float(args.get('lr', 1e-3)); eps = float(args.get('eps', 1e-6))
opt = torch.optim.AdamW(m.parameters(), lr=lr, eps=eps, weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s+1)/50) * max(0, 1 - s/800))
def roc_auc_score(y, s):
  y = y > 0.5; r = rankdata(s); npos = y.sum(); nneg = len(y) - npos
  return (r[y].sum() - npos * (npos + 1) / 2) / (npos * nneg)
special = np.array(sorted(tok.special_ids)); rng = np.random.default_rng(0)
L, Y, S = [], [], []
for s in range(1, int(args.get('steps', 200)) + 1):
  b = next(it); ids, mask = b['input_ids'], b['input_mask']
  real = (mask > 0) & ~np.isin(ids, special)
  sel = (rng.random(ids.shape) < 0.15) & real
  prev = np.concatenate([ids[:, :1], ids[:, :-1]], 1)
  cor = np.where(sel, prev, ids); lab = (cor != ids).astype(np.float32)
  out = m(input_ids=torch.tensor(cor), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(b['segment_ids']))
  logits = out.logits
  w = torch.tensor(mask, dtype=torch.float32)
  loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(lab), reduction='none') * w).sum() / w.sum()
  opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); sched.step()
  msk = mask.ravel() > 0
  Y.append(lab.ravel()[msk]); S.append(logits.detach().numpy().ravel()[msk]); L.append(loss.item())
  if s % 25 == 0:
    print(s, np.mean(L), roc_auc_score(np.concatenate(Y), np.concatenate(S)), flush=True); L, Y, S = [], [], []
