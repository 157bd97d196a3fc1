"""One cluster description: the ``cluster.json`` a run writes is the file the planner reads."""

import json

import jax
import pytest

from hetjax import ConfigError
from hetjax.planner import ClusterSpec, WorkerSpec
from hetjax.runtime import Cluster, WorkerInfo, discover_cluster


def _older_run_file() -> list[dict]:
  """A cluster.json as runs wrote it before: a list, speed in samples/s, host memory."""
  return [{'worker': 0, 'host': 'a', 'devices': ['cpu:0', 'cpu:1'], 'device_kind': 'cpu',
           'memory_bytes': 16 << 30, 'speed': 512.0}]


def test_what_a_run_writes_the_planner_reads(tmp_path):
  cluster = discover_cluster(256.0)   # one process: its own worker, measured
  path = tmp_path / 'cluster.json'
  path.write_text(json.dumps(cluster.to_json(), indent=2) + '\n')   # as a run writes it
  spec = ClusterSpec.load(path)
  (mine,) = cluster.workers
  assert mine.flops_per_s > 0 and mine.memory_bytes > 0
  assert spec.workers == (WorkerSpec(len(jax.local_devices()), mine.flops_per_s,
                                     mine.memory_bytes),)
  assert spec.devices == len(mine.devices)
  # And the run reads it back as it wrote it.
  again = Cluster.from_json(json.loads(path.read_text()))
  assert again == cluster and again.speeds == (256.0,)


def test_the_planner_reads_a_run_of_several_workers():
  workers = tuple(WorkerInfo(w, 'h', tuple(f'cpu:{2 * w + i}' for i in range(n)), 'cpu', 4 << 30,
                             100.0 * (w + 1), 1e10 / (w + 1)) for w, n in enumerate((2, 1, 1)))
  spec = ClusterSpec.from_json(json.loads(json.dumps(Cluster(workers).to_json())))
  assert spec.counts == (2, 1, 1)
  assert [w.flops_per_s for w in spec.workers] == [1e10, 5e9, 1e10 / 3]
  assert {w.memory_bytes for w in spec.workers} == {float(4 << 30)}
  assert (spec.alpha_s, spec.beta_bytes_per_s) == (1e-5, 1.25e9)   # the planner's defaults


def test_an_older_run_file_still_loads_but_cannot_be_planned_for():
  old = Cluster.from_json(_older_run_file())
  assert old.speeds == (512.0,) and old.workers[0].devices == ('cpu:0', 'cpu:1')
  assert old.workers[0].flops_per_s is None
  with pytest.raises(ConfigError, match='older run') as info:
    ClusterSpec.from_json(_older_run_file())
  assert '\n' not in str(info.value)


def test_a_run_entry_without_a_device_speed_is_named():
  entry = Cluster.from_json(_older_run_file()).workers[0]
  with pytest.raises(ConfigError, match='worker 0: missing "speed"'):
    ClusterSpec.from_json(Cluster((entry,)).to_json())


def test_a_bad_run_entry_is_one_line():
  with pytest.raises(ConfigError, match='bad worker entry') as info:
    Cluster.from_json({'workers': [{'samples_per_s': 1.0}]})
  assert '\n' not in str(info.value)
