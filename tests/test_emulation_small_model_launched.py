"""A small model on three launched workers of speeds 1, 1, 3: calibration neither fails nor
starves the slow host (it did: 'calibration found no cost per row', exit status 2, or shares
[54, 72, 2])."""

import json
import pathlib
import sys

import pytest

from hetjax.runtime import launch_local

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240
BATCH = 128


@pytest.mark.multiprocess
@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_lbbsp_gives_a_3x_slow_host_of_a_small_model_about_a_seventh(tmp_path):
  """Hosts all per row (the width-8 MLP's step is dispatch): balanced step times want shares
  in proportion to speed, 3/7, 3/7, 1/7 of 128 = 54.9, 54.9, 18.3. LB-BSP balances the times
  it measures, which are the hosts' only while the compute stays under its host's time; on two
  shared cores compute spikes of 5–20 ms meet hosts of 3–5 ms a step, and a spike reads as a
  worker up to twice as slow (one run of four settled at 12 rows from step 24 on). So each
  last share must be within a factor 2 of its ideal; a host that is all fixed cost gives the
  slow worker 1 or 2 rows (and failed its calibration before that)."""
  command = [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--config=mlp',
             '--mesh=1x1', '--policy=lbbsp', '--set', 'model_args.hidden=16', '--set',
             'model_args.width=8', '--set', f'global_batch={BATCH}', '--steps=30',
             f'--workdir={tmp_path}', '--nocompilation_cache']
  with open(tmp_path / 'out.log', 'w') as out:
    result = launch_local(command, workers=3, slowdown='static:1,1,3', timeout=LAUNCH_TIMEOUT,
                          init_timeout=60, stdout=out)
  log = (tmp_path / 'out.log').read_text()
  assert result.returncode == 0, (result, log[-3000:])
  shares = json.loads((tmp_path / 'summary.json').read_text())['last_shares']
  ideal = [BATCH * speed / 7 for speed in (3, 3, 1)]
  assert sum(shares) == BATCH, shares
  assert all(i / 2 <= n <= 2 * i for n, i in zip(shares, ideal, strict=True)), shares
  assert 'no cost per row resolved' in log  # the notice, once, from worker 0
