"""Runtime pieces that need no second process: roll call, telemetry split, cluster values."""

import json
import threading

import pytest

from hetjax import ConfigError
from hetjax.bench import find_free_ports, local_worker_info, split_collective
from hetjax.core import WorkerTiming
from hetjax.runtime import (
  Channel,
  Cluster,
  TelemetryGatherer,
)
from hetjax.runtime._rendezvous import roll_call


def _stats(worker, collective_s, step=1):
  return WorkerTiming(step=step, worker=worker, share=8, slowdown=1.0, data_s=0.001,
                      compute_s=0.01, dilation_s=0.0, collective_s=collective_s,
                      step_s=0.02 + collective_s)


def test_split_collective_charges_the_last_arrival_with_communication_only():
  rows = split_collective([_stats(1, 0.004), _stats(0, 0.030), _stats(2, 0.010)])
  assert [r['worker'] for r in rows] == [0, 1, 2]
  assert [r['comm_s'] for r in rows] == [0.004] * 3
  assert [round(r['wait_s'], 9) for r in rows] == [0.026, 0.0, 0.006]


def test_single_worker_gatherer_writes_rows(tmp_path):
  gatherer = TelemetryGatherer(None, worker=0, workers=1, path=tmp_path / 't.jsonl')
  gatherer.record(_stats(0, 0.005, step=1))
  gatherer.record(_stats(0, 0.006, step=2))
  gatherer.close()
  rows = [json.loads(line) for line in (tmp_path / 't.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows] == [1, 2] and rows[1]['wait_s'] == 0.0


def test_channel_needs_a_running_job():
  with pytest.raises(RuntimeError, match=r'call hetjax.runtime.initialize\(\)'):
    Channel('x')


def test_cluster_round_trips_through_json():
  cluster = Cluster((local_worker_info(123.0), local_worker_info(45.0)))
  again = Cluster.from_json(json.loads(json.dumps(cluster.to_json())))
  assert again == cluster and again.speeds == (123.0, 45.0) and again.size == 2
  assert cluster.workers[0].devices[0].startswith('cpu:')


def test_roll_call_lets_everyone_through_when_all_arrive():
  address = f'127.0.0.1:{find_free_ports(1)[0]}'
  errors = []

  def join(worker):
    try:
      roll_call(address, 3, worker, timeout_s=10)
    except ConfigError as e:
      errors.append(e)

  joiners = [threading.Thread(target=join, args=(w,)) for w in (1, 2)]
  for t in joiners:
    t.start()
  roll_call(address, 3, 0, timeout_s=10)
  for t in joiners:
    t.join(10)
  assert not errors


def test_roll_call_names_the_worker_that_never_came():
  address = f'127.0.0.1:{find_free_ports(1)[0]}'
  seen = []
  joiner = threading.Thread(target=lambda: seen.append(_attempt(address, 1)))
  joiner.start()
  with pytest.raises(ConfigError, match=r'^worker\(s\) 2 of 3 did not start within 1 s$'):
    roll_call(address, 3, 0, timeout_s=1)
  joiner.join(10)
  assert seen == ['worker(s) 2 of 3 did not start within 1 s']


def _attempt(address, worker):
  try:
    roll_call(address, 3, worker, timeout_s=5)
  except ConfigError as e:
    return str(e)
  return 'went through'
