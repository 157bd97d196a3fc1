"""One checkpointer protocol: the four checkpointers (SPMD state, stages, replicas, servers) have
exactly the members the runner uses, with the same signatures, and the same record."""

from __future__ import annotations

import inspect
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from hetjax.checkpoint import Checkpointer, CheckpointerProtocol
from hetjax.pipeline import StageCheckpointer
from hetjax.ps import ServerCheckpointer, ServerState
from hetjax.replicas import ReplicaCheckpointer
from hetjax.train import TrainState

CHECKPOINTERS = [Checkpointer, StageCheckpointer, ReplicaCheckpointer, ServerCheckpointer]
MEMBERS = ['latest_step', 'all_steps', 'read_meta', 'restore', 'policy_state', 'hook', 'close']


def _parameters(function):
  return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
          if p.name != 'self']


def test_the_protocol_declares_what_the_runner_uses():
  declared = {name for name, _ in inspect.getmembers(CheckpointerProtocol)
              if not name.startswith('_')}
  assert declared == set(MEMBERS)
  assert 'directory' in CheckpointerProtocol.__annotations__


@pytest.mark.parametrize('cls', CHECKPOINTERS, ids=lambda c: c.__name__)
def test_every_checkpointer_has_the_protocols_members_and_signatures(cls):
  for name in MEMBERS:
    assert _parameters(getattr(cls, name)) == _parameters(getattr(CheckpointerProtocol, name)), \
        f'{cls.__name__}.{name}'


def test_checkpointers_are_the_protocol_and_write_the_same_record(tmp_path):
  spmd = Checkpointer(tmp_path / 'spmd', asynchronous=False)
  server = ServerCheckpointer(tmp_path, server=0)
  assert isinstance(spmd, CheckpointerProtocol) and isinstance(server, CheckpointerProtocol)
  assert server.directory == str(tmp_path / 'server-0')
  w = jnp.arange(4, dtype=jnp.float32)
  spmd.save(TrainState(jnp.int32(3), {'w': w}, ()), {'run': 1}, policy_state={'n': 2})
  server.save(ServerState(3, [w], ()), {'run': 1}, policy_state={'n': 2})
  records = [spmd.read_meta(), server.read_meta(3)]
  assert records[0]['checksums']['params/w'] == records[1]['checksums']['params/0']
  for record, ckpt in zip(records, (spmd, server), strict=True):
    assert record['step'] == 3 and record['run'] == 1
    assert ckpt.policy_state(record, {'n': 0}) == {'n': 2}
  restored, _ = server.restore(ServerState(0, [np.zeros(4, np.float32)], ()))
  assert restored.step == 3 and isinstance(restored.params[0], np.ndarray)  # no sharding: host
  np.testing.assert_array_equal(restored.params[0], w)
  spmd.close()
  server.close()


def test_importing_the_checkpointers_leaves_logging_alone():
  """Orbax's import configures the root logger (absl's ``basicConfig``), which changes how a
  process's warnings print (the sync service's "worker 2 dropped" line); it is imported when a
  checkpointer is first made, not with `hetjax.checkpoint`, `hetjax.pipeline` or `hetjax.ps`."""
  code = ('import logging, sys; import hetjax.checkpoint, hetjax.pipeline, hetjax.ps; '
          'print(sorted(m for m in sys.modules if m.startswith("orbax")), logging.root.handlers)')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == '[] []'
