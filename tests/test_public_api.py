"""Scripts and examples use hetjax's public API only: no import of a private module or name
(``hetjax.run._build``, ``from hetjax import _errors``, ``from hetjax.runtime._verdict import
proc_stat``), so that a private module can move without breaking what users copy from.

The scan reads every ``experiments/**/*.py`` and ``examples/**/*.py`` with `ast` (imports inside
functions included) and names the file and line of each private import.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT_DIRS = ('experiments', 'examples')


def _private(dotted: str) -> bool:
  """Whether a ``hetjax…`` path has a component after ``hetjax`` that starts with ``_`` (dunders
  such as ``__version__`` are public)."""
  parts = dotted.split('.')
  return parts[0] == 'hetjax' and any(
      p.startswith('_') and not (p.startswith('__') and p.endswith('__')) for p in parts[1:])


def _dotted(node: ast.expr) -> str | None:
  """``a.b.c`` for an attribute chain on a name, else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return '.'.join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_uses(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
  """``'FILE:LINE: PATH'`` for each private hetjax path ``path`` imports or reads."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      names = [node.module] + [f'{node.module}.{a.name}' for a in node.names if a.name != '*']
    elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Del):
      names = [_dotted(node) or '']
    else:
      continue
    found += [f'{path.relative_to(root)}:{node.lineno}: {n}' for n in names if _private(n)]
  return sorted(set(found))


def _scripts(root: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for d in SCRIPT_DIRS for p in (root / d).rglob('*.py'))


def test_the_scan_sees_every_way_to_reach_a_private_module(tmp_path):
  (tmp_path / 'experiments' / 'sub').mkdir(parents=True)
  (tmp_path / 'experiments' / 'sub' / 'bad.py').write_text(
      'import hetjax.run._build\n'
      'from hetjax import _errors\n'
      'from hetjax.runtime import _distributed, launch_local\n'
      'def f():\n'
      '  from hetjax.runtime._verdict import proc_stat\n'
      '  import hetjax\n'
      '  return hetjax.sync._policies.RENAMED\n')
  (tmp_path / 'examples').mkdir()
  (tmp_path / 'examples' / 'good.py').write_text(
      'import hetjax\nfrom hetjax import __version__, runtime\nfrom hetjax.pipeline import gpipe\n'
      'from experiments import _harness\nfrom . import _local\nx = hetjax.runtime.launch_local\n')
  found = [u for p in _scripts(tmp_path) for u in private_uses(p, tmp_path)]
  assert found == [
      'experiments/sub/bad.py:1: hetjax.run._build',
      'experiments/sub/bad.py:2: hetjax._errors',
      'experiments/sub/bad.py:3: hetjax.runtime._distributed',
      'experiments/sub/bad.py:5: hetjax.runtime._verdict',
      'experiments/sub/bad.py:5: hetjax.runtime._verdict.proc_stat',
      'experiments/sub/bad.py:7: hetjax.sync._policies',
      'experiments/sub/bad.py:7: hetjax.sync._policies.RENAMED',
  ]


@pytest.mark.parametrize('directory', SCRIPT_DIRS)
def test_scripts_and_examples_import_only_public_hetjax_names(directory):
  paths = sorted((ROOT / directory).rglob('*.py'))
  assert paths, f'no scripts under {directory}/'
  found = [u for p in paths for u in private_uses(p)]
  assert found == [], 'private hetjax imports (export them from the package __init__):\n' + \
      '\n'.join(found)
