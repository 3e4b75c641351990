"""Issue 19's study plot: held-out discriminator AUC and generator MLM accuracy against tokens
seen, one line per training run (its eval_metrics.jsonl).

    python benchmarks/demo_recipe/plot_study.py OUT.png LABEL=WORKDIR [LABEL=WORKDIR ...]

Prints a markdown table (the last evaluation of each run) as well.
"""
import json
import os
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position


def load(workdir):
  config = json.load(open(os.path.join(workdir, 'config.json'), encoding='utf-8'))
  tokens_per_step = config['train_batch_size'] * config['max_seq_length']
  rows = [json.loads(line) for line in open(os.path.join(workdir, 'eval_metrics.jsonl'),
                                            encoding='utf-8') if line.strip()]
  rows = sorted({r['step']: r for r in rows}.values(), key=lambda r: r['step'])
  return [(r['step'] * tokens_per_step / 1e6, r['disc_auc'], r['mlm_accuracy']) for r in rows]


def main(argv):
  out, runs = argv[1], [a.rsplit('=', 1) for a in argv[2:]]
  fig, (ax_auc, ax_mlm) = plt.subplots(1, 2, figsize=(12, 4.8))
  print('| run | tokens (M) | held-out disc AUC | held-out MLM acc |\n|---|---|---|---|')
  for label, workdir in runs:
    points = load(workdir)
    tokens, auc, mlm = zip(*points)
    ax_auc.plot(tokens, auc, marker='o', label=label)
    ax_mlm.plot(tokens, mlm, marker='o', label=label)
    print(f'| {label} | {tokens[-1]:.1f} | {auc[-1]:.3f} | {mlm[-1]:.3f} |')
  ax_auc.axhline(0.65, color='grey', ls='--', lw=0.8)
  ax_mlm.axhline(2.5 * 0.062, color='grey', ls='--', lw=0.8)
  ax_auc.set(xlabel='tokens seen (M)', ylabel='held-out discriminator AUC',
             title='RTD vs the run\'s own generator (target 0.65)')
  ax_mlm.set(xlabel='tokens seen (M)', ylabel='held-out generator MLM accuracy',
             title='generator (target 2.5 x unigram 0.062)')
  ax_auc.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out, dpi=110)


if __name__ == '__main__':
  main(sys.argv)
