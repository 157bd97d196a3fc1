"""Imports between hetjax's packages point down only: every subpackage (and every module at the
root) has a layer in `LAYERS`, and a module may import a package of its own layer or a lower
one, never a higher one; a new subpackage must be given a layer here. There is no import cycle
at start-up (each subpackage imports first in a fresh interpreter).

Some of these arrows are spelled out on their own: the planner uses the pipeline (stage
layouts, chains, `split_stages`); the pipeline must not import the planner, not even inside a
function: that was a ten-module cycle. Replica sync uses the pipeline and the virtual clock uses
replica sync, never the reverse. Core, the lowest subpackage, imports nothing of hetjax but its
errors.
"""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]
PACKAGE = ROOT / 'hetjax'
#: The shipped models live in the top-level ``models/`` folder and install as ``hetjax.models``
#: (pyproject.toml's ``package-dir``): a subpackage whose files are outside ``hetjax/``.
MODELS = 'models'
SUBPACKAGES = sorted([p.parent.name for p in PACKAGE.glob('*/__init__.py')] + [MODELS])


def package_dir(name: str) -> pathlib.Path:
  """The folder of subpackage ``hetjax.<name>``."""
  return ROOT / MODELS if name == MODELS else PACKAGE / name


def library_files() -> list[pathlib.Path]:
  """Every source file of the library: ``hetjax/`` and the models' folder."""
  return sorted(PACKAGE.rglob('*.py')) + sorted((ROOT / MODELS).rglob('*.py'))


def dotted_package(path: pathlib.Path, root: pathlib.Path | None = None) -> str:
  """The dotted package a library file belongs to (``hetjax.models`` for ``models/gpt.py``)."""
  parts = path.relative_to(root or ROOT).parts[:-1]
  return '.'.join(('hetjax', *parts) if parts[:1] == (MODELS,) else parts)


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
  """Every module ``path`` imports, anywhere in it (functions included), relative imports
  resolved against its package under ``root``, ``from a import b`` counted as both ``a`` and
  ``a.b``."""
  package = dotted_package(path, root)
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
  for path in sorted(package_dir(package).glob('*.py')):
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
  # A replica drives a PipelineTrainer (hetjax.replicas imports hetjax.pipeline), never the reverse.
  assert _violations('pipeline', lambda name: not name.startswith('hetjax.replicas')) == []


def test_replica_sync_does_not_import_its_virtual_clock():
  # hetjax.simulation's simulate_sync runs hetjax.replicas's policies, so replicas may not import it.
  assert _violations('replicas', lambda name: not name.startswith('hetjax.simulation')) == []


def test_core_imports_nothing_of_hetjax_but_its_errors():
  allowed = ('hetjax._errors', 'hetjax._links', 'hetjax.core')  # _links: the α–β model it exports
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
  assert {'core', 'pipeline', 'planner', 'replicas', 'simulation'} <= set(SUBPACKAGES)
  result = subprocess.run([sys.executable, '-W', 'ignore', '-c', _FRESH_IMPORTS, *SUBPACKAGES],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  assert json.loads(result.stdout.splitlines()[-1]) == [], result.stderr[-4000:]


def test_train_does_not_import_the_virtual_clocks():
  # hetjax.simulation's clocks run the train package's rules (the token end game), and
  # hetjax.replicas (which simulation imports) drives train's programs: train importing simulation
  # would close a cycle train → simulation → replicas → train.
  assert _violations('train', lambda name: not name.startswith('hetjax.simulation')) == []


def test_programs_meet_emulation_only_through_the_pace():
  # Emulated hosts and links reach a step program through one seam, `hetjax.core.Pace` (its
  # ``use_host``): the programs' packages never import the emulator, not even in a function.
  for package in ('train', 'pipeline', 'replicas'):
    assert _violations(package, lambda name: not name.startswith('hetjax.emulation')) == []


#: Types nothing outside the emulator may tell apart with ``isinstance``: a program takes any
#: `hetjax.core.Pace`, so asking which host, pace or links it got means the Protocol is missing
#: a member.
_SEAM_TYPES = {'Pace', 'EmulatedHost', 'KnownSpeedHost', 'LinkedHost', 'StagePace', 'HostPause',
               'ActionPace', 'Links', 'Exchange'}


def isinstance_types(path: pathlib.Path) -> list[tuple[int, str]]:
  """``(line, type)`` of every type an ``isinstance`` call in ``path`` tests (each member of a
  tuple of types on its own), the type as written (``balance.Oracle``)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == 'isinstance' and len(node.args) == 2):
      types = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
      found += [(node.lineno, ast.unparse(t)) for t in types]
  return found


def type_checks(files, policies) -> list[str]:
  """The ``isinstance`` checks of a host, pace or links type (outside ``hetjax/emulation``) or
  of a balance policy's type (outside ``hetjax/balance``) in ``files``: cost inputs reach a
  policy through its constructor (`hetjax.balance.KnownCosts`), never by asking what it is."""
  out = []
  for path in files:
    parts = path.relative_to(ROOT).parts
    for line, written in isinstance_types(path):
      name = written.rpartition('.')[2]
      seam = name in _SEAM_TYPES and parts[:2] != ('hetjax', 'emulation')
      policy = (written.startswith('balance.') or name in policies) and \
          parts[:2] != ('hetjax', 'balance')
      if seam or policy:
        out.append(f'{path.relative_to(ROOT)}:{line}: isinstance(…, {written})')
  return out


def test_the_type_scan_sees_a_host_and_a_policy_asked_for(tmp_path, monkeypatch):
  run = tmp_path / 'hetjax' / 'run'
  run.mkdir(parents=True)
  (run / '_bad.py').write_text(
      'def f(host, policy):\n'
      '  if isinstance(host, emulation.KnownSpeedHost): pass\n'
      '  return isinstance(policy, (balance.LBBSP, Oracle)) or isinstance(policy, dict)\n')
  monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
  assert type_checks([run / '_bad.py'], {'Oracle'}) == [
      'hetjax/run/_bad.py:2: isinstance(…, emulation.KnownSpeedHost)',
      'hetjax/run/_bad.py:3: isinstance(…, balance.LBBSP)',
      'hetjax/run/_bad.py:3: isinstance(…, Oracle)',
  ]


def test_nothing_asks_which_host_or_policy_it_got():
  from hetjax import balance

  assert type_checks(library_files(), set(balance.__all__)) == []


#: Each subpackage's layer (and the root's modules': its shared internals at the bottom, the
#: ``python -m hetjax.launch`` entry point at the top). Imports go from a layer to the same one
#: or a lower one.
LAYERS = {
    '_errors': 0,       # the root's shared internals: every package may import them
    '_checks': 0,
    '_links': 0,        # the α–β link model: pure arithmetic (core re-exports it)
    'core': 1,          # step stats, policies as values, hosts, the link model
    'data': 1,
    'sharding': 1,
    'emulation': 2,     # emulated hosts and links (core's link model)
    'runtime': 2,       # workers, launching, the coordination channel (core)
    'balance': 3,       # load-balancing policies (core, emulation)
    'report': 4,        # telemetry, throughput and goodput (balance, in its __main__)
    'train': 5,         # step programs and the loop (report's throughput, runtime's channel)
    'checkpoint': 6,    # saves train's state, as a hook of train's loop
    'pipeline': 7,      # pipeline parallelism (train, checkpoint, runtime)
    'ps': 7,            # the parameter server (train, checkpoint, runtime)
    'schmp': 7,         # scheduled model parallelism (core, data)
    'models': 8,        # the models (pipeline's chains, train's tasks)
    'planner': 8,       # plans and profiles (pipeline, train, runtime)
    'replicas': 8,      # a pipeline's replicas and their sync policies (pipeline, train)
    'simulation': 9,    # the virtual clocks (replicas' sync policies, train's end game)
    'run': 10,          # a run from a config: every package below
    'configs': 10,      # the shipped configs (run's Config; run loads them by name)
    'cli': 11,
    'launch': 11,       # hetjax/launch.py
    'bench': 12,        # the benchmarks' and tests' hooks into every package: nothing imports it
}


def _unit(path: pathlib.Path) -> str | None:
  """The `LAYERS` key of a hetjax file: its subpackage, or a root module's name (None for the
  root's ``__init__``, which is the face of the whole library)."""
  if path.is_relative_to(ROOT / MODELS):
    return MODELS
  parts = path.relative_to(PACKAGE).with_suffix('').parts
  if len(parts) > 1:
    return parts[0]
  return None if parts[0] == '__init__' else parts[0]


def _imported_unit(name: str) -> str | None:
  """The `LAYERS` key an imported ``hetjax.X…`` path reaches, or None (the root face, or a name
  it re-exports such as ``hetjax.ConfigError``)."""
  parts = name.split('.')
  if parts[0] != 'hetjax' or len(parts) < 2:
    return None
  first = parts[1]
  if (package_dir(first) / '__init__.py').exists() or (PACKAGE / f'{first}.py').exists():
    return first
  return None


def import_graph() -> dict[tuple[str, str], list[str]]:
  """``(importer, imported)`` -> the ``'FILE: MODULE'`` imports behind that arrow, between
  different `LAYERS` keys."""
  graph: dict[tuple[str, str], list[str]] = {}
  for path in library_files():
    unit = _unit(path)
    if unit is None:
      continue
    for name in sorted(imported_modules(path, ROOT)):
      target = _imported_unit(name)
      if target is not None and target != unit:
        graph.setdefault((unit, target), []).append(f'{path.relative_to(ROOT)}: {name}')
  return graph


def test_every_subpackage_and_root_module_has_a_layer():
  units = set(SUBPACKAGES) | {p.stem for p in PACKAGE.glob('*.py') if p.stem != '__init__'}
  assert units == set(LAYERS), ('give each new package a layer in LAYERS (and drop the gone): '
                                f'missing {sorted(units - set(LAYERS))}, '
                                f'gone {sorted(set(LAYERS) - units)}')


def test_imports_between_packages_point_down_the_layers():
  upward = [f'{src} (layer {LAYERS[src]}) imports {dst} (layer {LAYERS[dst]}): {where}'
            for (src, dst), wheres in sorted(import_graph().items())
            if src in LAYERS and dst in LAYERS and LAYERS[src] < LAYERS[dst]
            for where in wheres]
  assert upward == [], 'an import points up the layers:\n' + '\n'.join(upward)


def test_the_layer_scan_sees_an_upward_import(monkeypatch, tmp_path):
  package = tmp_path / 'hetjax'
  for name in ('core', 'train'):
    (package / name).mkdir(parents=True)
    (package / name / '__init__.py').write_text('')
  (package / '_errors.py').write_text('')
  (package / 'core' / '_stats.py').write_text(
      'from hetjax._errors import ConfigError\n'
      'def f():\n  from hetjax import train\n')
  monkeypatch.setattr(sys.modules[__name__], 'PACKAGE', package)
  monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
  assert import_graph() == {
      ('core', '_errors'): ['hetjax/core/_stats.py: hetjax._errors',
                            'hetjax/core/_stats.py: hetjax._errors.ConfigError'],
      ('core', 'train'): ['hetjax/core/_stats.py: hetjax.train'],
  }


def test_pyproject_installs_every_subpackage_from_its_folder():
  """pyproject.toml lists the packages by hand (the models' folder is outside ``hetjax/``): a new
  subpackage missing from the list would import here but not from an installed wheel."""
  import tomllib

  setuptools = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['setuptools']
  found = {'hetjax'} | {f'hetjax.{name}' for name in SUBPACKAGES}
  data = {'hetjax.configs.plans'}  # the shipped plans: a folder of JSON files, no module
  assert set(setuptools['packages']) == found | data
  assert setuptools['package-dir'] == {f'hetjax.{MODELS}': MODELS}


def test_configs_are_read_and_checked_without_jax():
  """`hetjax.run`'s face imports its config pieces only: a program that reads, overrides or
  checks a config (a launcher, a sweep, ``--help``) pays for no JAX, Flax or Optax."""
  code = ('import sys\nfrom hetjax import run\n'
          'for name in run.config_names():\n'
          '  run.Config.from_json(run.override(run.load_config(name), ["steps=3"]).to_json())\n'
          'print(sorted(m for m in ("jax", "flax", "optax", "orbax") if m in sys.modules))\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-1] == '[]'
