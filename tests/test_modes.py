"""The mode registry (`hetjax.run.MODES`) is the one description of each mode: every mode has an
entry, an option a mode does not take is refused in one line naming the modes that do, and the
``--mode`` help and `run.load_model`'s modes come from it. The run package's modules import
one another without a cycle."""

import pathlib

import pytest

from hetjax import ConfigError, run, runtime
from hetjax.run import _modes, _trained
from tests.test_layering import imported_modules

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: One assignment that sets each option of `hetjax.run._modes.OPTIONS`.
SETS = {
    'plan': 'parallelism.plan=hetjax/configs/plans/pure_dp.json',
    'policy': 'policy=lbbsp',
    'shares': 'balance.shares=[128,128]',
    'slowdown': 'slowdown=static:1,2',
    'host_fixed_s': 'emulation.host_fixed_s=0.001',  # with host_row_s, below
    'network': 'network=link:1:10',
    'overlap': 'overlap=True',
    'rules': 'parallelism.rules.kv=model',
    'sync': 'pipeline.sync=all-reduce',
    'local': 'local.inner_steps=1',
}


def test_every_mode_but_auto_has_one_entry_and_every_option_a_setting():
  assert set(run.MODES) == set(run.Mode) - {run.Mode.AUTO}
  assert all(entry.mode is mode for mode, entry in run.MODES.items())
  assert set(SETS) == set(_modes.OPTIONS)
  assert {e.trains for e in run.MODES.values()} == {'model', 'app'}


@pytest.mark.parametrize('workers', [1, 2])
@pytest.mark.parametrize('option', sorted(SETS))
@pytest.mark.parametrize('mode', [m for m in run.MODES], ids=lambda m: m.value)
def test_an_option_is_refused_exactly_where_its_mode_does_not_take_it(mode, option, workers):
  sets = [f'mode={mode.value}', SETS[option]]
  if option == 'host_fixed_s':
    sets.insert(1, 'emulation.host_row_s=0.001')  # the two pin a host together
  config = run.override(run.load_config('lasso' if mode is run.Mode.SCHMP else 'mlp'), sets)
  entry, ctx = run.MODES[mode], runtime.WorkerContext(0, workers, None)
  assert _modes.OPTIONS[option].given(config, ctx)
  if entry.takes(option, workers):
    _modes.refuse(config, ctx, mode)
    return
  with pytest.raises(ConfigError) as err:
    _modes.refuse(config, ctx, mode)
  message = str(err.value)
  assert '\n' not in message and message.startswith(
      f'mode {mode.value} takes no {_modes.OPTIONS[option].key}')
  takers = [m.value for m, e in run.MODES.items() if e.takes(option, 2)]
  assert takers and all(name in message for name in takers), message


def test_a_schmp_app_and_a_model_are_told_apart_by_the_registry():
  ctx = runtime.WorkerContext(0, 1, None)
  with pytest.raises(ConfigError, match="'lasso' is a SchMP app: it runs in mode schmp"):
    _modes.refuse(run.override(run.load_config('lasso'), ['mode=spmd']), ctx, run.Mode.SPMD)
  with pytest.raises(ConfigError, match="mode schmp runs a SchMP app, one of lasso"):
    _modes.refuse(run.override(run.load_config('mlp'), ['mode=schmp']), ctx, run.Mode.SCHMP)


def test_the_mode_help_and_load_models_modes_come_from_the_registry():
  from absl import flags

  from hetjax.cli import train  # noqa: F401  (defines the flags)

  help_text = flags.FLAGS['mode'].help
  for mode, entry in run.MODES.items():
    assert f'{mode.value}: {entry.summary}' in help_text
  assert _modes.AUTO_RULE in help_text
  assert _trained.WHOLE_MODEL_MODES == tuple(
      m.value for m, e in run.MODES.items() if e.whole_model) == ('spmd', 'shares', 'tokens')


def test_the_run_package_imports_without_a_cycle():
  package = ROOT / 'hetjax' / 'run'
  graph = {f'hetjax.run.{p.stem}': imported_modules(p) for p in package.glob('_*.py')}
  state: dict[str, int] = {}

  def visit(module, path):
    if state.get(module) == 1:
      raise AssertionError(f'import cycle: {" -> ".join([*path, module])}')
    if state.get(module) == 2 or module not in graph:
      return
    state[module] = 1
    for other in sorted(graph[module]):
      visit(other, [*path, module])
    state[module] = 2

  for module in sorted(graph):
    visit(module, [])


def test_the_readmes_mode_table_says_what_the_registry_says():
  rows = {}
  for line in (ROOT / 'README.md').read_text().splitlines():
    if line.startswith('| `'):
      name, text = line.split('|')[1:3]
      rows[name.strip().strip('`')] = ' '.join(text.split())
  assert set(rows) >= {m.value for m in run.Mode}, sorted(rows)
  for mode, entry in run.MODES.items():
    assert rows[mode.value].startswith(entry.summary), (mode.value, rows[mode.value])


def test_a_model_and_a_schmp_app_are_told_apart_by_the_registries_not_by_type():
  from hetjax import models, schmp
  from hetjax.run._task import trains_app

  for name in schmp.APPS:
    assert trains_app(run.Config(model=run.ModelConfig(name)))
  for name in models.NAMES:
    assert not trains_app(run.Config(model=run.ModelConfig(name)))
  # The one type check left is of what a user's own ``module:function`` returned.
  checks = [f'{p.name}:{i}' for p in sorted((ROOT / 'hetjax' / 'run').glob('*.py'))
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if 'isinstance(task' in line]
  assert [c.split(':')[0] for c in checks] == ['_task.py'], checks


def test_links_through_a_server_under_overlap_are_refused_before_anything_is_built():
  import types

  from hetjax.run import _comm_options

  ctx = types.SimpleNamespace(network=None)
  config = run.override(run.Config(model=run.ModelConfig('mlp')),
                        ['overlap=True', 'network=link:1:10:exchange=server'])
  with pytest.raises(ConfigError, match=r'overlaps ring all-reduces; links .* exchange through a '
                                        r'server: drop exchange= or overlap'):
    _comm_options.links_of(config, ctx, 2)
  ring = run.override(config, ['network=link:1:10'])
  assert _comm_options.links_of(ring, ctx, 2).workers == 2
