"""A comparison's outputs: results.json, results.md (one table) and two plots.

The markdown table is written from results.json's numbers, so the two always agree.
"""
import io

from electra_jax import atomic
from electra_jax import flops
from electra_jax import paths
from electra_jax.experiments import runs
from electra_jax.finetune import metrics as metrics_lib

CURVE_METRICS = (('loss', 'training loss'),
                 ('mlm_accuracy', 'generator MLM accuracy (masked positions)'),
                 ('full_mlm_accuracy',
                  'full-size MLM accuracy (mlm: masked positions; all_tokens_mlm: every token)'),
                 ('disc_auc', 'discriminator AUC'))


def _color(index: int) -> str:
  """One colour per config, the same in every panel and plot."""
  return f'C{index % 10}'


def fmt_flops(value: float) -> str:
  return f'{value:.3g}'


def fmt_score(value: float) -> str:
  return f'{value:.4f}'


def markdown(results: dict) -> str:
  metric = results['main_metric'] or 'score'
  lines = [
      f"# Compute-matched comparison: {results['finetune_task']}",
      '',
      f"Pretraining budget {fmt_flops(results['flops_budget'])} FLOPs per config "
      f"(model FLOPs, electra_jax/flops.py); fine-tuning: median {metric} over "
      f"{results['num_seeds']} seed(s), each seed's best epoch.",
      '',
      f'| config | objective | pretraining FLOPs | steps | median {metric} | seed min–max |',
      '|---|---|---|---|---|---|',
  ]
  for run in results['configs']:
    for point in run['points']:
      low, high = metrics_lib.seed_range(point['finetune']['seeds'])
      lines.append(f"| {run['name']} | {run['objective']} | {fmt_flops(point['flops'])} | "
                   f"{point['step']} | {fmt_score(point['finetune']['median'])} | "
                   f'{fmt_score(low)}–{fmt_score(high)} |')
  lines += ['', 'Warmup steps (the config\'s, capped at 10 % of the run\'s steps): ' + ', '.join(
      f"{r['name']} {r['num_warmup_steps']} (config {r['config_warmup_steps']})"
      for r in results['configs']) + '.', '']
  return '\n'.join(lines)


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _save(fig, path: str):
  """A figure as PNG at `path` (any filesystem), written whole."""
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=120)
  atomic.write_bytes(path, png.getvalue())


def plot_downstream(results: dict, path: str):
  """Median downstream score vs pretraining FLOPs, one line per config, seed min–max bars."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for index, run in enumerate(results['configs']):
    x = [p['flops'] for p in run['points']]
    y = [p['finetune']['median'] for p in run['points']]
    ranges = [metrics_lib.seed_range(p['finetune']['seeds']) for p in run['points']]
    low = [m - r[0] for m, r in zip(y, ranges)]
    high = [r[1] - m for m, r in zip(y, ranges)]
    ax.errorbar(x, y, yerr=[low, high], marker='o', capsize=4, color=_color(index),
                label=f"{run['name']} ({run['objective']})")
  # From 0 to the budget: runs a few steps apart do not look far apart.
  ax.set_xlim(0, 1.05 * results['flops_budget'])
  ax.set_xlabel('pretraining FLOPs')
  ax.set_ylabel(f"{results['finetune_task']}: median {results['main_metric']}")
  ax.set_title('Downstream score at equal pretraining compute (bars: seed min–max)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def plot_curves(results: dict, path: str):
  """Pretraining metrics from each run's metrics.jsonl against the FLOPs spent by each step
  (from its FLOPs stages: two_stage's steps differ in cost); a metric no run logs (e.g.
  disc_auc without a discriminator) gets no panel."""
  plt = _pyplot()
  curves = {}
  for run in results['configs']:
    rows = runs.read_jsonl(paths.join(run['pretrain_workdir'], 'metrics.jsonl'))
    curves[run['name']] = (run, rows)
  metrics = [(key, title) for key, title in CURVE_METRICS
             if any(r.get(key) is not None for _, rows in curves.values() for r in rows)]
  metrics = metrics or CURVE_METRICS[:1]
  fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
  for ax, (key, title) in zip(axes[0], metrics):
    for index, (name, (run, rows)) in enumerate(curves.items()):
      points = [(flops.flops_to_step(run['flops_stages'], r['step']), r[key]) for r in rows
                if r.get(key) is not None]
      if points:
        ax.plot(*zip(*points), marker='.', label=name, color=_color(index))
    ax.set_xlabel('pretraining FLOPs')
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def write_all(results: dict, output: str) -> dict:
  """Writes every output file; returns their paths."""
  written = dict(results_json=paths.join(output, 'results.json'),
                 results_md=paths.join(output, 'results.md'),
                 downstream_plot=paths.join(output, 'downstream_vs_flops.png'),
                 curves_plot=paths.join(output, 'pretraining_curves.png'))
  atomic.write_json(written['results_json'], results)
  atomic.write_text(written['results_md'], markdown(results))
  plot_downstream(results, written['downstream_plot'])
  plot_curves(results, written['curves_plot'])
  return written
