"""Arrows point down only (DESIGN.md's layers): no import cycle, and the layers that must stay
below others do not import them.

The planner uses the pipeline (stage layouts, chains, `split_stages`); the pipeline must not
import the planner, not even inside a function: that was a ten-module cycle. Replica sync uses
the pipeline and the virtual clock uses replica sync, never the reverse. Core, the lowest layer,
imports nothing of hetjax but its errors.
"""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]
PACKAGE = ROOT / 'hetjax'
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob('*/__init__.py'))


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
  """Every module ``path`` imports, anywhere in it (functions included), relative imports
  resolved against its package under ``root``, ``from a import b`` counted as both ``a`` and
  ``a.b``."""
  package = '.'.join(path.relative_to(root).with_suffix('').parts[:-1])
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split('.')[:len(package.split('.')) - node.level + 1]
        module = '.'.join(base + ([node.module] if node.module else []))
      else:
        module = node.module
      found.add(module)
      found.update(f'{module}.{a.name}' for a in node.names)
  return found


def _violations(package: str, allowed) -> list[str]:
  out = []
  for path in sorted((PACKAGE / package).glob('*.py')):
    for name in sorted(imported_modules(path, ROOT)):
      if (name == 'hetjax' or name.startswith('hetjax.')) and not allowed(name):
        out.append(f'{path.relative_to(ROOT)} imports {name}')
  return out


def test_the_scan_sees_every_way_to_import_the_planner(tmp_path):
  pipeline = tmp_path / 'hetjax' / 'pipeline'
  pipeline.mkdir(parents=True)
  source = ('import hetjax.planner\nfrom hetjax import planner\nfrom ..planner import x\n'
            'def f():\n  from hetjax.planner._cost import y\n')
  (pipeline / '_bad.py').write_text(source)
  found = {n for n in imported_modules(pipeline / '_bad.py', tmp_path) if 'planner' in n}
  assert {'hetjax.planner', 'hetjax.planner._cost', 'hetjax.planner.x'} <= found


def test_the_pipeline_does_not_import_the_planner():
  assert _violations('pipeline', lambda name: not name.startswith('hetjax.planner')) == []


def test_the_pipeline_does_not_import_replica_sync():
  # A replica drives a PipelineTrainer (hetjax.sync imports hetjax.pipeline), never the reverse.
  assert _violations('pipeline', lambda name: not name.startswith('hetjax.sync')) == []


def test_replica_sync_does_not_import_its_virtual_clock():
  # hetjax.simulation's simulate_sync runs hetjax.sync's policies, so sync may not import it.
  assert _violations('sync', lambda name: not name.startswith('hetjax.simulation')) == []


def test_core_imports_nothing_of_hetjax_but_its_errors():
  allowed = ('hetjax._errors', 'hetjax.core')
  assert _violations('core', lambda name: name.startswith(allowed)) == []


_FRESH_IMPORTS = r"""
import importlib, json, os, sys, traceback
import numpy, jax, jax.numpy, flax.nnx, optax, orbax.checkpoint   # third-party only: the slow part
failed = []
for name in sys.argv[1:]:
  pid = os.fork()
  if pid == 0:   # a child with no hetjax module loaded imports this subpackage first
    try:
      importlib.import_module('hetjax.' + name)
    except BaseException:
      traceback.print_exc()
      os._exit(1)
    os._exit(0)
  if os.waitpid(pid, 0)[1]:
    failed.append(name)
print(json.dumps(failed))
"""


def test_every_subpackage_imports_first_in_a_fresh_interpreter():
  """A cycle shows as an ImportError (a partly initialised module) only for some import orders:
  each subpackage is imported first, in a process where no hetjax module is loaded yet (forked
  from one that loaded only JAX, Flax, Optax and Orbax, to keep it to seconds)."""
  assert {'core', 'pipeline', 'planner', 'simulation', 'sync'} <= set(SUBPACKAGES)
  result = subprocess.run([sys.executable, '-W', 'ignore', '-c', _FRESH_IMPORTS, *SUBPACKAGES],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  assert json.loads(result.stdout.splitlines()[-1]) == [], result.stderr[-4000:]


def test_train_does_not_import_the_virtual_clocks():
  # hetjax.simulation's clocks run the train package's rules (the token end game), and
  # hetjax.sync (which simulation imports) drives train's programs: train importing simulation
  # would close a cycle train → simulation → sync → train.
  assert _violations('train', lambda name: not name.startswith('hetjax.simulation')) == []
