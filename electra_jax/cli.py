"""What every electra_jax command shares: error handling, quiet library logs, JSON results."""
import difflib
import importlib
import importlib.metadata
import importlib.util
import json
import logging as std_logging
import math
import os
import pkgutil
import re
import select
import sys
import traceback

from absl import app, flags, logging
import ml_collections
from ml_collections import config_flags

from electra_jax import paths
from electra_jax.errors import UserError, first_line

# Libraries under the path layer that log a traceback for each retry or fallback they handle;
# asyncio logs each failed write task of an Orbax save that the save's own error reports.
_QUIET_LOGGERS = ('gcsfs', 'fsspec', 'google.auth', 'urllib3', 'asyncio')


class _OrbaxErrorsOnOneLine(std_logging.Filter):
  """Orbax logs each failure of its background save threads with a traceback (a full disk:
  hundreds of lines), and the checkpointer then stops the run with the one-line error that
  explains it: without --verbose each of Orbax's records keeps its first line."""

  def filter(self, record):
    if '/orbax/' in record.pathname.replace(os.sep, '/') and record.levelno >= std_logging.ERROR:
      lines = record.getMessage().strip().splitlines() or ['']
      record.msg, record.args = lines[0][:300], ()
      record.exc_info = record.exc_text = record.stack_info = None
    return True


def _quiet_closed_loops(default_hook):
  """sys.unraisablehook without the 'Event loop is closed' tracebacks that tensorstore's write
  callbacks raise when a failed Orbax save has already closed its event loop."""
  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == 'Event loop is closed'):
      default_hook(unraisable)
  return hook


def _stdout_reader_gone() -> bool:
  """stdout is a pipe whose reader has closed it (poll reports an error on a pipe's writing end
  then)."""
  try:
    poll = select.poll()
    poll.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poll.poll(0))
  except (AttributeError, OSError, ValueError):  # No poll (Windows), or no real stdout.
    return False


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


def _flag_error_message(error: Exception, argv,
                        keys_file: str = 'configs/base_config.py') -> str:
  """One line for a command-line mistake that absl / ml_collections report at length."""
  text = str(error).strip()
  spec = _config_file_arg(argv)  # The --config value, for messages.
  if isinstance(error, flags.Error) and 'Error whilst parsing config file' in text:
    # config_flags puts the traceback of get_config()'s TypeError / ValueError in the message.
    return (f"config file '{spec}': get_config() failed "
            f'({text.splitlines()[-1].strip()}); fix it or pass another file')
  if isinstance(error, flags.Error) and text.startswith('flag --config.'):  # A bad value.
    return f"{text.splitlines()[0].removeprefix('flag ')}; {keys_file} shows the key's type"
  required = re.match(r'flag --(\w+)=None: Flag --\w+ must have a value other than None', text)
  if isinstance(error, flags.Error) and required:
    name = required.group(1)
    # Arguments that no flag took: `train configs/demo.py` meant --config=configs/demo.py.
    loose = [a for i, a in enumerate(argv[1:], 1) if not a.startswith('-')
             and not (argv[i - 1].startswith('--') and '=' not in argv[i - 1])]
    hint = f" ('{loose[0]}' has no flag name: write --{name}={loose[0]})" if loose else ''
    return f'--{name} is required; pass --{name}=...{hint}; see --help'
  override = re.match(r"Unknown command line flag 'config\.([\w.]+)'", text)
  if (isinstance(error, flags.Error) and override and 'config' in flags.FLAGS
      and spec == '?'):
    return (f'--config.{override.group(1)} overrides a key of a config file: pass the file too, '
            '--config=FILE')
  unknown = re.match(r"Unknown command line flag '(\w+)'", text)
  if (isinstance(error, flags.Error) and unknown and 'config' in flags.FLAGS
      and unknown.group(1) in _config_keys(keys_file)):
    # A config key without its prefix: absl's "did you mean" names a flag of the command.
    return (f"unknown flag --{unknown.group(1)}; it is a config key: write "
            f'--config.{unknown.group(1)}=...')
  if isinstance(error, flags.Error):
    return f'{text.splitlines()[0]}; see --help'
  example = ('configs/finetune/files.py' if keys_file.startswith('configs/finetune/')
             else 'configs/demo.py')
  if spec.partition(':')[0].endswith('.json'):
    return (f"config file '{spec}' is JSON; --config takes a Python config file such as "
            f"{example} (a run's own config.json is read from its --workdir)")
  line = _line_in_config_file(error, spec)
  if line is not None and not isinstance(error, (ImportError, SyntaxError)):  # Its own code.
    return (f"config file '{spec}' failed at line {line} ({type(error).__name__}: "
            f'{text.splitlines()[0] if text else "?"}); fix it or pass another file')
  if 'get_config' in text:
    return (f"config file '{spec}' has no get_config() function; pass a "
            f'config file such as {example}')
  if isinstance(error, OSError):
    return (f"cannot load config file '{spec}' (no such file, or it failed "
            f'to import); pass an existing file such as {example} (relative paths are tried '
            'from the current directory, then the repository root)')
  if isinstance(error, (ImportError, SyntaxError)):  # From the config file's own code.
    return (f"config file '{spec}' failed to import ({type(error).__name__}: "
            f'{text.splitlines()[0] if text else "?"}); fix it or pass another file')
  if isinstance(error, (AttributeError, KeyError)):
    # ml_collections: 'KEY'\nDid you mean "OTHER" instead of "KEY"?
    key = re.search(r"'?([\w.]+)", text).group(1)
    hint = re.search(r'Did you mean "([^"]+)"', text)
    return (f"unknown config key --config.{key}"
            + (f" (did you mean --config.{hint.group(1)}?)" if hint else '')
            + f'; every key is listed in {keys_file}')
  return f'bad command line: {text.splitlines()[0] if text else type(error).__name__}'


def _line_in_config_file(error: Exception, spec: str) -> int | None:
  """The line of the --config file where `error` was raised (its innermost frame there), or
  None where the file's code was not running."""
  path = os.path.abspath(_resolved_spec(spec).partition(':')[0])
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if os.path.abspath(frame.filename) == path]
  return lines[-1] if lines else None


def _raise_deferred_load_error(value):
  if type(value).__name__ == '_ErrorConfig':  # config_flags defers a load failure ...
    value.to_dict()  # ... to the first access: raise it now.


def _wrong_kind(config, keys_file: str, spec: str) -> str | None:
  """Why a pretraining config does not suit a fine-tuning command or the reverse (each would
  fail at its first key the other lacks), or None."""
  finetuning = keys_file.startswith('configs/finetune/')
  if not isinstance(config, ml_collections.ConfigDict) or ('task' in config) == finetuning:
    return None
  if finetuning:
    return (f"config file '{spec}' is a pretraining config; fine-tuning takes one of "
            'configs/finetune/*.py (python -m electra_jax.train runs this one)')
  return (f"config file '{spec}' is a fine-tuning config; pass a pretraining config such as "
          'configs/demo.py (python -m electra_jax.finetune runs this one)')


def _config_keys(keys_file: str) -> set[str]:
  """The keys of the commands' configs (configs/base_config.py, a fine-tuning file)."""
  module = importlib.import_module(keys_file.removesuffix('.py').replace('/', '.'))
  return set(module.get_config().keys())


def _unknown_key(config, keys_file: str, spec: str) -> str | None:
  """Why a config file's own keys are not all keys of `keys_file` (a misspelt key set in a
  file, `c.learning_rat = ...`, would be carried along unread), or None. --config.KEY on the
  command line is checked by the config's lock."""
  if not isinstance(config, ml_collections.ConfigDict):
    return None
  known = _config_keys(keys_file)
  unknown = sorted(set(config.keys()) - known)
  if not unknown:
    return None
  close = difflib.get_close_matches(unknown[0], known, n=1)
  return (f"config file '{spec}' sets unknown key {unknown[0]!r}"
          + (f' (did you mean {close[0]!r}?)' if close else '')
          + f'; every key is listed in {keys_file}')


def _resolved_spec(spec: str) -> str:
  """A --config value with its file found as data paths are: from the current directory, else
  the repository root (configs/demo.py from anywhere)."""
  path, colon, arg = spec.partition(':')
  return paths.resolve(path) + colon + arg


def _with_resolved_config(argv: list) -> list:
  argv = list(argv)
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      argv[i] = '--config=' + _resolved_spec(arg.split('=', 1)[1])
    elif arg == '--config' and i + 1 < len(argv):
      argv[i + 1] = _resolved_spec(argv[i + 1])
  return argv


def parse_flags(argv, keys_file: str = 'configs/base_config.py'):
  """absl flag parsing with every mistake reported as one `error: ...` line and exit code 2."""
  try:
    rest = flags.FLAGS(_with_resolved_config(argv))
    for name in flags.FLAGS:
      _raise_deferred_load_error(flags.FLAGS[name].value)
  except Exception as e:  # pylint: disable=broad-except
    if '--verbose' in argv or '--verbose=true' in argv:
      raise
    message = _flag_error_message(e, argv, keys_file)
    if message.startswith('unknown config key'):  # The file may be the mistake, not the key.
      message = _wrong_kind_of_file(argv, keys_file) or message
    _fail(message)
  wrong = 'config' in flags.FLAGS and (
      _wrong_kind(flags.FLAGS.config, keys_file, _config_file_arg(argv))
      or _unknown_key(flags.FLAGS.config, keys_file, _config_file_arg(argv)))
  wrong = wrong or _empty_flag()
  if wrong:
    _fail(wrong)
  return rest


# String flags an empty value leaves as their default (documented so).
EMPTY_MEANS_DEFAULT = ('compilation_cache_dir',)


def _empty_flag() -> str | None:
  """The message for a command's string flag given as empty (`--output=$UNSET`): read as the
  current directory it would put a vocabulary at /, shards or a run beside the user's files.
  Config keys (--config.KEY=) are left to the config's checks: '' may mean none there."""
  for name in flags.FLAGS:
    if '.' in name:
      continue
    flag = flags.FLAGS[name]
    values = flag.value if isinstance(flag.value, list) else [flag.value]
    if (flag.present and name not in EMPTY_MEANS_DEFAULT and flag.flag_type() in (
        'string', 'multi string') and any(isinstance(v, str) and not v.strip() for v in values)):
      return f'--{name} is empty (an unset shell variable?); pass a value'
  return None


def _wrong_kind_of_file(argv, keys_file: str) -> str | None:
  """_wrong_kind of the --config file alone (its overrides failed as unknown keys), or None."""
  spec = _config_file_arg(argv)
  try:
    config = load_config(spec, keys_file=keys_file, checked=False)
  except UserError:
    return None
  return _wrong_kind(config, keys_file, spec)


def load_config(spec: str, overrides=(), keys_file: str = 'configs/base_config.py',
                checked: bool = True) -> ml_collections.ConfigDict:
  """The config that `--config=spec --config.KEY=VALUE ...` (overrides: 'KEY=VALUE') gives a
  command, parsed by config_flags into flags of its own: a command that starts others (compare)
  reads a config exactly as they will. UserError with the line the command would print."""
  argv = ['electra_jax', f'--config={spec}', *[f'--config.{o}' for o in overrides]]
  resolved = _resolved_spec(spec)
  resolved_argv = [argv[0], f'--config={resolved}', *argv[2:]]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=flag_values, lock_config=True,
                                  sys_argv=resolved_argv)
  modules = set(sys.modules)
  try:
    flag_values(resolved_argv)
    _raise_deferred_load_error(flag_values.config)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(_flag_error_message(e, argv, keys_file)) from e
  finally:
    # config_flags imports the file as a module it keeps in sys.modules and re-executes in
    # place on its next load, of any file: a file without get_config() would get this one's.
    path = os.path.abspath(resolved.split(':', 1)[0])
    for name in set(sys.modules) - modules:
      if os.path.abspath(getattr(sys.modules[name], '__file__', None) or '') == path:
        del sys.modules[name]
  wrong = checked and (_wrong_kind(flag_values.config, keys_file, spec)
                      or _unknown_key(flag_values.config, keys_file, spec))
  if wrong:
    raise UserError(wrong)
  return flag_values.config


def use_compilation_cache(directory: str | None):
  """Points JAX's persistent compilation cache at `directory` (None or '': left as it is)."""
  if directory:
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_compilation_cache_dir', paths.absolute(directory))


def _jax_plugins() -> list[str]:
  """The PJRT plugins (GPU backends) JAX will load: modules under the `jax_plugins` namespace
  package and `jax_plugins` entry points, the two places JAX looks."""
  names = [e.value for e in importlib.metadata.entry_points(group='jax_plugins')]
  try:
    import jax_plugins  # pylint: disable=import-outside-toplevel
    names += [name for _, name, _ in pkgutil.iter_modules(jax_plugins.__path__)]
  except ImportError:
    pass
  return names


def cpu_is_the_only_platform(jax_platforms: str | None, libtpu_installed: bool,
                              tpu_chips: int, plugins) -> bool:
  """Whether JAX would try the TPU runtime (libtpu installed) where only the CPU can run: no
  TPU chip attached, no GPU plugin, no platforms chosen by the user ($JAX_PLATFORMS)."""
  return libtpu_installed and not (jax_platforms or tpu_chips or plugins)


def skip_absent_tpu_runtime():
  """With libtpu installed (the `tpu` extra, e.g. to plan a pod with --dry_run --topology on a
  laptop) JAX starts the TPU runtime on any machine, and where there is no TPU libtpu 0.0.42
  prints five lines of errors before JAX falls back to the CPU. Where the CPU is the only
  platform, tell JAX before it starts (compiling for a topology does not need the runtime).
  jax.config.jax_platforms holds $JAX_PLATFORMS, which, when set, decides."""
  if importlib.util.find_spec('libtpu') is None:
    return
  import jax  # pylint: disable=import-outside-toplevel
  try:
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    tpu_chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
  except Exception:  # pylint: disable=broad-except  # A JAX without it: leave JAX to decide.
    return
  if cpu_is_the_only_platform(jax.config.jax_platforms, True, tpu_chips, _jax_plugins()):
    jax.config.update('jax_platforms', 'cpu')


def _define_common_flags():
  """The flags every command has; defined when a command runs, never at import."""
  flags.DEFINE_bool('verbose', False, 'Show library INFO logs and full tracebacks on errors.')
  flags.DEFINE_string('compilation_cache_dir', None, 'Persistent XLA compilation cache: a '
                      'directory or a URL (gs://...), shared by restarts and by every host of a '
                      'pod, so a restarted job does not compile again (default: '
                      '$JAX_COMPILATION_CACHE_DIR, else none).')


def _in_distributed_run() -> bool:
  jax = sys.modules.get('jax')  # Not imported: not joined, and no reason to import it now.
  return jax is not None and jax.distributed.is_initialized()


def _leave_distributed_run():
  """A finished multi-process command leaves jax.distributed (its shutdown barrier, then the
  coordinator's service) here, while every thread and object is alive, not in JAX's atexit hook
  during interpreter teardown, where a finished job's coordinator once aborted (RESULTS.md,
  session 32). Errors leave through os._exit below: no barrier waits for peers that failed."""
  if _in_distributed_run():
    from electra_jax import distributed  # pylint: disable=import-outside-toplevel
    distributed.stop_watching()
    sys.modules['jax'].distributed.shutdown()


def run(main, keys_file: str = 'configs/base_config.py'):
  """absl app.run(main), turning a UserError (or a storage fault the path layer names) into
  `error: ...` on stderr and exit code 2. In a multi-process run every error ends the process
  at once (other errors with their traceback, exit 1) and the other processes with it
  (distributed.report_failure). keys_file: where the --config keys are listed.
  The command's own flags are defined before this is called."""
  _define_common_flags()

  def wrapped(argv):
    if not flags.FLAGS.verbose:
      logging.set_verbosity(logging.WARNING)
      for name in _QUIET_LOGGERS:
        std_logging.getLogger(name).setLevel(std_logging.CRITICAL)
      absl_logger = std_logging.getLogger('absl')
      if not any(isinstance(f, _OrbaxErrorsOnOneLine) for f in absl_logger.filters):
        absl_logger.addFilter(_OrbaxErrorsOnOneLine())
        sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
    try:
      if len(argv) > 1:  # E.g. a glob the shell expanded: all but its first file would be lost.
        raise UserError(f'unexpected arguments {argv[1:]}; every value goes in a flag, '
                        '--name=VALUE (--config.KEY=VALUE for config keys): quote a glob or a '
                        'text with spaces so that the shell passes it whole')
      skip_absent_tpu_runtime()
      use_compilation_cache(flags.FLAGS.compilation_cache_dir)
      result = main(argv)
      _leave_distributed_run()
      return result
    except KeyboardInterrupt:  # Ctrl-C where no stop request waits for the step to end.
      print('interrupted', file=sys.stderr, flush=True)
      sys.stdout.flush()
      if _in_distributed_run():  # The others would wait in the next collective.
        from electra_jax import distributed  # pylint: disable=import-outside-toplevel
        distributed.report_failure('interrupted (Ctrl-C)')
      os._exit(130)  # As a shell reports SIGINT; library threads print nothing more.
    except Exception as e:  # pylint: disable=broad-except
      if isinstance(e, BrokenPipeError) and _stdout_reader_gone():
        # `| head` read what it wanted and left (not a storage connection's broken pipe):
        # stop quietly, with a shell's exit status for SIGPIPE (the other processes too).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if _in_distributed_run():
          from electra_jax import distributed  # pylint: disable=import-outside-toplevel
          distributed.report_failure('its stdout was closed (a reader such as head left)')
        os._exit(141)
      error = e if isinstance(e, UserError) else paths.user_error('', e)
      several = _in_distributed_run()
      if several and error is None:
        from electra_jax import distributed  # pylint: disable=import-outside-toplevel
        distributed.stop_if_another_failed()
      if error is None or flags.FLAGS.verbose:
        if not several:
          raise
        # Raised, the error would end in JAX's exit-time shutdown barrier, where this process
        # waits for the others and they for it until the heartbeat timeout aborts them all.
        traceback.print_exc()
      else:
        print(f'error: {error}', file=sys.stderr, flush=True)
      if several:  # The others stop too, now, instead of waiting for this one in a collective.
        from electra_jax import distributed  # pylint: disable=import-outside-toplevel
        distributed.report_failure(
            str(error) if error is not None else f'{type(e).__name__}: {first_line(e)}')
      sys.stdout.flush()
      sys.stderr.flush()
      # Exit now: library threads (Orbax's async writers, the batch prefetcher) would otherwise
      # print their own tracebacks of the same failure during interpreter shutdown, after the
      # one line that explains it. Pending saves of good states were finished before this.
      os._exit(1 if error is None else 2)

  app.run(wrapped, flags_parser=lambda argv: parse_flags(argv, keys_file))


def integers(flag: str, values: list[str], minimum: int, example: str) -> list[int]:
  """A comma-separated list flag's values as integers >= minimum, or a one-line UserError."""
  try:
    numbers = [int(v) for v in values]
  except ValueError:
    numbers = []
  if not numbers or min(numbers) < minimum:
    raise UserError(f'--{flag}={",".join(values)} must be whole numbers >= {minimum}, e.g. '
                    f'--{flag}={example}')
  return numbers


def _finite_or_none(value):
  """`value` with every NaN/inf float, in lists and dicts too, made None."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite_or_none(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite_or_none(v) for v in value]
  return value


def json_line(record: dict) -> str:
  """One JSON object on one line; NaN/inf become null so any JSON parser accepts it."""
  return json.dumps(_finite_or_none(record), sort_keys=False)


def print_result(record: dict):
  """The last stdout line of every command: a JSON summary a script can parse."""
  print(json_line(record), flush=True)
