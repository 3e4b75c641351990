"""The bundled training novels stored as the Hub's wikitext stores text (a record per line, an
empty record between documents), packed as the text files, as a document per record, and with
records_are_lines (RESULTS.md, session 34). Run from the repository root:
    python benchmarks/probes/line_records.py [OUT.parquet]
"""
import glob
import sys

import numpy as np
import pyarrow
import pyarrow.parquet

sys.path.insert(0, '.')
from configs import demo  # pylint: disable=wrong-import-position
from electra_jax.data import pipeline  # pylint: disable=wrong-import-position
from electra_jax.data import sources  # pylint: disable=wrong-import-position
from electra_jax.data import tokenizer as tok  # pylint: disable=wrong-import-position

out = sys.argv[1] if len(sys.argv) > 1 else '/tmp/austen_lines.parquet'
lines = []
for doc in sources.read_documents(sorted(glob.glob('data/demo_corpus/train/*.txt'))):
  lines += [''] + [f' {line} \n' for line in doc]
lines = lines[1:]
pyarrow.parquet.write_table(pyarrow.table({'text': lines}), out)
print(f'{out}: {len(lines):,} records, {sum(not x.strip() for x in lines):,} empty')
tokenizer = tok.for_config(demo.get_config())
packed = {}
for name, overrides in [('the text files', {}),
                        ('line records, a document each', dict(train_files=out)),
                        ('line records, records_are_lines=true',
                         dict(train_files=out, records_are_lines=True))]:
  c = demo.get_config()
  c.update(overrides)
  packed[name] = ex = pipeline.build_train_examples(c, tokenizer)
  mask = ex['input_mask']
  print(f'{name}: {len(mask):,} examples, {int(mask.sum()):,} real tokens, '
        f'{mask.sum() / mask.size:.3f} of positions hold a token')
want, got = packed['the text files'], packed['line records, records_are_lines=true']
print('records_are_lines packs the text files\' arrays:',
      all(np.array_equal(want[k], got[k]) for k in pipeline.FEATURES))
