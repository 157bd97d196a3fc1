"""The suite's test durations, for ordering the work of `make test`'s two test processes.

`tests/conftest.py` hands the longest units of work out first (longest processing time first:
a 68 s test started last would leave the other process idle for most of it). The durations come
from an earlier run's ``--durations`` report; a test not listed counts `DEFAULT_S`. A stale
table only orders the work less well. To refresh it after a full run::

  .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=300 > /tmp/suite.txt
  .venv/bin/python tests/durations.py /tmp/suite.txt
"""

import json
import pathlib
import re
import sys

TABLE = pathlib.Path(__file__).with_name('durations.json')
DEFAULT_S = 0.5
_LINE = re.compile(r'^([0-9.]+)s (?:setup|call|teardown)\s+(\S+)$')


def load() -> dict[str, float]:
  """``{node id without its @group: seconds}``, empty if the table is missing or unreadable."""
  try:
    return {k: float(v) for k, v in json.loads(TABLE.read_text()).items()}
  except (OSError, ValueError, AttributeError):
    return {}


def parse(report: str) -> dict[str, float]:
  """Seconds per test (setup + call + teardown) from pytest's ``--durations`` lines."""
  seconds: dict[str, float] = {}
  for line in report.splitlines():
    if m := _LINE.match(line.strip()):
      node = m[2].split('@')[0]
      seconds[node] = seconds.get(node, 0.0) + float(m[1])
  return {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= 1.0}


if __name__ == '__main__':
  TABLE.write_text(json.dumps(parse(pathlib.Path(sys.argv[1]).read_text()), indent=0) + '\n')
