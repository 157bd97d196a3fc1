"""A run's emulated hosts recorded in its directory and reused by another (issue 44): the uniform
and the LB-BSP run of one launch calibrated their hosts 5x apart, so their reports compared
two clusters. ``emulation.hosts=RUN_DIR`` (``--hosts=RUN_DIR``) runs the second on the first's
hosts; a calibration's retries go to ``run.json``, not the console."""

from __future__ import annotations

import json
import pathlib

import pytest
from absl import flags

from hetjax import ConfigError, run
from hetjax.emulation import MARGIN, KnownSpeedHost, StaticTrace, _build_host
from hetjax.report.__main__ import main as report
from hetjax.run import _hosts
from hetjax.run._sections import Mode
from hetjax.train import WorkerTrainer
from tests.conftest import require_devices

#: A small run on one worker of known speed, in mode shares.
SMALL = ['model.args.hidden=16', 'model.args.width=8', 'mesh=8x1', 'global_batch=64', 'steps=3',
         'log_every=3', 'checkpoint_every=3', 'eval.enabled=False', 'logging.mfu=False',
         'logging.tensorboard=False', 'slowdown=static:1']


def test_a_second_policy_runs_on_the_hosts_the_first_recorded(tmp_path, monkeypatch, capsys):
  """The user's case: ``--policy=uniform`` calibrates, ``--policy=lbbsp --hosts=FIRST`` runs on
  exactly its hosts without timing anything, and the two compare without a warning."""
  require_devices(8)
  # A step of 2 ms whatever its rows (a small model): no cost per row resolves, two retries.
  monkeypatch.setattr(WorkerTrainer, 'time_gradient',
                      lambda self, state, rows, repeats=5: (2e-3,) * repeats)
  first, second = tmp_path / 'first', tmp_path / 'second'
  run.train(run.override(run.load_config('mlp'), [*SMALL, 'policy=uniform']), first)
  out = capsys.readouterr().out
  assert 'measuring again' not in out and 'no cost per row resolved on worker 0' in out
  recorded = json.loads((first / 'run.json').read_text())
  # All per row: 2 ms over the 16 rows of a quarter share, with the margin.
  assert (recorded['host_row_s'], recorded['host_fixed_s']) == (MARGIN * 2e-3 / 16, 0.0)
  assert recorded['host_source'] == 'calibrated'
  assert [r.split(' (')[0] for r in recorded['host_calibration_retries']] == [
      f'worker 0: host calibration {a} of 3 resolved no cost per row' for a in (1, 2)]

  def no_calibration(*args, **kwargs):
    raise AssertionError('a run on reused hosts calibrates nothing')

  monkeypatch.setattr(_build_host, 'calibrate_row_cost', no_calibration)
  run.train(run.override(run.load_config('mlp'), [*SMALL, 'policy=lbbsp', f'hosts={first}']),
            second)
  reused = json.loads((second / 'run.json').read_text())
  assert reused['policy'] == 'lbbsp-ewma'
  assert {k: reused[k] for k in ('host_row_s', 'host_fixed_s', 'host_source', 'hosts_from',
                                 'host_calibration_retries')} == {
      'host_row_s': recorded['host_row_s'], 'host_fixed_s': 0.0, 'host_source': 'reused',
      'hosts_from': str(first), 'host_calibration_retries': None}
  capsys.readouterr()
  assert report([str(first), str(second), '--no-plots']) == 0
  table = capsys.readouterr().out
  assert 'warning' not in table and f'reused from {first}' in table


def _run_dir(path: pathlib.Path, **fields) -> str:
  path.mkdir()
  (path / 'run.json').write_text(json.dumps({'mode': 'shares', **fields}))
  return str(path)


def _config(*assignments: str) -> run.Config:
  return run.override(run.load_config('mlp'), list(assignments))


def test_reuse_pins_the_recorded_hosts(tmp_path):
  where = _run_dir(tmp_path / 'a', host_row_s=2.5e-5, host_fixed_s=1e-3)
  pinned = _hosts.reuse(_config(f'hosts={where}'), Mode.SHARES, 'static:1,3', 'rows and fixed')
  assert (pinned.emulation.host_row_s, pinned.emulation.host_fixed_s) == (2.5e-5, 1e-3)
  assert pinned.emulation.hosts == where and _hosts.source_of(pinned) == _hosts.REUSED
  # The same numbers given beside it are no conflict; no hosts named leaves the config alone.
  same = _config(f'hosts={where}', 'host_row_s=2.5e-5', 'host_fixed_s=1e-3')
  assert _hosts.reuse(same, Mode.SHARES, 'static:1,3', 'rows and fixed') == pinned
  assert _hosts.reuse(_config(), Mode.SHARES, 'static:1,3', 'rows and fixed') == _config()


@pytest.mark.parametrize('fields, assignments, mode, slowdown, fragment', [
    (None, (), Mode.SHARES, 'static:1,3', 'no run directory'),
    ({}, (), Mode.SHARES, 'static:1,3', 'holds no run.json (not a run directory of hetjax-train)'),
    ({'host_row_s': None, 'host_fixed_s': None}, (), Mode.SHARES, 'static:1,3',
     'run.json records no hosts (that run emulated none'),
    ({'host_row_s': 1e-4}, ('host_row_s=2e-4',), Mode.SHARES, 'static:1,3',
     'gives host_row_s=0.0001, host_fixed_s=0.0, and this config sets host_row_s=0.0002'),
    ({'host_row_s': 1e-4}, (), Mode.SPMD, None, 'this run emulates none: give it a slowdown'),
    ({'host_row_s': 1e-4}, (), Mode.PLAN, 'static:1,3', "a plan's stages are paced by their "
                                                       'roofline'),
    ({'host_row_s': 1e-4, 'mode': 'schmp'}, (), Mode.SHARES, 'static:1,3',
     "that run's hosts cost a unit of SchMP work (mode schmp), this run's a row"),
    ({'host_row_s': 1e-4, 'host_fixed_s': 1e-3}, (), Mode.PS, 'static:1,3',
     'mode ps takes a cost per row alone: give host_row_s=0.0001 instead'),
])
def test_hosts_it_cannot_reuse_are_one_line(tmp_path, fields, assignments, mode, slowdown,
                                            fragment):
  where = tmp_path / 'a'
  if fields is not None:
    where.mkdir()
    if fields:
      (where / 'run.json').write_text(json.dumps({'mode': 'shares', **fields}))
  with pytest.raises(ConfigError) as error:
    _hosts.reuse(_config(f'hosts={where}', *assignments), mode, slowdown,
                 run.MODES[mode].hosts)
  message = str(error.value)
  assert message.startswith(f'emulation.hosts={where}') and fragment in message, message
  assert '\n' not in message


def test_the_hosts_flag_and_its_flat_name_set_emulation_hosts():
  assert _config('hosts=runs/first').emulation.hosts == 'runs/first'
  assert _config('emulation.hosts=runs/first', 'hosts=None').emulation.hosts is None
  with pytest.raises(ConfigError, match=r'emulation\.hosts must be a run directory'):
    run.EmulationConfig(hosts='  ')
  from hetjax.cli import train

  try:
    flags.FLAGS(['train.py', '--config=mlp', '--hosts=runs/first'])
    assert train._config().emulation.hosts == 'runs/first'
  finally:
    flags.FLAGS.unparse_flags()


def test_run_json_says_where_the_hosts_came_from(tmp_path):
  host = KnownSpeedHost(StaticTrace((1.0, 3.0)), 0, row_s=1e-4, fixed_s=1e-3)
  where = _run_dir(tmp_path / 'a', host_row_s=1e-4, host_fixed_s=1e-3)
  assert _hosts.recorded(host, _config(), ['worker 1: again']) == {
      'host_row_s': 1e-4, 'host_fixed_s': 1e-3, 'host_source': 'calibrated',
      'host_calibration_retries': ['worker 1: again']}
  assert _hosts.recorded(host, _config('host_row_s=1e-4'))['host_source'] == 'declared'
  assert _hosts.recorded(host, _config(f'hosts={where}')) == {
      'host_row_s': 1e-4, 'host_fixed_s': 1e-3, 'host_source': 'reused', 'hosts_from': where,
      'host_calibration_retries': None}
  assert _hosts.recorded(None, _config()) == {'host_row_s': None, 'host_fixed_s': None,
                                              'host_source': None,
                                              'host_calibration_retries': None}
