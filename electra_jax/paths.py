"""Every path a user gives: a local path or a URL of a remote filesystem (gs:// first).

One layer over etils.epath, the one Orbax uses: epath sends gs:// to fsspec/gcsfs (without
TensorFlow), tensorstore writes the checkpoints' arrays to the same bucket. Local paths keep
their meaning (`~` expanded, relative to the current directory; data paths fall back to the
repository root, so the bundled corpus is found from anywhere in a clone).

A storage emulator is reached through the standard variables: STORAGE_EMULATOR_HOST (Python
clients); TENSORSTORE_GCS_HTTP_URL (tensorstore) defaults to it. Storage faults (unreachable
endpoint, no credentials, permission denied, no such bucket) become one-line UserErrors naming
the path and the fix.
"""
import contextlib
import errno
import glob as glob_lib
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import urllib.parse

import fsspec.config
from etils import epath

from electra_jax.errors import UserError, first_line

# The directory that holds the electra_jax package (a clone's root).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where remote files that a library can only read locally (ArrayRecord shards, TFDS datasets)
# are copied before use: $ELECTRA_JAX_CACHE, else ~/.cache/electra_jax.
CACHE_DIR = os.environ.get('ELECTRA_JAX_CACHE') or os.path.join(
    os.path.expanduser('~'), '.cache', 'electra_jax')
_GCS_ENDPOINT = 'https://storage.googleapis.com'
# Protocols whose storage answered once in this process (get() checks the others first).
_USABLE_SCHEMES = set()


def _configure_clients():
  """gcsfs lists a bucket afresh every time: several processes (a pod's hosts, a run and the
  command reading it) change the same bucket, and a cached listing would hide their writes.
  With STORAGE_EMULATOR_HOST set, tensorstore is pointed at it too, and gcsfs's gRPC
  bucket-type probe is skipped (an emulator speaks only HTTP: the probe would wait 60 s)."""
  fsspec.config.conf.setdefault('gs', {}).setdefault('use_listings_cache', False)
  host = os.environ.get('STORAGE_EMULATOR_HOST')
  if host:
    os.environ.setdefault('TENSORSTORE_GCS_HTTP_URL', host if '://' in host else f'http://{host}')
    os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')


_configure_clients()


def is_remote(path) -> bool:
  """A URL (gs://bucket/..., any fsspec protocol) rather than a local path."""
  return '://' in str(path)


# A remote filesystem's URL with a slash missing ('gs:/bucket', 'gs:bucket'), which would
# otherwise name a local directory 'gs:'.
_BROKEN_URL = re.compile(r'(gs|gcs|s3|az|abfs|hf|https?):(?!//)', re.IGNORECASE)


REMOTE_SCHEMES = ('gs', 'gcs')  # Cloud Storage, the one remote storage supported.


def absolute(path) -> str:
  """The canonical string of a path: a URL without its trailing '/' (its scheme as epath
  knows it: GS:// and gcs:// are gs://), or an absolute local path."""
  path = str(path).strip()
  if is_remote(path):
    scheme, rest = path.split('://', 1)
    scheme = scheme.lower()
    if scheme not in REMOTE_SCHEMES:  # s3://, https:// failed deep in fsspec or epath.
      raise UserError(f"'{path}': {scheme}:// paths are not supported; use a local path or "
                      'gs://BUCKET/PATH (copy the files there or here first)')
    if not rest.split('/', 1)[0]:
      raise UserError(f"'{path}' names no bucket; write gs://BUCKET/PATH")
    return f'gs://{rest}'.rstrip('/')  # fsspec's other name, gcs://, epath does not know.
  broken = _BROKEN_URL.match(path)
  if broken:
    raise UserError(f"'{path}' is not a {broken[1]}:// URL (a slash is missing); write "
                    f"{broken[1]}://BUCKET/PATH, or ./{path} for a local directory")
  return os.path.abspath(os.path.expanduser(path))


def canonical(path) -> str:
  """absolute(path), a local one with symlinks resolved: one name for each file."""
  path = absolute(path)
  return path if is_remote(path) else os.path.realpath(path)


def contains(outer, inner) -> bool:
  """Whether `inner` is `outer` or lies below it (local paths compared with symlinks
  resolved)."""
  outer, inner = canonical(outer), canonical(inner)
  return inner == outer or inner.startswith(outer.rstrip('/') + '/')


def same_file(a, b) -> bool:
  """Whether `a` and `b` are both files holding the same bytes."""
  return is_file(a) and is_file(b) and read_bytes(a) == read_bytes(b)


def get(path) -> epath.Path:
  """`absolute(path)` as an epath.Path; a remote one's storage is checked once (reachable,
  credentials) so a fault is one clear line before anything is read or written."""
  path = absolute(path)
  scheme = urllib.parse.urlparse(path).scheme if is_remote(path) else None
  if scheme and scheme not in _USABLE_SCHEMES:
    problem = _storage_problem(scheme)
    if problem:
      raise UserError(f"'{path}': {problem}")
    _USABLE_SCHEMES.add(scheme)
  return epath.Path(path)


def join(path, *parts) -> str:
  return str(epath.Path(absolute(path) if is_remote(path) else str(path)).joinpath(*parts))


def name(path) -> str:
  return epath.Path(str(path)).name


def parent(path) -> str:
  """The folder holding `path`; a bucket's root is its own (as / is), so walks up a remote
  path stop there."""
  path = absolute(path)
  return path if is_bucket_root(path) else str(epath.Path(path).parent)


def is_bucket_root(path) -> bool:
  """gs://BUCKET itself."""
  return is_remote(path) and '/' not in absolute(path).split('://', 1)[1]


def resolve(path: str) -> str:
  """A data path: itself if it is a URL, absolute or exists; else the repository-root
  candidate if that exists."""
  path = os.path.expanduser(str(path).strip())
  if is_remote(path) or os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(REPO_ROOT, path)
  return candidate if os.path.exists(candidate) else path


def as_found(path: str) -> str:
  """The absolute path (or URL) a user's path names where it is found (resolve): what a saved
  config keeps, so a run resumed or evaluated from another directory reads the same files."""
  return absolute(resolve(path))


def in_repository(path: str) -> str:
  """`path` relative to the repository root where it lies below it (the bundled data), else
  as given: a saved config still names those files after the clone moves (relative paths are
  found from the repository root too)."""
  root = REPO_ROOT + os.sep
  return path[len(root):] if not is_remote(path) and path.startswith(root) else path


def resolve_glob(pattern: str) -> str:
  """A glob made absolute where it matches files, from the cwd or else the repository root (as
  glob() matches it); a URL, or a relative glob that matches nothing, as written."""
  pattern = os.path.expanduser(pattern.strip())
  if is_remote(pattern) or os.path.isabs(pattern):
    return pattern
  return _local_match(pattern)[0]


def _local_match(pattern: str) -> tuple[str, list[str]]:
  """(the local glob as it matched, its files): from the cwd, else the repository root; the
  pattern as given and no files where neither matches."""
  candidates = ([pattern] if os.path.isabs(pattern) else
                [os.path.abspath(pattern), os.path.join(REPO_ROOT, pattern)])
  for candidate in candidates:
    files = [m for m in glob_lib.glob(candidate, recursive=True) if os.path.isfile(m)]
    if not files and os.path.isfile(candidate):  # 'wiki [2023].txt' names itself.
      files = [candidate]
    if files:
      return candidate, files
  return pattern, []


def exists(path) -> bool:
  with storage_errors(path):
    return get(path).exists()


def is_file(path) -> bool:
  with storage_errors(path):
    return get(path).is_file()


def is_dir(path) -> bool:
  with storage_errors(path):
    return get(path).is_dir()


def listdir(path) -> list[str]:
  """Names of the entries of a directory, sorted ([] if it does not exist or is empty: on an
  object store an empty directory does not exist, or is a folder marker, the object 'dir/'
  that the Cloud Console's "Create folder" writes, which is no entry)."""
  with storage_errors(path):
    directory = get(path)
    if not directory.is_dir():
      return []
    if not is_remote(path):
      return sorted(p.name for p in directory.iterdir())
    # fsspec's listing: epath's names the marker of 'dir' as an entry 'dir' of its own.
    filesystem, root = _filesystem(path)
    root = root.rstrip('/')
    return sorted({name.rstrip('/').rsplit('/', 1)[-1]
                   for name in filesystem.ls(root, detail=False, refresh=True)
                   if name.rstrip('/') != root})


def read_bytes(path) -> bytes:
  with storage_errors(path):
    return get(path).read_bytes()


def read_text(path) -> str:
  return read_bytes(path).decode('utf-8')


def read_json(path, fix: str = 'repair it or copy it again') -> dict:
  """A JSON object file; a damaged one (cut short, hand-edited) is one line naming it and
  `fix`, what to do."""
  try:
    record = json.loads(read_text(path))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"'{path}' is not valid JSON ({e}); {fix}") from None
  if not isinstance(record, dict):
    raise UserError(f"'{path}' holds a JSON {type(record).__name__}, not an object; {fix}")
  return record


def open_binary(path):
  """A readable binary file object (remote files are streamed, not downloaded whole)."""
  with storage_errors(path):
    return get(path).open('rb')


def glob(pattern: str) -> list[str]:
  """Sorted absolute files matching one glob (`**` recurses), from the cwd or else the
  repository root; a URL is matched on its filesystem."""
  pattern = os.path.expanduser(pattern.strip())
  if not is_remote(pattern):
    # Absolute: one file named two ways ('a.txt', '/data/a.txt') is one file.
    return sorted(os.path.abspath(m) for m in _local_match(pattern)[1])
  pattern = absolute(pattern)  # GS://b/*.txt is gs://b/*.txt.
  with storage_errors(pattern):
    filesystem, _ = _filesystem(pattern)
    found = filesystem.glob(pattern, detail=True)
    return sorted(filesystem.unstrip_protocol(name) for name, info in found.items()
                  if info.get('type') == 'file')


def _filesystem(path):
  """(fsspec filesystem, path without protocol) of a URL: epath's glob refuses `**` on object
  stores, and its rename wants the target's parent directory to exist."""
  import fsspec.core  # pylint: disable=import-outside-toplevel
  get(path)  # Storage checks first.
  return fsspec.core.url_to_fs(absolute(path))


def files_under(path) -> list[str]:
  """Every file below the directory `path`, relative to it, sorted."""
  if not is_remote(path):
    root = absolute(path)
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, names in os.walk(root) for f in names)
  with storage_errors(path):
    filesystem, root = _filesystem(path)
    root = root.rstrip('/')
    # Folder markers ('dir/' objects: the Cloud Console's folders, tf.io.gfile.makedirs) are
    # no files.
    return sorted(name[len(root) + 1:] for name in filesystem.find(root)
                  if not name.endswith('/') and name != root)


def make_dirs(path):
  with storage_errors(path):
    get(path).mkdir(parents=True, exist_ok=True)


def remove_file(path):
  """Deletes a file (nothing if it does not exist)."""
  with storage_errors(path):
    get(path).unlink(missing_ok=True)


def remove_tree(path):
  """Deletes a directory and everything under it (nothing if it does not exist)."""
  with storage_errors(path):
    target = get(path)
    if target.exists():
      target.rmtree()


@contextlib.contextmanager
def new_dirs_removed_on_failure(folder):
  """On an exception inside, removes `folder` and the folders above it that did not exist on
  entry, where they hold no files: a command refused after creating its output or workdir
  leaves nothing of its own behind. Object stores have no empty folders, and an optional
  folder not given (None, e.g. no --profile_dir) none to remove: nothing to do."""
  folder = absolute(folder) if folder else None
  missing = []  # Deepest first.
  while (folder is not None and not is_remote(folder) and not os.path.exists(folder)
         and parent(folder) != folder):
    missing.append(folder)
    folder = parent(folder)
  try:
    yield
  except BaseException:
    for new in missing:
      if any(files for _, _, files in os.walk(new)):
        break
      shutil.rmtree(new, ignore_errors=True)  # Another process may remove it too.
    raise


def rename(source, target):
  """Moves a file or directory (on object stores: copy, then delete the source; the target's
  parent need not exist there, as object stores have no directories)."""
  with storage_errors(source):
    if not is_remote(source):
      get(source).rename(get(target))
      return
    filesystem, root = _filesystem(source)
    filesystem.mv(root, _filesystem(target)[1], recursive=True)


def copy_tree(source, target, link: bool = False):
  """Copies a directory (`link`: local hard links where the filesystem allows)."""
  if not (is_remote(source) or is_remote(target)):
    source, target = absolute(source), absolute(target)
    if link:
      try:
        shutil.copytree(source, target, copy_function=os.link)
        return
      except OSError:
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return
  with storage_errors(source):
    for relative in files_under(source):
      destination = get(join(target, relative))
      destination.parent.mkdir(parents=True, exist_ok=True)
      destination.write_bytes(get(join(source, relative)).read_bytes())


def check_output_name(path, flag: str):
  """A UserError for an output path holding '[': Orbax and the cloud storage layer read it as
  a glob pattern, so checkpoints written there could never be read back."""
  if '[' in str(path):
    raise UserError(f"{flag} '{path}' holds '[', which checkpointing and cloud storage read as "
                    'a glob pattern (what is written there would not read back); choose a '
                    'name without brackets')


def check_writable_dir(path, flag: str) -> str:
  """Creates the directory `path` if needed and proves it writable with a probe file; returns
  its canonical string. UserError (naming `flag`) otherwise, before anything is written."""
  path = absolute(path)
  check_output_name(path, flag)
  with storage_errors(path, flag):
    directory = get(path)
    if directory.is_file():
      raise UserError(f"{flag} '{path}' is a file; pass a directory path")
    try:
      directory.mkdir(parents=True, exist_ok=True)
      probe = directory / f'.write_probe_{socket.gethostname()}_{os.getpid()}'
      probe.write_bytes(b'0')
      probe.unlink()
    except PermissionError as e:
      if is_remote(path):
        raise
      raise UserError(f"{flag} '{path}' is not writable ({e.strerror}); pick a writable "
                      'location') from None
    except OSError as e:
      if is_remote(path) or e.strerror is None:
        raise
      raise UserError(f"cannot create {flag} '{path}': {e.strerror}; pick a writable "
                      'location') from None
  return path


def local_copy(path: str, files=None) -> str:
  """A local directory with `path`'s files (`files`: only these, relative to it). Local paths
  are returned as they are; a remote directory is copied once into CACHE_DIR, a file copied
  again only when the object changed (its fsspec ukey: generation, checksum, size), for
  libraries that read local files only."""
  if not is_remote(path):
    return path
  source = get(path)
  target = os.path.join(CACHE_DIR, 'remote', urllib.parse.urlparse(str(source)).scheme,
                        str(source).split('://', 1)[1]).rstrip('/')
  # Which version of each object the copy holds, beside (not inside) the copied directory.
  keys_file = f'{target}.versions.json'
  try:
    with open(keys_file, encoding='utf-8') as f:
      copied = json.load(f)
  except (OSError, ValueError):
    copied = {}
  with storage_errors(path):
    filesystem, root = _filesystem(path)
    for relative in files if files is not None else files_under(path):
      local = os.path.join(target, relative)
      key = filesystem.ukey(f"{root.rstrip('/')}/{relative}")
      if os.path.exists(local) and copied.get(relative) == key:
        continue
      os.makedirs(os.path.dirname(local), exist_ok=True)
      with (source / relative).open('rb') as f_in, tempfile.NamedTemporaryFile(
          dir=os.path.dirname(local), delete=False) as f_out:
        shutil.copyfileobj(f_in, f_out, 1 << 24)
      os.replace(f_out.name, local)
      copied[relative] = key
      with tempfile.NamedTemporaryFile('w', dir=os.path.dirname(keys_file), delete=False,
                                       encoding='utf-8') as f:
        json.dump(copied, f)
      os.replace(f.name, keys_file)
  return target


# --- Storage faults -----------------------------------------------------------------------------

def _endpoint(scheme: str) -> str | None:
  if scheme != 'gs':
    return None
  host = os.environ.get('STORAGE_EMULATOR_HOST')
  if host:
    return host if '://' in host else f'http://{host}'
  return _GCS_ENDPOINT


def _storage_problem(scheme: str) -> str | None:
  """What makes every path of a protocol unusable, if anything: without an emulator, no Google
  credentials; an endpoint that does not answer a TCP connection (gcsfs would otherwise fall
  back to anonymous access and fail later, or retry for half a minute)."""
  endpoint = _endpoint(scheme)
  if endpoint is None:
    return None
  missing = [package for package, module in (('gcsfs', 'gcsfs'), ('google-auth', 'google.auth'))
             if not _importable(module)]
  if missing:  # An image without them (benchmarks/gpu_suite.sh's) still runs on local paths.
    return (f'{scheme}:// paths need {" and ".join(missing)} (not installed); '
            "pip install 'gcsfs>=2026.10.1', which brings google-auth")
  emulator = os.environ.get('STORAGE_EMULATOR_HOST')
  if not emulator:  # Emulators take anonymous requests.
    import google.auth  # pylint: disable=import-outside-toplevel
    try:
      google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError as e:
      return (f'no Google Cloud credentials for {scheme}:// paths ({first_line(e)}); run '
              '`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS '
              "to a service-account key file (Cloud TPU VMs use the VM's service account)")
  url = urllib.parse.urlparse(endpoint)
  port = url.port or (443 if url.scheme == 'https' else 80)
  via = 'STORAGE_EMULATOR_HOST' if emulator else 'the Google Cloud Storage endpoint'
  try:
    socket.create_connection((url.hostname, port), timeout=10).close()
  except OSError as e:
    return (f'cannot reach {endpoint} ({via}) for {scheme}:// paths ({e.strerror or e}); '
            'check the network, or that the emulator runs and STORAGE_EMULATOR_HOST names it')
  return None


def _importable(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # Its parent package (google) is missing too.
    return False


def _bucket(path: str) -> str | None:
  url = urllib.parse.urlparse(path)
  return f'{url.scheme}://{url.netloc}' if is_remote(path) and url.netloc else None


def _code(error: BaseException) -> int | None:
  code = getattr(error, 'code', None)
  return code if isinstance(code, int) else None


def user_error(path, error: BaseException, what: str = '') -> UserError | None:
  """The one-line UserError for a storage fault on `path` (None if `error` is something else).
  `what`: how the user named the path, e.g. '--workdir'."""
  if isinstance(error, UserError):
    return error
  where = f"{what} '{path}'" if what else f"'{path}'" if path else 'a storage path'
  text = first_line(error)
  module = type(error).__module__ or ''
  if (isinstance(error, PermissionError) or _code(error) in (401, 403)
      or text.startswith('Forbidden') or 'PERMISSION_DENIED' in text):
    return UserError(f'permission denied for {where} ({text}); give this account access (e.g. '
                     'roles/storage.objectAdmin on the bucket) or check the credentials '
                     '(gcloud auth application-default login)')
  if module.startswith('google.auth'):
    return UserError(f'no usable Google Cloud credentials for {where} ({text}); run `gcloud auth '
                     'application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')
  if module.startswith('aiohttp') or isinstance(error, (ConnectionError, socket.gaierror,
                                                         TimeoutError)):
    return UserError(f'cannot reach the storage of {where} ({text}); check the network (or '
                     'STORAGE_EMULATOR_HOST)')
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
    return UserError(f'writing {where} failed ({error.strerror}); free disk space (or raise the '
                     'quota or file size limit), then re-run the same command')
  if isinstance(error, OSError) and error.errno == errno.EROFS:
    return UserError(f'{where} is on a read-only filesystem; pick a writable location')
  bucket = _bucket(str(path))
  if isinstance(error, FileNotFoundError) and bucket:
    try:
      missing = not epath.Path(bucket).exists()
    except Exception:  # pylint: disable=broad-except
      missing = False
    if missing:
      return UserError(f"bucket {bucket} of {where} does not exist; create it (gcloud storage "
                       'buckets create ' + bucket + ') or fix the path')
  return None


@contextlib.contextmanager
def storage_errors(path, what: str = ''):
  """Storage faults inside become `user_error(path, ...)`; anything else passes through."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    error = user_error(path, e, what)
    if error is None or error is e:
      raise
    raise error from None
