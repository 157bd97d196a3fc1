"""Every code block of the README runs, as written (run directories moved to a temporary one).

The quick-start block (``make demo``, ``make test``) is the one exception: ``make test`` is this
suite, and ``make demo`` runs in CI's fresh clone check of the two commands, not here.
"""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()
BLOCKS = re.findall(r'```(\w+)\n(.*?)```', README, flags=re.S)
TIMEOUT = 300


def _commands(block: str) -> list[str]:
  text = block.replace('\\\n', ' ')
  return [line.split('  #')[0].strip() for line in text.splitlines() if line.strip()]


SHELL = [b for lang, b in BLOCKS if lang == 'sh' and 'make demo' not in b]
PYTHON = [b for lang, b in BLOCKS if lang == 'python']


def test_the_readme_has_the_blocks_this_file_runs():
  assert len(SHELL) >= 5 and len(PYTHON) == 2
  assert [b for lang, b in BLOCKS if lang not in ('sh', 'python')] == []


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize('block', SHELL, ids=[f'sh{i}' for i in range(len(SHELL))])
def test_shell_block_runs(block, tmp_path):
  for command in _commands(block):
    args = [sys.executable if a == '.venv/bin/python' else a.replace('runs/', f'{tmp_path}/')
            for a in shlex.split(command)]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])


def test_library_block_runs():
  [block] = [b for b in PYTHON if 'training_steps' in b]
  namespace: dict = {}
  exec(compile(block, 'README.md', 'exec'), namespace)  # the README's own code
  assert int(namespace['state'].step) == 20


def test_sdpipe_block_is_the_example_that_runs_under_the_launcher():
  [block] = [b for b in PYTHON if 'ReplicaDriver' in b]
  assert block in (ROOT / 'examples' / 'sdpipe_replicas.py').read_text()
  assert any('examples/sdpipe_replicas.py' in b for b in SHELL)
