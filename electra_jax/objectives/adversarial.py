"""Adversarial ELECTRA (paper section 3.2 and appendix F): the generator is trained to maximise
the discriminator's loss instead of by maximum likelihood; the discriminator trains as in
ELECTRA. The paper's generator reaches 58 % MLM accuracy (65 % by maximum likelihood) and does
not beat ELECTRA downstream (its Figure 3).

G's samples are discrete, so it learns by REINFORCE, with the paper's simplification that D's
verdict on a position depends on the token there and the unmasked tokens only: the reward R_t of
masked position t is D's RTD loss at t, and G descends

  -(R_t - b_t) * log q_G(x̂_t | x_masked),   b_t = -log sigmoid(w · h_G(x_masked)_t),

q_G being the distribution the sample was drawn from (G's softmax with config.temperature and
disallow_correct applied), averaged over the masked positions like the MLM loss. The baseline
b is a head on G's encoder outputs, "trained with cross-entropy to match the reward":
sigmoid(w · h) is fitted to exp(-R_t), D's probability of the right label, so b estimates
-log E[exp(-R)] (<= E[R]).
Rewards and advantages carry no gradient. loss = gen_weight * (policy + baseline losses)
+ disc_weight * RTD; G's maximum-likelihood loss is only reported (mlm_loss, mlm_accuracy).
"""
import jax
import jax.numpy as jnp
import optax

from electra_jax.errors import UserError
from electra_jax.objectives import base
from electra_jax.objectives import electra


class Adversarial(electra.Electra):
  name = 'adversarial'
  layout = base.Layout(generator=True, rtd_head=True, mlm_head=False, generator_baseline=True)

  @classmethod
  def validate(cls, c):
    super().validate(c)
    if c.uniform_generator:
      raise UserError("config.uniform_generator=True has no generator for objective "
                      "'adversarial' to train; set it False or use objective 'electra'")
    if c.tie == 'all':
      raise UserError("config.tie='all' runs the generator on the discriminator's encoder, "
                      "which objective 'adversarial' would then train to raise the "
                      "discriminator's own loss; use tie='embeddings' or 'none'")

  def generator_loss(self, s: base.Step, g: base.Corruption, disc_losses):
    m = s.masked
    # The token D saw at each masked slot (a position drawn twice holds its first sample).
    sampled = jnp.take_along_axis(g.corrupted, m.masked_positions, axis=1)
    rewards = jnp.take_along_axis(disc_losses, m.masked_positions, axis=1)
    log_q = base.sample_log_probs(g.gen_logits, sampled, m.masked_lm_ids, self.temperature,
                                  self.disallow_correct)
    policy, baseline = policy_gradient_losses(log_q, rewards, g.baseline_logits)
    count = s.denominators['mlm_count']
    gen_loss = (base.weighted_mean(policy, m.masked_weights, count)
                + base.weighted_mean(baseline, m.masked_weights, count))
    return gen_loss, dict(reward_sum=jnp.sum(rewards * m.masked_weights),
                          baseline_loss_sum=jnp.sum(baseline * m.masked_weights))


def policy_gradient_losses(log_q, rewards, baseline_logits):
  """Per masked slot [B, P]: (REINFORCE's -(R - b) log q(sample), q the distribution the
  sample was drawn from (temperature and disallow_correct applied), the baseline's
  cross-entropy against exp(-R)). Gradients reach the generator's logits and the baseline head
  only."""
  rewards = jax.lax.stop_gradient(rewards)
  advantage = jax.lax.stop_gradient(rewards + jax.nn.log_sigmoid(baseline_logits))
  return (-advantage * log_q,
          optax.sigmoid_binary_cross_entropy(baseline_logits, jnp.exp(-rewards)))
