"""What every electra_jax command shares: error handling, quiet library logs, JSON results."""
import json
import math
import sys

from absl import app, flags, logging

from electra_jax.errors import UserError

flags.DEFINE_bool('verbose', False, 'Show library INFO logs and full tracebacks on errors.')


def run(main):
  """absl app.run(main), turning a UserError into `error: ...` on stderr and exit code 2."""

  def wrapped(argv):
    if not flags.FLAGS.verbose:
      logging.set_verbosity(logging.WARNING)
    try:
      return main(argv)
    except UserError as e:
      if flags.FLAGS.verbose:
        raise
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(2)

  app.run(wrapped)


def _finite_or_none(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def json_line(record: dict) -> str:
  """One JSON object on one line; NaN/inf become null so any JSON parser accepts it."""
  return json.dumps({k: _finite_or_none(v) for k, v in record.items()}, sort_keys=False)


def print_result(record: dict):
  """The last stdout line of every command: a JSON summary a script can parse."""
  print(json_line(record), flush=True)
