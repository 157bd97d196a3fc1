"""Scripts and examples use hetjax's public API only: no import of a private module or name
(``hetjax.run._build``, ``from hetjax import _errors``, ``from hetjax.runtime._verdict import
proc_stat``), so that a private module can move without breaking what users copy from.

Inside hetjax, packages meet through their faces: a module may import the private modules of its
own package and of the packages above it (the root's shared internals ``hetjax._errors`` and
``hetjax._checks`` for every module; ``hetjax.planner._cost`` inside ``hetjax.planner``), but not
another package's (``from hetjax.core._links import LinkCost`` outside ``hetjax.core``: use
``from hetjax.core import LinkCost``, and export the name from the package's ``__init__`` if it
is not yet).

The scan reads every ``experiments/**/*.py``, ``examples/**/*.py`` and ``hetjax/**/*.py`` with
`ast` (imports inside functions and relative imports included) and names the file and line of
each private import.
"""

import ast
import pathlib

import pytest

from tests.test_layering import dotted_package

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT_DIRS = ('experiments', 'examples')


def _private_owner(dotted: str) -> str | None:
  """The package whose private member a ``hetjax…`` path reaches (``hetjax.core`` for
  ``hetjax.core._links.LinkCost``, ``hetjax`` for ``hetjax._errors``), or None for a public path
  (dunders such as ``__version__`` are public)."""
  parts = dotted.split('.')
  if parts[0] != 'hetjax':
    return None
  for i, part in enumerate(parts[1:], 1):
    if part.startswith('_') and not (part.startswith('__') and part.endswith('__')):
      return '.'.join(parts[:i])
  return None


def _dotted(node: ast.expr) -> str | None:
  """``a.b.c`` for an attribute chain on a name, else None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return '.'.join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_uses(path: pathlib.Path, root: pathlib.Path = ROOT,
                 inside: str | None = None) -> list[str]:
  """``'FILE:LINE: PATH'`` for each private hetjax path ``path`` imports or reads.

  ``inside``: the dotted package ``path`` belongs to, for a module of hetjax itself; then its
  relative imports are resolved, and the private members of ``inside`` and of the packages above
  it are allowed."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
      if node.level and inside is None:
        continue   # a script's own package, not hetjax
      module = node.module
      if node.level:
        base = inside.split('.')[:len(inside.split('.')) - node.level + 1]
        module = '.'.join(base + ([node.module] if node.module else []))
      names = [module] + [f'{module}.{a.name}' for a in node.names if a.name != '*']
    elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Del):
      names = [_dotted(node) or '']
    else:
      continue
    for name in names:
      owner = _private_owner(name)
      if owner is None or (inside is not None and (inside + '.').startswith(owner + '.')):
        continue
      found.append(f'{path.relative_to(root)}:{node.lineno}: {name}')
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
      '  return hetjax.replicas._policies.RENAMED\n')
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
      'experiments/sub/bad.py:7: hetjax.replicas._policies',
      'experiments/sub/bad.py:7: hetjax.replicas._policies.RENAMED',
  ]


@pytest.mark.parametrize('directory', SCRIPT_DIRS)
def test_scripts_and_examples_import_only_public_hetjax_names(directory):
  paths = sorted((ROOT / directory).rglob('*.py'))
  assert paths, f'no scripts under {directory}/'
  found = [u for p in paths for u in private_uses(p)]
  assert found == [], 'private hetjax imports (export them from the package __init__):\n' + \
      '\n'.join(found)


#: The one package that may reach into every other's private modules: ``hetjax.bench``, the hooks
#: that hetjax's benchmarks and tests measure with (not part of the public surface; nothing in
#: hetjax imports it, `tests/test_layering.py` puts it on the top layer).
HOOKS = 'bench'


def _hetjax_uses(root: pathlib.Path = ROOT) -> list[str]:
  files = sorted((root / 'hetjax').rglob('*.py')) + sorted((root / 'models').rglob('*.py'))
  return [u for p in files
          if p.relative_to(root).parts[:2] != ('hetjax', HOOKS)
          for u in private_uses(p, root, dotted_package(p, root))]


def test_the_scan_of_hetjax_allows_only_its_own_package_and_the_root(tmp_path):
  package = tmp_path / 'hetjax' / 'planner'
  package.mkdir(parents=True)
  (tmp_path / 'hetjax' / '__init__.py').write_text(
      'from hetjax import _errors\nfrom hetjax.runtime import _elastic\n')
  (package / '__init__.py').write_text('from ._cost import cost as cost\n')
  (package / '_cost.py').write_text(
      'from hetjax._errors import ConfigError\n'
      'from hetjax import _checks\n'
      'from hetjax.planner._layout import Layout\n'
      'from hetjax.planner import _profile_timing\n'
      'from . import _hlo\n'
      'from hetjax.core import LinkCost\n'
      'from hetjax.core._links import ring_bytes\n'
      'from ..pipeline._chain import check_chain\n'
      'def f():\n'
      '  from hetjax.runtime import _calibrate\n'
      '  import hetjax\n'
      '  return hetjax.replicas._policy.SyncPolicy, hetjax.planner._cost.cost\n')
  assert _hetjax_uses(tmp_path) == [
      'hetjax/__init__.py:2: hetjax.runtime._elastic',
      'hetjax/planner/_cost.py:10: hetjax.runtime._calibrate',
      'hetjax/planner/_cost.py:12: hetjax.replicas._policy',
      'hetjax/planner/_cost.py:12: hetjax.replicas._policy.SyncPolicy',
      'hetjax/planner/_cost.py:7: hetjax.core._links',
      'hetjax/planner/_cost.py:7: hetjax.core._links.ring_bytes',
      'hetjax/planner/_cost.py:8: hetjax.pipeline._chain',
      'hetjax/planner/_cost.py:8: hetjax.pipeline._chain.check_chain',
  ]


def test_hetjax_packages_import_each_other_through_their_faces():
  found = _hetjax_uses()
  assert found == [], ("another package's private module imported (import the name from the "
                       "package instead, exporting it from its __init__ if needed):\n" +
                       '\n'.join(found))

