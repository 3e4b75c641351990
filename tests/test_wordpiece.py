"""WordPiece vocab.txt tokenization equals BERT's reference tokenizer; arbitrary special ids."""
import collections
import os
import re

import jax
import numpy as np
import pytest

from electra_jax import masking
from electra_jax.data import sources
from electra_jax.data import tokenizer as tok
from electra_jax.data import wordpiece
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT
from tests.test_data import assert_well_formed, build_examples

PERSUASION = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt')
# Accents, CJK, control characters, punctuation runs, numbers, a 120-character word, emoji,
# mixed case, tabs and non-breaking / zero-width spaces, Greek capitals: the cases BERT's
# tokenizer special-cases.
SAMPLE = [
    'Café NAÏVE façade: Ünïcödé résumé — über-cool, déjà vu!',
    'The 中文字符 and 日本語 text, mixed with English.',
    'Tabs\tand\u00a0non-breaking\u2003spaces;\x00control\x07chars\ufffd gone?',
    "Don't stop-believing... e.g. $5.00, 3.14% (approx) [sic] {x} <y> #tag @user",
    'a' * 120 + ' short ' + 'Anne' * 26,
    'Emoji 🙂 and symbols ™ © ½ ﬁ ligature',
    'Persuasion by JANE AUSTEN; Sir Walter Elliot, of Kellynch-Hall, in Somersetshire',
    'zzqqx unknownword believable unbelievably',
    "ΟΔΟΣ ΚΑΙ ΛΟΓΟΣ. Ο ΔΡΟΜΟΣ' ΟΔΟΣ.ΚΑΙ ΣΑΣ Σ",  # Greek capitals: the final sigma ς.
    # ς also after case-ignorables (an elision mark, a combining accent) and a control
    # character BERT removes first; σ before a cased letter behind one.
    "Α'Σ Α.Σ Α\u0301Σ Α\x00Σ ΑΣ\x00Β ΑΣ\ufffdΒ",
    # U+0345 and modifier letters (ʰ) are cased and case-ignorable: skipped, as str.lower does.
    "\u0345'Σ ΑΣʰ ΑΣ\u0345Β",
]
PREFIXES = ('un', 'be', 're', '##able', '##ably', '##ing', '##ed', '##ly', '##s', '##ion',
            '##er', '##lie', '##ve')


def reference_module():
  """transformers' pure-Python BERT tokenizer module (no torch, no download)."""
  # pylint: disable=import-outside-toplevel
  try:  # transformers 5: the Python implementation lives on as BertTokenizerLegacy.
    from transformers.models.bert import tokenization_bert_legacy as module
    return module, module.BertTokenizerLegacy
  except ImportError:  # transformers 4: BertTokenizer is the Python implementation.
    from transformers.models.bert import tokenization_bert as module
    return module, module.BertTokenizer


def reference_tokenizer(vocab_file):
  return reference_module()[1](vocab_file, do_lower_case=True)


@pytest.fixture(scope='module')
def vocab_file(tmp_path_factory):
  """A BERT-layout vocab.txt: [PAD] 0, [unused*], then [UNK] [CLS] [SEP] [MASK] at 6..9, then
  characters, frequent words and a few sub-words from the sample; 'q' and 'x' left out so
  some words can only be [UNK]."""
  basic = reference_module()[0].BasicTokenizer(do_lower_case=True)
  text = SAMPLE + [line for doc in list(sources.read_documents([PERSUASION]))[:3] for line in doc]
  words = collections.Counter(w for line in text for w in basic.tokenize(line))
  chars = sorted({ch for w in words for ch in w} - {'q', 'x'})
  tokens = (['[PAD]'] + [f'[unused{i}]' for i in range(5)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]']
            + chars + ['##' + ch for ch in chars] + list(PREFIXES)
            + [w for w, _ in words.most_common(300) if w not in chars and w != 'a' * 120])
  path = tmp_path_factory.mktemp('wp') / 'vocab.txt'
  path.write_text('\n'.join(dict.fromkeys(tokens)) + '\n', encoding='utf-8')
  return str(path)


def test_wordpiece_ids_equal_the_reference_bert_tokenizer(vocab_file):
  ours = tok.load_tokenizer(vocab_file)
  ref = reference_tokenizer(vocab_file)
  lines = SAMPLE + [line for doc in sources.read_documents([PERSUASION]) for line in doc][:400]
  got = ours.encode_batch(lines)
  for line, ids in zip(lines, got):
    want = ref.convert_tokens_to_ids(ref.tokenize(line))
    assert ids == want, line
    assert ours.encode(line) == ids
  all_ids = [i for ids in got for i in ids]
  unk_fraction = all_ids.count(ours.unk_id) / len(all_ids)
  assert 0 < unk_fraction < 0.1  # The sample exercises [UNK] without being mostly [UNK].
  assert any(ours.id_to_piece(i).startswith('##') for i in all_ids)  # And continuations.


def test_wordpiece_basic_rules(vocab_file):
  ours = tok.load_tokenizer(vocab_file)
  pieces = lambda text: [ours.id_to_piece(i) for i in ours.encode(text)]
  assert pieces('CAFÉ, Naïve!') == pieces('cafe , naive !')  # Lower-case, accents, punctuation.
  assert pieces('a' * 101) == ['[UNK]'] and pieces('a' * 100) == ['a'] + ['##a'] * 99
  assert pieces('中文') == ['中', '文']  # Each CJK character is a word.
  assert pieces('x') == ['[UNK]']


def test_wordpiece_special_ids_come_from_the_vocab_and_raw_text_never_makes_them(vocab_file):
  ours = tok.load_tokenizer(vocab_file)
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 6, 7, 8, 9)
  assert ours.special_ids == (0, 7, 8, 9)
  with open(vocab_file, encoding='utf-8') as f:
    assert ours.vocab_size == len(f.read().splitlines())
  ids = ours.encode('[MASK] [CLS] [SEP] [PAD] hello [MASK]ed')
  assert ids and not set(ours.special_ids) & set(ids)


def test_wordpiece_vocab_errors(vocab_file, tmp_path):
  with pytest.raises(UserError, match=r"config.vocab_size=30522 .* set --config.vocab_size="):
    tok.load_tokenizer(vocab_file, 30522)
  (tmp_path / 'nospecial.txt').write_text('[PAD]\n[UNK]\nhello\n')
  with pytest.raises(UserError, match=r"nospecial.txt' lacks \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
    tok.load_tokenizer(str(tmp_path / 'nospecial.txt'))
  (tmp_path / 'latin1.txt').write_bytes(b'[PAD]\ncaf\xe9\n')
  with pytest.raises(UserError, match=r"latin1.txt' is not UTF-8 \(byte offset 9\)"):
    tok.load_tokenizer(str(tmp_path / 'latin1.txt'))
  with pytest.raises(UserError, match=r"'missing/vocab.txt' not found"):
    tok.load_tokenizer('missing/vocab.txt')


def test_examples_packed_with_wordpiece_use_its_special_ids(vocab_file):
  ours = wordpiece.WordPieceTokenizer(vocab_file)
  ex = build_examples(PERSUASION, ours, 48, 0.1, seed=0)
  assert len(ex['input_ids']) > 100
  assert_well_formed(ex, 48, cls_id=ours.cls_id, sep_id=ours.sep_id, pad_id=ours.pad_id)


def test_random_replacement_ids_avoid_special_ids_anywhere_in_the_vocab():
  vocab_size, specials = 40, (0, 7, 8, 9, 39)
  ids = np.asarray(masking.random_token_ids(jax.random.key(0), (20000,), vocab_size, specials))
  assert set(np.unique(ids)) == set(range(vocab_size)) - set(specials)  # All others, only them.
  counts = np.bincount(ids, minlength=vocab_size)[[i for i in range(vocab_size)
                                                  if i not in specials]]
  assert counts.min() > 0.7 * counts.mean()  # Roughly uniform.


def test_a_token_on_two_lines_takes_the_later_id_as_bert_and_transformers_do(tmp_path):
  """BERT's load_vocab (and transformers, and tokenizers) keep the last line of a repeated
  token; every line is an embedding row, so the size is the line count."""
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat', 'the']
  path = tmp_path / 'vocab.txt'
  path.write_text(''.join(t + '\n' for t in tokens), encoding='utf-8')
  tokenizer = wordpiece.WordPieceTokenizer(str(path))
  reference = reference_tokenizer(str(path))
  assert tokenizer.encode('the cat') == reference.convert_tokens_to_ids(
      reference.tokenize('the cat')) == [7, 6]
  assert tokenizer.vocab_size == len(tokens)
  assert [tokenizer.id_to_piece(i) for i in range(len(tokens))] == tokens


def test_one_cjk_ideograph_can_be_added_to_a_wordpiece_vocabulary():
  """BERT's normaliser spaces out each CJK ideograph; one alone is a token it can produce."""
  from electra_jax.data import extend_vocab  # pylint: disable=import-outside-toplevel
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a', 'b', '字']
  extension = extend_vocab.extend_wordpiece(tokens, True, ['龘'], 'words.txt')
  assert extension.tokens == ['龘']
  grown = wordpiece.WordPieceTokenizer('<tokens>', tokens=tokens + extension.tokens)
  assert grown.encode('a龘b') == [5, 8, 6]
  with pytest.raises(UserError, match="'中国' can never be a WordPiece token"):
    extend_vocab.extend_wordpiece(tokens, True, ['中国'], 'words.txt')


def test_a_new_continuation_starts_from_the_pieces_it_had_inside_a_word():
  """'##ness' in 'goodness' was '##ne' '##ss'; it took the word-initial 'ne' '##ss' (or a word
  'ness' itself) for its embedding row's mean."""
  from electra_jax.data import extend_vocab  # pylint: disable=import-outside-toplevel
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'good', 'ne', 'ss', '##ne', '##ss',
            'ness']
  old = wordpiece.WordPieceTokenizer('<tokens>', tokens=tokens)
  assert old.encode('goodness') == [5, 8, 9]
  extension = extend_vocab.extend_wordpiece(tokens, True, ['##ness', '##nezz', 'nessy'],
                                            'words.txt')
  assert extension.tokens == ['##ness', '##nezz', 'nessy']
  assert extension.pieces == [[8, 9], [1], old.encode('nessy')]  # [UNK]: as WordPiece reads it
  assert old.encode('goodnezz') == [1]


@pytest.mark.parametrize('token', ['##.', '##中', '##' + 'b' * 100, 'c' * 101])
def test_extending_a_wordpiece_vocabulary_refuses_tokens_no_text_produces(token):
  """A continuation of punctuation or a CJK ideograph (each starts a word of its own), or a word
  over 100 characters ([UNK] whole), would take an embedding row no text ever reads."""
  from electra_jax.data import extend_vocab  # pylint: disable=import-outside-toplevel
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a', 'b', '##b', '.', '中']
  with pytest.raises(UserError, match=re.escape(f"{token[:20]!r}") + r'(\.\.\.)? can never be a '
                     'WordPiece token'):
    extend_vocab.extend_wordpiece(tokens, True, [token], 'words.txt')
  fits = token[:-1] if len(token) > 100 else None  # 100 characters: a word still.
  if fits:
    assert extend_vocab.extend_wordpiece(tokens, True, [fits], 'words.txt').tokens
