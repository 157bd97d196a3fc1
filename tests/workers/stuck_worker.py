"""A worker of tests/test_elastic_launched.py: reports steps to the stall watchdog; worker 1
stops reporting at step 5 but stays alive (a hang), as a worker wedged in a hook would."""

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from hetjax import runtime
from hetjax.runtime import _elastic_env

ctx = runtime.initialize(init_timeout_s=30)
watchdog = runtime.ProgressWatchdog(runtime.Channel('stuck'), ctx.worker, ctx.workers,
                                    timeout_s=_elastic_env.stall_timeout(),
                                    verdict_dir=_elastic_env.verdict_dir())
for step in range(1, 1000):
  if ctx.worker == 1 and step == 5:
    time.sleep(600)  # stuck, heartbeat still beating
  watchdog.report(step)
  time.sleep(0.05)
