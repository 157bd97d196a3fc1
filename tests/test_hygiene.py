"""Security and hygiene: loopback binds, no pickles read, a taken port is one line and exit 2.

The subprocess tests run a tiny worker with the environment `hetjax.launch` would give it (set
by hand, so the launcher is not involved), each in its own session, killed on timeout.
"""

import ast
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from hetjax import ConfigError, ps
from hetjax.runtime._rendezvous import check_port, roll_call

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ('hetjax', 'experiments', 'examples', 'models')
_PICKLING_MODULES = {'pickle', 'cPickle', '_pickle', 'dill', 'cloudpickle', 'shelve', 'marshal',
                     'joblib', 'jsonpickle'}
_NUMPY_NAMES = {'np', 'numpy', 'onp', 'jnp'}


def _violations(source: str, name: str = '<source>') -> list[str]:
  """Every place in ``source`` that could read (or write) a pickle, as ``name:line what``."""
  found = []
  for node in ast.walk(ast.parse(source, name)):
    where = f'{name}:{getattr(node, "lineno", 0)}'
    if isinstance(node, ast.Import):
      found += [f'{where} import {a.name}' for a in node.names
                if a.name.split('.')[0] in _PICKLING_MODULES]
    elif isinstance(node, ast.ImportFrom) and node.module:
      root = node.module.split('.')[0]
      if root in _PICKLING_MODULES or (root in {'numpy', 'jax'} and
                                       any(a.name == 'load' for a in node.names)):
        found.append(f'{where} from {node.module} import ...')
    elif isinstance(node, ast.Call):
      keywords = {k.arg: k.value for k in node.keywords}
      if 'allow_pickle' in keywords and not (
          isinstance(keywords['allow_pickle'], ast.Constant) and
          keywords['allow_pickle'].value is False):
        found.append(f'{where} allow_pickle other than False')
      func = node.func
      if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        continue
      call = f'{func.value.id}.{func.attr}'
      if func.value.id in _NUMPY_NAMES and func.attr == 'load' and 'allow_pickle' not in keywords:
        found.append(f'{where} {call}( without allow_pickle=False')
      elif call in {'torch.load', 'yaml.load', 'yaml.unsafe_load', 'yaml.full_load',
                    'pd.read_pickle', 'pandas.read_pickle'} or func.attr == 'read_pickle':
        found.append(f'{where} {call}(')
  return found


def test_the_scan_catches_each_way_to_read_a_pickle():
  bad = '\n'.join([
      'import pickle', 'import dill as d', 'from cloudpickle import loads', 'import shelve',
      'from numpy import load', 'x = np.load(path)', 'x = numpy.load(path, allow_pickle=True)',
      'x = jnp.load(path)', 'y = torch.load(f)', 'z = yaml.load(s)', 'w = df.read_pickle(p)',
      'np.save(p, a, allow_pickle=True)'])
  assert len(_violations(bad)) == 12
  assert _violations('import json\nx = np.load(p, allow_pickle=False)\nyaml.safe_load(s)') == []


def test_nothing_in_the_sources_reads_a_pickle():
  files = [p for d in SOURCES for p in sorted((ROOT / d).rglob('*.py'))]
  assert len(files) > 50
  found = [v for p in files
           for v in _violations(p.read_text(encoding='utf-8'), str(p.relative_to(ROOT)))]
  assert found == []


def _held(reuse_port: bool = False) -> socket.socket:
  sock = socket.socket()
  if reuse_port:  # as gRPC's servers do: JAX's coordinator would share the port
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
  sock.bind(('127.0.0.1', 0))
  sock.listen()
  return sock


@pytest.mark.parametrize('reuse_port', [False, True])
def test_check_port_names_a_taken_port_even_one_shared_with_reuseport(reuse_port):
  with _held(reuse_port) as held:
    port = held.getsockname()[1]
    with pytest.raises(ConfigError, match=rf'^port {port} on 127\.0\.0\.1 \(the thing\) is '
                       'already in use$'):
      check_port(f'127.0.0.1:{port}', 'the thing')
  check_port(f'127.0.0.1:{port}', 'the thing')  # free again


def test_a_roll_call_on_a_taken_port_is_a_config_error():
  with _held() as held:
    port = held.getsockname()[1]
    with pytest.raises(ConfigError, match=rf'^port {port} on 127\.0\.0\.1 \(the coordinator\) '
                       'is already in use$'):
      roll_call(f'127.0.0.1:{port}', 2, 0, timeout_s=1)


def test_a_parameter_server_transport_on_a_taken_port_is_a_config_error():
  with _held() as held:
    port = held.getsockname()[1]
    with pytest.raises(ConfigError, match=rf'^port {port} on 127\.0\.0\.1 \(this process\'s '
                       r'parameter-server transfer server\) is already in use$'):
      ps.Transport(bind=f'127.0.0.1:{port}')
  assert ps.Transport().address.startswith('127.0.0.1:')


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(('127.0.0.1', 0))
    return sock.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('HETJAX_', 'JAX_', 'SLURM_', 'OMPI_'))}
  return env | {'JAX_PLATFORMS': 'cpu', 'HETJAX_LAUNCHER_PID': str(os.getpid()),
                'HETJAX_INIT_TIMEOUT': '20', 'PYTHONPATH': str(ROOT)} | extra


def _start(code: str, env: dict[str, str]) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int | None, str, str]:
  """``(status, stdout, stderr)``; on timeout the process group is killed and status is None."""
  try:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    return None, out, err


_INITIALIZE = '''
from hetjax.cli import run_main
from hetjax.runtime import initialize
run_main('probe.py', initialize)
'''


@pytest.mark.multiprocess
@pytest.mark.parametrize('taken, workers, what', [
    ('coordinator', 1, 'the coordinator, HETJAX_COORDINATOR'),
    ('coordinator', 2, 'the coordinator, HETJAX_COORDINATOR'),
    ('bind', 1, 'the coordinator, JAX_COORDINATOR_BIND_ADDRESS'),
    ('transfer', 1, "worker 0's transfer socket, HETJAX_TRANSFER_ADDRESS"),
])
def test_a_taken_port_is_one_line_and_status_2(taken, workers, what):
  with _held() as held:
    busy = f'127.0.0.1:{held.getsockname()[1]}'
    env = _env(HETJAX_COORDINATOR=busy if taken == 'coordinator' else f'127.0.0.1:{_free_port()}',
               HETJAX_NUM_WORKERS=str(workers), HETJAX_WORKER_ID='0',
               HETJAX_TRANSFER_ADDRESS=busy if taken == 'transfer' else f'127.0.0.1:{_free_port()}')
    if taken == 'bind':
      env['JAX_COORDINATOR_BIND_ADDRESS'] = busy
    status, out, err = _finish(_start(_INITIALIZE, env))
  assert status == 2, (status, out, err)
  port = busy.rsplit(':', 1)[1]
  assert err.splitlines() == [f'probe.py: error: port {port} on 127.0.0.1 ({what}) is already '
                              'in use'], err
  assert 'Traceback' not in out + err


_WORKER = '''
import json, os, socket, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from hetjax.cli import run_main
from hetjax import ps
from hetjax.pipeline._transfer import move
from hetjax.runtime import initialize

def listening():
  """The (host, port) pairs this process listens on, from /proc/net/tcp{,6}."""
  mine = {os.readlink(f'/proc/self/fd/{fd}')[8:-1] for fd in os.listdir('/proc/self/fd')
          if os.path.exists(f'/proc/self/fd/{fd}') and
          os.readlink(f'/proc/self/fd/{fd}').startswith('socket:[')}
  found = []
  for table, family in (('tcp', socket.AF_INET), ('tcp6', socket.AF_INET6)):
    for line in open(f'/proc/net/{table}').read().splitlines()[1:]:
      fields = line.split()
      if fields[3] == '0A' and fields[9] in mine:  # LISTEN
        raw, port = fields[1].split(':')
        data = bytes.fromhex(raw)
        data = b''.join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
        found.append((socket.inet_ntop(family, data), int(port, 16)))
  return found

def run():
  ctx = initialize()
  if os.environ['MODE'] == 'late' and ctx.worker == 1:  # taken after initialize checked it
    held = socket.socket()
    held.bind(('127.0.0.1', int(os.environ['HETJAX_TRANSFER_ADDRESS'].rsplit(':', 1)[1])))
    held.listen()
  devices = jax.devices()
  mesh = Mesh(np.array(devices), ('x',))
  ones = jax.make_array_from_callback((len(devices),), NamedSharding(mesh, P('x')),
                                      lambda index: np.ones(1, np.float32))
  total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(ones))  # over gloo
  transport = ps.Transport()
  src, dst = (NamedSharding(Mesh(np.array([d]), ('batch',)), P('batch'))
              for d in (devices[0], devices[1]))
  spec = jax.ShapeDtypeStruct((4,), np.float32)
  value = jax.device_put(np.arange(4, dtype=np.float32), src) if ctx.worker == 0 else None
  moved = move(value, spec, src, dst)
  got = None if moved is None else np.asarray(moved.addressable_data(0)).tolist()
  print(json.dumps({'total': total, 'got': got, 'listen': listening(),
                    'ps': transport.address}), flush=True)

run_main('probe.py', run)
'''


def _job(mode: str) -> tuple[list[subprocess.Popen], int, list[int]]:
  coordinator, *transfer = (_free_port() for _ in range(3))
  procs = [_start(_WORKER, _env(MODE=mode, HETJAX_COORDINATOR=f'127.0.0.1:{coordinator}',
                                HETJAX_NUM_WORKERS='2', HETJAX_WORKER_ID=str(w),
                                HETJAX_TRANSFER_ADDRESS=f'127.0.0.1:{transfer[w]}',
                                JAX_NUM_CPU_DEVICES='1'))
           for w in range(2)]
  return procs, coordinator, transfer


def _is_loopback(host: str) -> bool:
  return host in ('::1', '::ffff:127.0.0.1') or host.startswith('127.')


@pytest.mark.multiprocess
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc/net/tcp')
def test_a_launched_job_listens_on_loopback_only():
  """Every socket a two-worker job listens on, after a gloo collective, a cross-host transfer
  and a parameter-server transport: the coordinator, gloo, the transfer socket and its data
  transports (JAX's default: 0.0.0.0), the transport. Gloo listens where the host name
  resolves (JAX has no public setting for it): that address is allowed too."""
  procs, coordinator, transfer = _job('loopback')
  results = [_finish(p) for p in procs]
  for status, out, err in results:
    assert status == 0, (status, out, err)
  rows = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]
  assert [r['total'] for r in rows] == [2.0, 2.0] and rows[1]['got'] == [0.0, 1.0, 2.0, 3.0]
  for w, row in enumerate(rows):
    hosts = {host for host, _ in row['listen']}
    ports = {port for _, port in row['listen']}
    named = socket.gethostbyname(socket.gethostname())
    assert all(_is_loopback(h) or h in (named, f'::ffff:{named}') for h in hosts), \
        (w, row['listen'])
    assert transfer[w] in ports and (coordinator in ports) == (w == 0), (w, row['listen'])
    assert len(row['listen']) >= 4 + 2 + 1 + (w == 0), row['listen']  # transports, ps, gloo
    assert row['ps'].startswith('127.0.0.1:')


@pytest.mark.multiprocess
def test_a_transfer_port_taken_after_the_check_is_one_line_and_status_2():
  """Worker 1's transfer port is taken after `initialize` checked it: its first cross-host
  transfer (`hetjax.pipeline`) is the one line. Worker 0, whose transfer waits for worker 1,
  is then killed: in a launched job the launcher stops it."""
  procs, _, transfer = _job('late')
  try:
    status, out, err = _finish(procs[1])
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
      p.communicate()
  assert status == 2, (status, out, err)
  assert 'Traceback' not in out + err
  assert err.splitlines() == [f'probe.py: error: port {transfer[1]} on 127.0.0.1 (this '
                              "process's transfer socket, jax_cross_host_transfer_socket_address) "
                              'is already in use'], err
