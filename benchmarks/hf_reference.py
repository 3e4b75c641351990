"""The ELECTRA pretraining step written with HF transformers + PyTorch: the benchmark's yardstick.

Same model, objective and optimizer as electra_jax, as a PyTorch user would write it with the
stock HF modules: ElectraForMaskedLM (generator) + ElectraForPreTraining (discriminator) sharing
one ElectraEmbeddings module (token, position, token-type tables and their LayerNorm), the MLM
output tied to the token embeddings; dynamic masking of exactly clip(round(0.15·n), 1, P)
positions per row (85 % [MASK], 15 % kept), Gumbel-max sampling of replacements under no_grad,
labels = sample != original, loss = MLM + 50·RTD, AdamW (ε 1e-6, weight decay 0.01 off
LayerNorm/biases), warmup + linear decay, gradient clipping at 1.0, dropout as configured.
Dtype policy: float32 on CPU; bf16 autocast + SDPA attention on CUDA; float32 on CUDA with
TF32 matmuls, as JAX's default precision computes ours (full float32 where
jax_default_matmul_precision asks for it; electra_jax/chips.py), so both rows share one peak.

`gather=True` runs the generator's encoder, gathers the masked positions, then its prediction
head and LM head (logits only where they are used, as electra_jax does); `gather=False` calls
ElectraForMaskedLM as is (logits at every position) and gathers the logits afterwards.

Used by `python -m electra_jax.benchmark --compare=hf[,hf_full]`, which refuses a config
whose step this one does not implement (`check_config`); needs the `bench` extra.
"""
import time

import jax
import numpy as np
import torch
import transformers
from torch import nn
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

from electra_jax import chips
from electra_jax import config as config_lib
from electra_jax.errors import UserError

# The config values this step implements; any other value is a step it does not take (another
# objective, weight sharing, masking, sampling, optimizer or execution), so no fair yardstick.
IMPLEMENTS = {
    'objective': 'electra', 'tie': 'embeddings', 'uniform_generator': False,
    'relative_attention_span': 0, 'whole_word_masking': False, 'mask_with_replacement': False,
    'random_token_prob': 0.0, 'disallow_correct': False, 'generator_lr_multiplier': 1.0,
    'lr_decay_power': 1.0, 'warmup_times_decay': False, 'adam_bias_correction': True,
    'grad_accum_steps': 1, 'remat': 'none',
}


def check_config(c, flag: str, num_devices: int, platform: str):
  """UserError naming the first key of resolved config `c` this step does not implement (or
  a multi-device accelerator run: the reference takes one device); `flag` is what to drop."""
  for key, value in IMPLEMENTS.items():
    if c[key] != value:
      raise UserError(f'{flag}: config.{key}={c[key]!r} is not what the HF reference '
                      f'(benchmarks/hf_reference.py) implements ({value!r}), so it would time '
                      f'another step; drop {flag} or set --config.{key}={value}')
  if platform != 'cpu' and num_devices > 1:
    raise UserError(f'{flag}: the HF reference runs on one {platform} device, electra_jax here '
                    f'on {num_devices}; drop {flag} or run on one device (e.g. '
                    'CUDA_VISIBLE_DEVICES=0)')


def hf_configs(c, attn_implementation: str = 'sdpa'):
  """(generator, discriminator) ElectraConfigs for a resolved electra_jax config."""
  gen = config_lib.generator_sizes(c)
  common = dict(vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_act='gelu',
                hidden_dropout_prob=c.dropout_rate,
                attention_probs_dropout_prob=c.attention_dropout_rate,
                max_position_embeddings=c.max_position_embeddings,
                type_vocab_size=c.type_vocab_size, layer_norm_eps=1e-12, pad_token_id=0)
  g = ElectraConfig(hidden_size=gen['hidden_size'], num_attention_heads=gen['num_heads'],
                    intermediate_size=gen['intermediate_size'],
                    num_hidden_layers=gen['num_layers'], **common)
  d = ElectraConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_heads,
                    intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
                    **common)
  for cfg in (g, d):
    cfg._attn_implementation = attn_implementation  # pylint: disable=protected-access
  return g, d


class ElectraPretrainer(nn.Module):
  """Generator + discriminator over one shared embedding module; forward returns the loss."""

  def __init__(self, c, special_ids, mask_id: int, gather: bool = True):
    super().__init__()
    g_cfg, d_cfg = hf_configs(c)
    self.generator = ElectraForMaskedLM(g_cfg)
    self.discriminator = ElectraForPreTraining(d_cfg)
    # Tie: one embeddings module for both networks, and the MLM output = token embeddings.
    embeddings = self.generator.electra.embeddings
    self.discriminator.electra.embeddings = embeddings
    self.generator.generator_lm_head.weight = embeddings.word_embeddings.weight
    self.register_buffer('special_ids', torch.tensor(sorted(special_ids)), persistent=False)
    self.mask_id, self.gather = mask_id, gather
    self.mask_prob, self.max_predictions = c.mask_prob, c.max_predictions_per_seq
    self.mask_token_prob, self.temperature = c.mask_token_prob, c.temperature
    self.gen_weight, self.disc_weight = c.gen_weight, c.disc_weight

  def mask(self, input_ids, input_mask):
    """Exactly clip(round(n_real · p), 1, P) random real non-special positions per row."""
    real = input_mask.bool()
    candidates = real & ~torch.isin(input_ids, self.special_ids)
    num = torch.clamp(torch.round(real.sum(-1).float() * self.mask_prob).long(), 1,
                      self.max_predictions)
    scores = torch.where(candidates, torch.rand(input_ids.shape, device=input_ids.device),
                         torch.full_like(input_ids, -1, dtype=torch.float))
    top, positions = torch.topk(scores, self.max_predictions, dim=-1)
    slot = torch.arange(self.max_predictions, device=input_ids.device)[None]
    weights = (slot < num[:, None]) & (top >= 0)
    positions = torch.where(weights, positions, torch.zeros_like(positions))
    original = torch.gather(input_ids, 1, positions)
    keep = torch.rand(positions.shape, device=input_ids.device) >= self.mask_token_prob
    replacement = torch.where(keep, original, torch.full_like(original, self.mask_id))
    return positions, original, weights, replacement

  @staticmethod
  def scatter(ids, positions, values, weights):
    # Unused slots write their own current value back, so they can never clobber a real one.
    values = torch.where(weights, values, torch.gather(ids, 1, positions))
    return ids.scatter(1, positions, values)

  def generator_logits(self, masked_ids, input_mask, segment_ids, positions):
    if not self.gather:
      logits = self.generator(input_ids=masked_ids, attention_mask=input_mask,
                              token_type_ids=segment_ids).logits
      return torch.gather(logits, 1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    hidden = self.generator.electra(input_ids=masked_ids, attention_mask=input_mask,
                                    token_type_ids=segment_ids).last_hidden_state
    hidden = torch.gather(hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    return self.generator.generator_lm_head(self.generator.generator_predictions(hidden))

  def forward(self, input_ids, input_mask, segment_ids):
    positions, original, weights, replacement = self.mask(input_ids, input_mask)
    masked_ids = self.scatter(input_ids, positions, replacement, weights)
    logits = self.generator_logits(masked_ids, input_mask, segment_ids, positions).float()
    w = weights.float()
    mlm = nn.functional.cross_entropy(logits.flatten(0, 1), original.flatten(),
                                      reduction='none').view_as(w)
    mlm_loss = (mlm * w).sum() / (w.sum() + 1e-6)
    with torch.no_grad():  # Samples are constants: no gradient from D's loss into G.
      u = torch.rand(logits.shape, device=logits.device)
      gumbel = -torch.log(-torch.log(u + 1e-9) + 1e-9)
      sampled = torch.argmax(logits / self.temperature + gumbel, dim=-1)
      corrupted = self.scatter(input_ids, positions, sampled, weights)
      real = input_mask.float()
      labels = (corrupted != input_ids).float() * real
    disc_logits = self.discriminator(input_ids=corrupted, attention_mask=input_mask,
                                     token_type_ids=segment_ids).logits.float()
    disc = nn.functional.binary_cross_entropy_with_logits(disc_logits, labels, reduction='none')
    disc_loss = (disc * real).sum() / (real.sum() + 1e-6)
    return self.gen_weight * mlm_loss + self.disc_weight * disc_loss


def make_optimizer(model: nn.Module, c):
  """AdamW with weight decay off LayerNorm and biases, warmup + linear decay to 0."""
  decay, no_decay = [], []
  for name, p in model.named_parameters():  # Shared tensors are listed once.
    (no_decay if name.endswith('bias') or 'LayerNorm' in name else decay).append(p)
  opt = torch.optim.AdamW([{'params': decay, 'weight_decay': c.weight_decay_rate},
                           {'params': no_decay, 'weight_decay': 0.0}],
                          lr=c.learning_rate, betas=(c.adam_b1, c.adam_b2), eps=c.adam_epsilon)
  warm, total = c.num_warmup_steps, c.num_train_steps

  def factor(step):
    return (step / warm if step < warm else 1.0 - step / total) if warm else 1.0 - step / total

  return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


class Trainer:
  """One pretraining step on a fixed device and dtype policy."""

  def __init__(self, c, special_ids, mask_id, device: str, gather: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    self.c, self.device = c, torch.device(device)
    self.model = ElectraPretrainer(c, special_ids, mask_id, gather).to(self.device).train()
    self.opt, self.schedule = make_optimizer(self.model, c)
    self.autocast = self.device.type == 'cuda' and c.dtype == 'bfloat16'
    if self.device.type == 'cuda':
      tf32 = jax.config.jax_default_matmul_precision not in chips.FULL_FLOAT32
      torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32

  def step(self, input_ids, input_mask, segment_ids) -> torch.Tensor:
    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
      loss = self.model(input_ids, input_mask, segment_ids)
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    if self.c.max_grad_norm > 0:
      nn.utils.clip_grad_norm_(self.model.parameters(), self.c.max_grad_norm)
    self.opt.step()
    self.schedule.step()
    return loss.detach()

  def sync(self):
    if self.device.type == 'cuda':
      torch.cuda.synchronize(self.device)

  def to_device(self, batch):
    return [torch.as_tensor(np.asarray(batch[k]), dtype=torch.long, device=self.device)
            for k in ('input_ids', 'input_mask', 'segment_ids')]


class ReferenceStep:
  """The benchmark's view: a Trainer on the batch, on the device matching JAX's platform."""

  def __init__(self, c, batch, *, gather: bool, special_ids, mask_id, platform: str):
    if platform == 'gpu' and not torch.cuda.is_available():
      raise RuntimeError('JAX runs on GPU but this torch has no CUDA: install a CUDA torch wheel')
    device = 'cuda' if platform == 'gpu' else 'cpu'
    self.trainer = Trainer(c, special_ids, mask_id, device, gather, c.seed)
    self.inputs = self.trainer.to_device(batch)
    if device == 'cuda':
      torch.cuda.reset_peak_memory_stats()
    # pylint: disable-next=protected-access
    attn = self.trainer.model.discriminator.config._attn_implementation
    self.versions = dict(torch=torch.__version__, transformers=transformers.__version__,
                         attention=attn, threads=torch.get_num_threads())
    self.description = (
        f'HF transformers {transformers.__version__} + torch {torch.__version__} on {device}, '
        f'{torch.get_num_threads()} threads, attention {attn}, '
        f'{"bf16 autocast" if self.trainer.autocast else "float32"}, generator logits '
        f'{"at masked positions only" if gather else "at every position"}')

  def run(self, steps: int) -> tuple[list[float], list[float]]:
    """Times `steps` blocking steps; returns (seconds per step, losses)."""
    times, losses = [], []
    for _ in range(steps):
      t = time.perf_counter()
      loss = self.trainer.step(*self.inputs)
      self.trainer.sync()
      times.append(time.perf_counter() - t)
      losses.append(float(loss))
    return times, losses

  def peak_memory_bytes(self):
    """CUDA allocator peak; None on CPU (the process RSS is shared with the JAX run)."""
    return torch.cuda.max_memory_allocated() if self.trainer.device.type == 'cuda' else None
