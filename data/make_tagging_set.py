"""Builds data/austen_names/: a small token tagging set from the bundled Austen corpus (which
words name a person: B-PER / I-PER / O, CoNLL format), for the tagging demo
(configs/finetune/tagging.py).

The labels are made by rule, not by hand: a person's name is a run of capitalised words each of
which somewhere in the five training novels follows a title (Mr., Mrs., Miss, Lady, Sir, Lord,
Colonel, General, Captain, Dr., Admiral), e.g. "Knightley", "Jane Fairfax", or is one of a few
first names never written after a title (FIRST_NAMES: "Emma", "Elinor", ...); the title itself
is O, as in CoNLL-2003. Sentences are those of
data/make_finetune_set.py (8-30 words; every 4th chapter to eval), words split off punctuation;
three in four sentences chosen hold a name.

  python data/make_tagging_set.py --corpus_dir=data/demo_corpus \
      --output_dir=data/austen_names --num_train=1500 --num_eval=500 --seed=0
"""
import glob
import os
import random
import re

from make_finetune_set import parse_args
from make_finetune_set import split_chapters
from make_finetune_set import write_splits

_WORD = re.compile(r"(?:Mrs|Mr|Dr|St|Ms)\.|\w+(?:['’-]\w+)*|[^\w\s]")
TITLES = {'Mr.', 'Mrs.', 'Miss', 'Lady', 'Sir', 'Lord', 'Colonel', 'General', 'Captain', 'Dr.',
          'Admiral'}
# First names of characters who are never written after a title (there is no "Miss Emma").
FIRST_NAMES = {'Emma', 'Elinor', 'Eleanor', 'Charlotte', 'Tom', 'George', 'Mary', 'Maria',
               'Isabella', 'Caroline', 'Clara', 'Susan', 'Kitty', 'Georgiana', 'Frederick',
               'Louisa'}
# Capitalised words that follow a title in the novels but name no one ("Lady Patroness").
NOT_NAMES = {'I', 'The', 'A', 'And', 'But', 'He', 'She', 'It', 'In', 'Of', 'Monday', 'Impudence',
             'Manager', 'Patroness'}


def words(sentence: str) -> list[str]:
  return _WORD.findall(sentence)


def name_words(sentences) -> set[str]:
  """Every capitalised word of a run that follows a title, and FIRST_NAMES."""
  names = set(FIRST_NAMES)
  for sentence in sentences:
    ws = words(sentence)
    for i, w in enumerate(ws[:-1]):
      if w not in TITLES:
        continue
      j = i + 1
      # Capitalised, not shouted ("DID"), not an initial ("F.").
      while (j < len(ws) and ws[j][:1].isupper() and not ws[j].isupper()
             and ws[j] not in TITLES | NOT_NAMES):
        names.add(ws[j])
        j += 1
  return names


def tags(ws: list[str], names: set[str]) -> list[str]:
  out = []
  for w in ws:
    if w in names:
      out.append('I-PER' if out and out[-1] != 'O' else 'B-PER')
    else:
      out.append('O')
  return out


def build(paths, num_train: int, num_eval: int, rng: random.Random):
  train, evaluation = [], []
  for path in paths:
    novel_train, novel_eval = split_chapters(path)
    train += novel_train
    evaluation += novel_eval
  names = name_words(train + evaluation)
  result = []
  for sentences, n in ((train, num_train), (evaluation, num_eval)):
    tagged = [(ws, tags(ws, names)) for ws in map(words, sentences)]
    with_name = [t for t in tagged if 'B-PER' in t[1]]
    without = [t for t in tagged if 'B-PER' not in t[1]]
    rng.shuffle(with_name)
    rng.shuffle(without)
    n_with = 3 * n // 4
    if len(with_name) < n_with or len(without) < n - n_with:
      raise SystemExit(f'only {len(with_name)} sentences with names, {len(without)} without')
    chosen = with_name[:n_with] + without[:n - n_with]
    rng.shuffle(chosen)
    result.append(chosen)
  return result


def write_conll(path: str, rows):
  with open(path, 'w', encoding='utf-8') as f:
    for ws, ts in rows:
      f.write(''.join(f'{w}\t{t}\n' for w, t in zip(ws, ts)) + '\n')


def main():
  args = parse_args(__doc__, 'data/austen_names', 1500, 500)
  paths = sorted(glob.glob(os.path.join(args.corpus_dir, 'train', '*.txt')))
  train, evaluation = build(paths, args.num_train, args.num_eval, random.Random(args.seed))
  write_splits(args.output_dir, write_conll, 'txt', train, evaluation, 'sentences')


if __name__ == '__main__':
  main()
