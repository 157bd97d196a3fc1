"""Every code block of the README and of the guides in ``docs/`` runs, as written (run and data
directories moved to a temporary one).

The blocks are collected from ``README.md`` and every ``docs/*.md`` (sorted), each shell block's
test id naming its page (``README-sh0``, ``heterogeneous-sh1``). The quick-start block
(``make demo``, ``make test``) is the one exception: ``make test`` is this suite, and
``make demo`` runs in CI's fresh clone check of the two commands, not here. The links are
checked too: each of the README's into ``docs/`` names a guide that exists, every guide is
linked from the README, and every relative link between the pages (with its anchor) resolves.
"""

import math
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from hetjax.models.gpt import BYTES
from tests.conftest import default_xla_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
GUIDES = sorted((ROOT / 'docs').glob('*.md'))
#: ``(page, language, block)`` for every fenced block of the README, then of each guide; a
#: page is named by its file's stem (``README``, ``heterogeneous``).
BLOCKS = [(page.stem, lang, block) for page in [README, *GUIDES]
          for lang, block in re.findall(r'```(\w+)\n(.*?)```', page.read_text(), flags=re.S)]
TIMEOUT = 300
DATA = re.compile(r'(?<![\w/])data/')  # a dataset directory of a block, e.g. data/mytext
#: Commands whose time is running programs, not compiling them, run at XLA's default level (the
#: suite's flags make slower code: wide & deep with 200,000 rows 15 CPU-seconds against 12, a
#: million 45 s against 20 s; plan.py, which times every candidate, 27 s against 18 s); the
#: others keep the suite's (`tests/conftest.py`: a 2-worker LB-BSP launch of the mlp 10 s
#: against 20 s).
RUN_BOUND = ('model_args.rows=200000', 'plan.py --config=wide_deep --json')
#: A markdown link's target, ``[text](target)``: a page, with or without an ``#anchor``.
LINK = re.compile(r'\]\(([^)\s]+)\)')


def _moved(arg: str, tmp_path: pathlib.Path) -> str:
  """``arg`` with a run directory (``runs/X``) or a dataset (``data/X``) moved under
  ``tmp_path``."""
  return DATA.sub(f'{tmp_path}/data/', arg.replace('runs/', f'{tmp_path}/'))


def _commands(block: str) -> list[str]:
  text = block.replace('\\\n', ' ')
  return [line.split('  #')[0].strip() for line in text.splitlines() if line.strip()]


#: ``(page, block)`` of each shell block that runs here (all but the quick start's).
SHELL_PAGES = [(page, b) for page, lang, b in BLOCKS if lang == 'sh' and 'make demo' not in b]
SHELL = [b for _, b in SHELL_PAGES]
PYTHON = [b for _, lang, b in BLOCKS if lang == 'python']


def _shell_ids() -> list[str]:
  """``PAGE-shI``: the I-th shell block that runs of that page."""
  seen: dict[str, int] = {}
  ids = []
  for page, _ in SHELL_PAGES:
    ids.append(f'{page}-sh{seen.get(page, 0)}')
    seen[page] = seen.get(page, 0) + 1
  return ids


def test_the_readme_with_its_guides_has_the_blocks_this_file_runs():
  """The README and the guides hold 12 shell blocks that run and 5 Python blocks, all told (a
  regex that silently found fewer would run nothing and pass), and no block of another
  language or of none (which nothing would run)."""
  assert len(SHELL) >= 12 and len(PYTHON) == 5
  fences = sum(len(re.findall(r'^```', p.read_text(), flags=re.M)) for p in [README, *GUIDES])
  assert fences == 2 * len(BLOCKS)
  assert [(page, lang) for page, lang, _ in BLOCKS if lang not in ('sh', 'python')] == []
  assert sum('make demo' in b for _, lang, b in BLOCKS if lang == 'sh') == 1


def _relative_links(page: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
  """``(file, anchor)`` of each link of ``page`` to a file of this checkout (not a URL); the
  anchor is '' when the link has none."""
  links = []
  for target in LINK.findall(page.read_text()):
    if re.match(r'[a-z]+:', target):
      continue
    path, _, anchor = target.partition('#')
    links.append(((page.parent / path).resolve() if path else page, anchor))
  return links


def _anchors(page: pathlib.Path) -> set[str]:
  """The anchors GitHub gives ``page``'s headings: lower case, spaces as hyphens, punctuation
  other than hyphens and underscores dropped."""
  headings = re.findall(r'^#+ (.+)$', re.sub(r'```.*?```', '', page.read_text(), flags=re.S),
                        flags=re.M)
  return {re.sub(r'[^\w\- ]', '', h.strip().lower()).replace(' ', '-') for h in headings}


def test_the_readme_links_to_guides_that_exist():
  """Every relative link of the README into ``docs/`` names a file there, and every guide of
  ``docs/`` is linked from the README (none is left unreachable from the first page)."""
  docs = (ROOT / 'docs').resolve()
  guides = [path for path, _ in _relative_links(README) if path.parent == docs]
  assert guides, 'the README links to no guide'
  assert [p.name for p in guides if p.suffix != '.md' or not p.is_file()] == []
  assert {g.resolve() for g in GUIDES} <= set(guides)


def test_every_link_between_the_pages_resolves():
  """Every relative link of the README and the guides names a file that exists and, with an
  ``#anchor``, one of that page's headings."""
  broken = [(page.name, path.name, anchor) for page in [README, *GUIDES]
            for path, anchor in _relative_links(page)
            if not path.is_file() or (anchor and anchor not in _anchors(path))]
  assert broken == []


def _run_python(block: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  """Runs ``block`` as written in a fresh interpreter of this machine's default JAX setup (one
  CPU device here: no device count set), from ``cwd`` (its run directories land there)."""
  return subprocess.run([sys.executable, '-c', block], cwd=cwd, capture_output=True, text=True,
                        timeout=TIMEOUT, env={**__import__('os').environ,
                                              'PYTHONPATH': str(ROOT)})


def _marked(block: str):
  """A block that launches workers (``hetjax.launch``) runs in the suite's one-at-a-time launch
  group; a block of single-process commands runs beside it, like any in-process test."""
  launches = 'hetjax.launch' in block
  return pytest.param(block, marks=[pytest.mark.multiprocess] if launches else [])


@pytest.mark.slow
@pytest.mark.parametrize('block', [_marked(b) for b in SHELL], ids=_shell_ids())
def test_shell_block_runs(block, tmp_path):
  """Each command as a user runs it; `RUN_BOUND` ones at XLA's default level."""
  for command in _commands(block):
    args = [sys.executable if a == '.venv/bin/python' else _moved(a, tmp_path)
            for a in shlex.split(command)]
    env = default_xla_env() if any(c in command for c in RUN_BOUND) else None
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                            env=env)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])


def test_the_run_bound_commands_are_in_the_pages():
  commands = [c for block in SHELL for c in _commands(block)]
  assert all(any(marker in c for c in commands) for marker in RUN_BOUND)


def test_library_block_runs(tmp_path):
  [block] = [b for b in PYTHON if 'training_steps' in b]
  result = _run_python(block + '\nassert int(state.step) == 20\n', tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert float(result.stdout.split()[-1]) > 0


def test_run_and_load_model_block_runs(tmp_path):
  """The notebook block: a run trained from Python, loaded back and evaluated; the model
  loaded is the one the run's last checkpoint holds (its accuracy on unseen rows is far above
  the 10% of chance after 40 steps)."""
  [block] = [b for b in PYTHON if 'load_model' in b]
  result = _run_python(block, tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  loss, accuracy = map(float, result.stdout.split()[-2:])
  assert (tmp_path / 'runs' / 'mlp-notebook' / 'summary.json').is_file()
  assert loss < 1.0 and accuracy > 0.5


def test_held_out_block_keeps_its_rows_out_of_training(tmp_path):
  """Issue 44: nothing showed how to give a model of one's own a held-out split. The block's
  task trains on 3,584 rows and evaluates on 512 others, none of them a training row."""
  [block] = [b for b in PYTHON if 'eval_data=ArraySource' in b]
  check = ("seen = {row.tobytes() for row in task.data.arrays['x']}\n"
           "assert not any(row.tobytes() in seen for row in task.eval_data.arrays['x'])\n")
  result = _run_python(block + check, tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split()[-2:] == ['3584', '512']


def test_eager_model_block_runs(tmp_path):
  """A shipped model built outside hetjax, eager sharding off, and called: its loss is an
  untrained model's, near ln 256 ≈ 5.55 (uniform logits over the stdlib's bytes). GPT-2's 0.02
  initialisation keeps the logits within a few tenths of zero, so the loss is off ln 256 by
  about a tenth (5.46 measured), far from the ~2 of a trained model."""
  [block] = [b for b in PYTHON if 'use_eager_sharding' in b]
  result = _run_python(block, tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert abs(float(result.stdout.split()[-1]) - math.log(BYTES)) < 0.5


def test_sdpipe_block_is_the_example_that_runs_under_the_launcher():
  [block] = [b for b in PYTHON if 'ReplicaDriver' in b]
  assert block in (ROOT / 'examples' / 'sdpipe_replicas.py').read_text()
  assert any('examples/sdpipe_replicas.py' in b for b in SHELL)
