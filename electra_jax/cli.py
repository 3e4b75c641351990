"""What every electra_jax command shares: error handling, quiet library logs, JSON results."""
import json
import logging as std_logging
import math
import os
import re
import sys

from absl import app, flags, logging

from electra_jax import paths
from electra_jax.errors import UserError

flags.DEFINE_bool('verbose', False, 'Show library INFO logs and full tracebacks on errors.')
flags.DEFINE_string('compilation_cache_dir', None, 'Persistent XLA compilation cache: a '
                    'directory or a URL (gs://...), shared by restarts and by every host of a '
                    'pod, so a restarted job does not compile again (default: '
                    '$JAX_COMPILATION_CACHE_DIR, else none).')
# Libraries under the path layer that log a traceback for each retry or fallback they handle.
_QUIET_LOGGERS = ('gcsfs', 'fsspec', 'google.auth', 'urllib3')


def _fail(message: str):
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(2)


def _config_file_arg(argv) -> str:
  """The --config=PATH given on the command line (for messages), or '?'."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      return arg.split('=', 1)[1]
    if arg == '--config' and i + 1 < len(argv):
      return argv[i + 1]
  return '?'


def _flag_error_message(error: Exception, argv) -> str:
  """One line for a command-line mistake that absl / ml_collections report at length."""
  text = str(error).strip()
  if isinstance(error, flags.Error):
    return f'{text.splitlines()[0]}; see --help'
  if 'get_config' in text:
    return (f"config file '{_config_file_arg(argv)}' has no get_config() function; pass a "
            'config file such as configs/demo.py')
  if isinstance(error, OSError):
    return (f"cannot load config file '{_config_file_arg(argv)}' (no such file, or it failed "
            'to import); pass an existing file such as configs/demo.py')
  if isinstance(error, (AttributeError, KeyError)):
    # ml_collections: 'KEY'\nDid you mean "OTHER" instead of "KEY"?
    key = re.search(r"'?([\w.]+)", text).group(1)
    hint = re.search(r'Did you mean "([^"]+)"', text)
    return (f"unknown config key --config.{key}"
            + (f" (did you mean --config.{hint.group(1)}?)" if hint else '')
            + '; every key is listed in configs/base_config.py')
  return f'bad command line: {text.splitlines()[0] if text else type(error).__name__}'


def parse_flags(argv):
  """absl flag parsing with every mistake reported as one `error: ...` line and exit code 2."""
  try:
    rest = flags.FLAGS(argv)
    for name in flags.FLAGS:
      value = flags.FLAGS[name].value
      if type(value).__name__ == '_ErrorConfig':  # config_flags defers a load failure ...
        value.to_dict()  # ... to the first access: raise it now.
    return rest
  except Exception as e:  # pylint: disable=broad-except
    if '--verbose' in argv or '--verbose=true' in argv:
      raise
    _fail(_flag_error_message(e, argv))


def use_compilation_cache(directory: str | None):
  """Points JAX's persistent compilation cache at `directory` (None or '': left as it is)."""
  if directory:
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_compilation_cache_dir', paths.absolute(directory))


def run(main):
  """absl app.run(main), turning a UserError (or a storage fault the path layer names) into
  `error: ...` on stderr and exit code 2."""

  def wrapped(argv):
    if not flags.FLAGS.verbose:
      logging.set_verbosity(logging.WARNING)
      for name in _QUIET_LOGGERS:
        std_logging.getLogger(name).setLevel(std_logging.CRITICAL)
    try:
      use_compilation_cache(flags.FLAGS.compilation_cache_dir)
      return main(argv)
    except Exception as e:  # pylint: disable=broad-except
      error = e if isinstance(e, UserError) else paths.user_error('', e)
      if error is None or flags.FLAGS.verbose:
        raise
      print(f'error: {error}', file=sys.stderr, flush=True)
      sys.stdout.flush()
      # Exit now: library threads (Orbax's async writers, the batch prefetcher) would otherwise
      # print their own tracebacks of the same failure during interpreter shutdown, after the
      # one line that explains it. Pending saves of good states were finished before this.
      os._exit(2)

  app.run(wrapped, flags_parser=parse_flags)


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
