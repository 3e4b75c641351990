"""The pretraining objectives behind one registry: config.objective names the class.

Each objective is one module (a base.Objective subclass) holding everything about it: its
params layout, loss and metrics, config checks, optimizer hook, FLOPs and whether export
supports it. A new objective is one module plus one line in OBJECTIVES.
"""
from electra_jax.objectives import adversarial
from electra_jax.objectives import all_tokens_mlm
from electra_jax.objectives import base
from electra_jax.objectives import electra
from electra_jax.objectives import electra_15
from electra_jax.objectives import electric
from electra_jax.objectives import mlm
from electra_jax.objectives import replace_mlm
from electra_jax.objectives import two_stage

OBJECTIVES: dict[str, type[base.Objective]] = {cls.name: cls for cls in (
    electra.Electra,
    mlm.MaskedLM,
    electra_15.Electra15,
    replace_mlm.ReplaceMLM,
    all_tokens_mlm.AllTokensMLM,
    two_stage.TwoStage,
    electric.Electric,
    adversarial.Adversarial,
)}


def get(name: str) -> type[base.Objective]:
  """The objective class config.objective names (config.resolve has checked the name)."""
  return OBJECTIVES[name]


def build(model, c, special_ids, mask_id, word_kinds=None) -> base.Objective:
  """The config's objective over `model` (model.Electra) and the tokenizer's special ids (and
  its word_kinds(), for config.whole_word_masking)."""
  return get(c.objective).from_config(model, c, special_ids, mask_id, word_kinds)


def build_for_vocabulary(model, c, tokenizer) -> base.Objective:
  """build() with `tokenizer`'s special ids and, for config.whole_word_masking, its words."""
  word_kinds = tokenizer.word_kinds() if c.whole_word_masking else None
  return build(model, c, tokenizer.special_ids, tokenizer.mask_id, word_kinds)
