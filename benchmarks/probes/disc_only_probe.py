"""Discriminator alone on a fixed corruption (issue 3 diagnosis): no generator in the loop.

mode=unigram (default): 15 % of real tokens replaced by draws from the corpus unigram
distribution; mode=dup: replaced by their left neighbour (a purely local task). Trains the demo
discriminator with the project's optimizer and prints the window loss and the exact AUC over
real (non-special) tokens. Options: any demo config key (key=value), pos=sin (sinusoid-
initialised positions), init=F (scale every initial kernel/embedding by F), steps=N, win=N.
Run from the repository root:
    python benchmarks/probes/disc_only_probe.py steps=200 max_seq_length=64 learning_rate=2e-3
"""
import sys, time
sys.path.insert(0, '.')
import numpy as np, jax, jax.numpy as jnp, optax
from configs import demo
from electra_jax import config as config_lib, model as model_lib, optim
from electra_jax.data import tokenizer as tok_lib, pipeline, sources
from electra_jax.objectives.metrics import auc_pair_counts

args = dict(a.split('=') for a in sys.argv[1:])
c = demo.get_config()
for k, v in args.items():
  if k in ('pos', 'steps', 'win', 'mode', 'init'): continue
  old = c[k]
  if old is None: c[k] = int(v)
  elif isinstance(old, bool): c[k] = v == 'true'
  else: c[k] = type(old)(v)
c = config_lib.resolve(c)
steps = int(args.get('steps', 300)); win = int(args.get('win', 50))
tok = tok_lib.load_tokenizer(c.vocab_file, c.vocab_size)
it = pipeline.make_train_iterator(c, tok)
freq = pipeline.count_token_frequencies(c, tok, sources.open_corpus(c, 'train')).astype(np.float64)
logp = jnp.log(jnp.asarray(freq / freq.sum() + 1e-12, jnp.float32))
model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length, c.max_predictions_per_seq)
if args.get('pos') == 'sin':
  pe = params['embeddings']['position_embeddings']
  n, d = pe.shape
  pos = np.arange(n)[:, None]; i = np.arange(d // 2)[None]
  ang = pos / (10000 ** (2 * i / d))
  s = np.concatenate([np.sin(ang), np.cos(ang)], 1) * 0.02
  params['embeddings']['position_embeddings'] = jnp.asarray(s, jnp.float32)
f = float(args.get('init', 1.0))
def scale(path, x):
  n = str(path[-1].key)
  return x * f if n in ('kernel', 'word_embeddings', 'position_embeddings', 'token_type_embeddings') else x
params = jax.tree_util.tree_map_with_path(scale, params)
tx, sched = optim.make_optimizer(c)
opt = tx.init(params)
special = jnp.asarray(sorted(tok.special_ids))

def loss_fn(p, batch, rng):
  ids, mask = batch['input_ids'], batch['input_mask']
  k1, k2 = jax.random.split(rng)
  real = (mask > 0) & ~jnp.isin(ids, special)
  sel = (jax.random.uniform(k1, ids.shape) < c.mask_prob) & real
  draws = jax.random.categorical(k2, logp, shape=ids.shape)
  if args.get('mode') == 'dup':
    draws = jnp.concatenate([ids[:, :1], ids[:, :-1]], 1)
  corrupted = jnp.where(sel, draws, ids)
  labels = (corrupted != ids).astype(jnp.float32)
  logits = model.apply({'params': p}, corrupted, batch['segment_ids'], mask, True,
                       method=model_lib.Electra.discriminator_logits)
  w = (real | (sel & (mask > 0))).astype(jnp.float32)
  l = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * w) / jnp.sum(w)
  return l, auc_pair_counts(logits, labels, w)

@jax.jit
def step(p, o, batch, rng):
  (l, auc), g = jax.value_and_grad(loss_fn, has_aux=True)(p, batch, rng)
  u, o = tx.update(g, o, p)
  return optax.apply_updates(p, u), o, l, auc

rng = jax.random.key(1)
acc = [0., 0., 0.]; t0 = time.time(); out = []
for s in range(1, steps + 1):
  b = {k: jnp.asarray(v) for k, v in next(it).items()}
  params, opt, l, (num, den) = step(params, opt, b, jax.random.fold_in(rng, s))
  acc[0] += float(l); acc[1] += float(num); acc[2] += float(den)
  if s % win == 0:
    out.append(round(acc[1] / acc[2], 3))
    print(f'step {s} loss {acc[0]/win:.4f} auc {acc[1]/acc[2]:.3f} t {time.time()-t0:.0f}s', flush=True)
    acc = [0., 0., 0.]
print('RESULT', ' '.join(sys.argv[1:]), out, flush=True)
