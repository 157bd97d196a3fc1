"""A launched worker of tests/test_foreign_models.py: several runs of the foreign models, one
after another, in one job, so that the job's start (JAX in four processes on two cores: most
of a short launch) is paid once, not once per run.

  python -m hetjax.launch --workers 4 --slowdown static:1,1,1,3 --timeout T -- \\
      python tests/foreign/_worker.py RUNS.json

``RUNS.json`` is a list of ``{"config": "tests.foreign.NAME:get_config", "overrides": [...],
"workdir": DIR}``; each is `hetjax.run.train` of that config with those ``key=value``
overrides (as ``experiments/train.py --set`` takes them) into ``DIR``. A run that raises
leaves its error in ``DIR/error-W.txt`` (W: the worker) and the job goes on with the next one,
so that one model's failure does not hide the others' results: a run that fails does so in
every worker alike (the same config, traced the same way), before its first collective.
"""

import json
import pathlib
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from absl import logging

from hetjax import run, runtime

ctx = runtime.initialize()
logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
for spec in json.loads(pathlib.Path(sys.argv[1]).read_text()):
  workdir = pathlib.Path(spec['workdir'])
  try:
    run.train(run.override(run.load_config(spec['config']), spec['overrides']), workdir,
              overwrite=True)
  except Exception:  # recorded for the test, which fails with it
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f'error-{ctx.worker}.txt').write_text(traceback.format_exc())
    print(f'worker {ctx.worker}: {workdir.name} failed', flush=True)
