"""A tiny transformers ELECTRA generator + discriminator pair with random weights, built the way
the released google/electra-* directories are laid out (what `hf download` would fetch), but
offline: a WordPiece vocabulary trained on the bundled corpus with the `tokenizers` library,
models and tokenizer saved with save_pretrained."""
import os

from tests.conftest import REPO_ROOT

SPECIAL_TOKENS = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
# Discriminator and generator sizes (the generator: half the width, as a fraction our model
# holds); 64 positions fit the tests' 32-token sequences.
SIZES = dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=64)
GENERATOR_SIZES = dict(SIZES, hidden_size=16, num_attention_heads=1, intermediate_size=32)
CORPUS = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train', 'northanger_abbey.txt')


def wordpiece_vocab(directory: str, vocab_size: int = 600) -> str:
  """An uncased WordPiece vocab.txt trained on one bundled novel; returns its path. Its special
  tokens sit as in the released BERT/ELECTRA vocabulary, away from ids 0..4 (there: [PAD] 0,
  [unused*] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103; here [PAD] 0, [unused0-9] 1-10,
  [UNK] 11, [CLS] 12, [SEP] 13, [MASK] 14), so code that assumes sentencepiece's fixed ids
  fails the tests."""
  # pylint: disable=import-outside-toplevel
  from tokenizers.implementations import BertWordPieceTokenizer
  tokenizer = BertWordPieceTokenizer(lowercase=True)
  tokenizer.train(files=[CORPUS], vocab_size=vocab_size - 10, special_tokens=SPECIAL_TOKENS,
                  show_progress=False)
  os.makedirs(directory, exist_ok=True)
  trained = tokenizer.save_model(directory)[0]
  with open(trained, encoding='utf-8') as f:
    tokens = [t for t in f.read().split('\n') if t and t not in SPECIAL_TOKENS]
  layout = ['[PAD]'] + [f'[unused{i}]' for i in range(10)] + SPECIAL_TOKENS[1:] + tokens
  path = os.path.join(directory, 'vocab.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(layout) + '\n')
  return path


def save_pair(discriminator_dir: str, generator_dir: str, vocab_file: str, seed: int = 0,
              shared_embeddings: bool = True, with_vocab_txt: bool = True,
              generator_layers: int | None = None):
  """Random ElectraForPreTraining + ElectraForMaskedLM saved with save_pretrained, each with the
  tokenizer. Every weight is perturbed (transformers starts biases at 0 and LayerNorms at 1), so
  a misplaced bias cannot hide. shared_embeddings: the generator holds the discriminator's
  embedding tables, as in the released pairs. with_vocab_txt: also a vocab.txt, as the released
  directories have (transformers 5's save_pretrained writes only tokenizer.json).
  generator_layers: a generator shallower than the discriminator (default: as deep)."""
  # pylint: disable=import-outside-toplevel
  import shutil
  import torch
  import transformers
  torch.manual_seed(seed)
  with open(vocab_file, encoding='utf-8') as f:
    vocab_size = len(f.read().split('\n')) - 1
  models = {
      discriminator_dir: transformers.ElectraForPreTraining(
          transformers.ElectraConfig(vocab_size=vocab_size, **SIZES)),
      generator_dir: transformers.ElectraForMaskedLM(
          transformers.ElectraConfig(vocab_size=vocab_size, **dict(
              GENERATOR_SIZES, num_hidden_layers=generator_layers
              or GENERATOR_SIZES['num_hidden_layers']))),
  }
  with torch.no_grad():
    for model in models.values():
      for p in model.parameters():
        p.add_(0.05 * torch.randn_like(p))
    if shared_embeddings:
      models[generator_dir].electra.embeddings.load_state_dict(
          models[discriminator_dir].electra.embeddings.state_dict())
  tokenizer = transformers.ElectraTokenizerFast(
      vocab={line.rstrip('\n'): i for i, line in enumerate(open(vocab_file, encoding='utf-8'))},
      do_lower_case=True)
  for directory, model in models.items():
    model.eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if with_vocab_txt:
      shutil.copyfile(vocab_file, os.path.join(directory, 'vocab.txt'))
  return models[discriminator_dir], models[generator_dir]
