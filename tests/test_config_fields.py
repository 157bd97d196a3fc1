"""Every config key and enumerated field, walked from the sections (issue 39): a mistyped key or
name is one line naming the right one, a bare name two sections share is refused, the names a
field takes are the library's own, and checking them needs no JAX."""

import dataclasses
import enum
import json
import pathlib
import subprocess
import sys
import typing

import pytest

from hetjax import ConfigError, run
from hetjax.run import _choices, _sections
from hetjax.run._sections import AMBIGUOUS, FLAT_FORM, FLAT_NAMES, SECTIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]

FIELDS = [(name, field) for name, section in SECTIONS.items()
          for field in dataclasses.fields(section)]
DOTTED = [f'{name}.{field.name}' for name, field in FIELDS]
#: ``(dotted key, names)`` of every field declared with `hetjax.run._choices.choice`.
ENUMERATED = [(f'{name}.{field.name}', field.metadata['choices']) for name, field in FIELDS
              if 'choices' in field.metadata]
#: The text fields that name no fixed set: a model (or module:function), a mesh shape, a plan
#: file, a SchMP app's scheduler (each app has its own), a slowdown trace and links (each parsed
#: by its own grammar), a run directory whose hosts to reuse. A new text field must be a
#: `choice` or be added here.
FREE_TEXT = {'model.name', 'model.init', 'parallelism.mesh', 'parallelism.plan', 'schmp.scheduler',
             'emulation.slowdown', 'emulation.network', 'emulation.hosts'}


def _misspelt(key: str) -> str:
  """``key`` with the middle letter of its last part doubled: ``'optimizer.steeps'``."""
  head, dot, last = key.rpartition('.')
  i = len(last) // 2
  return f'{head}{dot}{last[:i]}{last[i]}{last[i:]}'


def _error(assignment: str) -> str:
  with pytest.raises(ConfigError) as error:
    run.override(run.Config('mlp'), [assignment])
  message = str(error.value)
  assert '\n' not in message, message
  return message


@pytest.mark.parametrize('key', sorted(set(DOTTED) | set(FLAT_NAMES)))
def test_a_mistyped_key_is_one_line_naming_the_key(key):
  assert f'; did you mean {key!r}?' in _error(f'{_misspelt(key)}=1')


@pytest.mark.parametrize('key, name', [(key, name) for key, names in ENUMERATED
                                       for name in names])
def test_a_mistyped_name_is_one_line_naming_the_name(key, name):
  names = dict(ENUMERATED)[key]
  for typo in {name + name[-1], name[:-1]} - set(names):  # one letter more, one less
    message = _error(f'{key}={typo}')
    assert f'{typo!r}; did you mean {name!r}?' in message and key in message, message


def test_every_text_field_is_a_choice_or_free_text():
  text = {f'{name}.{field.name}' for name, field in FIELDS
          if typing.get_type_hints(SECTIONS[name])[field.name] in (str, str | None)}
  assert text - {key for key, _ in ENUMERATED} == FREE_TEXT
  assert {key for key, _ in ENUMERATED} <= text


@pytest.mark.parametrize('assignment, message', [
    ('strategy=fsdpp', "unknown parallelism.strategy 'fsdpp'; did you mean 'fsdp'? choose one of: "
                       'data_parallel, fsdp, tensor_parallel, hybrid'),
    ('optimizer.schedule=cosin', "unknown optimizer.schedule 'cosin'; did you mean 'cosine'? "
                                 'choose one of: constant, cosine, linear'),
    ('policy=lbbsp-ewmaa', "unknown balance.policy 'lbbsp-ewmaa'; did you mean 'lbbsp-ewma'?"),
    ('pipeline.schedule=gpipe2', "unknown pipeline.schedule 'gpipe2'; did you mean 'gpipe'? "
                                 'choose one of: gpipe, 1f1b'),
    ('strategy=FSDP', "unknown parallelism.strategy 'FSDP'; did you mean 'fsdp'?"),
    ('model.dtype=bfloat61', "unknown model.dtype 'bfloat61'; did you mean 'bfloat16'? choose "
                             "one of: float32, bfloat16, float16 (or None: the model's default)"),
    ('sync=ps', "pipeline.sync 'ps' is now 'periodic-average' (named for what it does)"),
    ('ps=aspp', "unknown ps.protocol mode 'aspp'; did you mean 'asp'? choose one of: bsp, asp"),
    ('ps=asp,eagr', "unknown ps.protocol option 'eagr'; did you mean 'eager'? expected eager, "),
    ('ps=asp,lr=stalenes', "unknown ps.protocol lr rule 'stalenes'; did you mean 'staleness'?"),
    ('ps=bsp,eager', "ps.protocol 'bsp,eager': eager pull needs asp or ssp"),
    ('schedule=cosine', "override 'schedule' is ambiguous: optimizer.schedule or "
                        'pipeline.schedule'),
    ('schedul=cosine', "unknown key; did you mean 'optimizer.schedule' or 'pipeline.schedule'?"),
    ('every=5', "override 'every' is ambiguous: checkpoint.every, eval.every or logging.every"),
])
def test_the_messages(assignment, message):
  assert message in _error(assignment)


def test_a_name_may_be_given_as_the_librarys_enum():
  from hetjax import train

  section = run.ParallelismConfig(strategy=train.Strategy.FSDP)
  assert section.strategy == 'fsdp' and section == run.ParallelismConfig(strategy='fsdp')


@pytest.mark.parametrize('name', sorted(AMBIGUOUS))
def test_a_bare_name_two_sections_share_is_refused_naming_each(name):
  assert _error(f'{name}=1').startswith(f'override {name!r} is ambiguous: ')
  assert all(key in _error(f'{name}=1') for key in AMBIGUOUS[name])


def test_no_flat_name_means_two_fields():
  assert AMBIGUOUS['schedule'] == ('optimizer.schedule', 'pipeline.schedule')
  for flat, key in FLAT_NAMES.items():
    assert {f'{name}.{field.name}' for name, field in FIELDS if field.name == flat} <= {key}


def test_a_field_added_later_under_a_shared_name_is_ambiguous(monkeypatch):
  @dataclasses.dataclass(frozen=True)
  class Later:
    NAME = 'later'
    steps: int = 1

  monkeypatch.setitem(SECTIONS, 'later', Later)
  assert _sections._meanings()['steps'] == ('later.steps', 'optimizer.steps')


def test_older_runs_flat_config_still_loads_with_the_pipelines_schedule():
  assert FLAT_FORM['schedule'] == 'pipeline.schedule'
  config = run.Config.from_json({'model': 'mlp', 'schedule': 'gpipe', 'stages': 3})
  assert (config.pipeline.schedule, config.pipeline.stages) == ('gpipe', 3)
  assert config.optimizer.schedule == 'constant'


def test_rules_are_set_whole_or_one_name_at_a_time_and_round_trip_json():
  base = run.Config('mlp')
  whole = run.override(base, ["parallelism.rules={'kv': 'model', 'experts': None}"])
  assert whole.parallelism.rules == {'kv': 'model', 'experts': None}
  named = run.override(base, ['parallelism.rules.kv=model', 'rules.experts=None',
                              "rules.batch=('data', 'model')", "rules.embed=['model']"])
  assert named.parallelism.rules == {'kv': 'model', 'experts': None,
                                     'batch': ('data', 'model'), 'embed': 'model'}
  again = run.override(named, ['rules.kv=data'])  # one name replaced, the others kept
  assert again.parallelism.rules == {**named.parallelism.rules, 'kv': 'data'}
  for config in (whole, named):
    assert run.Config.from_json(json.loads(json.dumps(config.to_json()))) == config


@pytest.mark.parametrize('assignment, message', [
    ('parallelism.rules=3', "override parallelism.rules='3': expected a mapping, got int"),
    ('rules.kv=3', "parallelism.rules['kv'] must be a mesh axis name, a tuple of distinct mesh"),
    ("rules.kv=('data', 'data')", "parallelism.rules['kv'] must be a mesh axis name"),
    ('parallelism.rulez.kv=model', "unknown key; did you mean 'parallelism.rules'?"),
    ('model.args=3', 'set one argument at a time'),
])
def test_bad_rules(assignment, message):
  assert message in _error(assignment)


def test_the_choices_are_the_librarys_own():
  from hetjax import balance, ps, replicas, train
  from hetjax.models import gpt
  from hetjax.pipeline._stage_args import SCHEDULES

  library = {
      'STRATEGIES': tuple(s.value for s in train.Strategy),
      'POLICIES': tuple(p.value for p in balance.PolicyName),
      'OPTIMIZERS': tuple(o.value for o in train.Optimizer),
      'OVERLAP_ESTIMATES': tuple(e.value for e in train.OverlapEstimate),
      'PIPELINE_SCHEDULES': tuple(SCHEDULES),
      'SYNC_NAMES': tuple(s.value for s in replicas.SyncName),
      'RENAMED_SYNC_NAMES': {old: new.value for old, new in replicas.RENAMED_SYNC_NAMES.items()},
      'PS_CONSISTENCIES': tuple(s.value for s in ps.Consistency),
      'PS_LR_RULES': tuple(r.value for r in ps.LrRule),
      'DTYPES': tuple(gpt.DTYPES),
      'REMATS': tuple(r.value for r in gpt.Remat),
      'GRANULARITIES': tuple(g.value for g in train.Granularity),
  }
  assert library == {name: getattr(_choices, name) for name in library}
  for schedule in _choices.LR_SCHEDULES:  # learning_rate_schedule takes these and no other
    train.learning_rate_schedule(1.0, 10, schedule, warmup=1)
  *most, last = _choices.LR_SCHEDULES
  with pytest.raises(ConfigError) as error:
    train.learning_rate_schedule(1.0, 10, 'step')
  assert str(error.value) == f"schedule must be {', '.join(most)} or {last}, got 'step'"


@pytest.mark.parametrize('spec', [
    'bsp', 'asp', 'ssp:2', 'ssp:0', 'asp,eager', 'ssp:3,eager,lr=staleness', 'asp,dc',
    'asp,dc=0.1', 'bsp,dc=0', 'asp,max_staleness=12', 'asp,lr=constant', ' asp , eager ',
    'bsp,eager', 'asp:2', 'ssp', 'ssp:x', 'ssp:-1', 'asp,fast', 'asp,eagr', 'bsp,lr=staleness',
    'bsp,dc', 'hogwild', 'aspp', 'asp,dc=nan', 'asp,dc=-1', 'asp,max_staleness=-2',
    'asp,lr=fast', 'asp,eager=1', 'asp,lr', 'asp,max_staleness', '',
])
def test_the_ps_protocol_check_agrees_with_parse_ps(spec):
  from hetjax import ps

  try:
    expected = ps.parse_ps(spec)
  except ValueError:
    with pytest.raises(ConfigError):
      _choices.ps_protocol(spec)
    return
  assert _choices.ps_protocol(spec) == {
      k: v.value if isinstance(v, enum.Enum) else v for k, v in dataclasses.asdict(expected).items()}


#: Loads the choices and the sections from their files under packages with no ``__init__`` (the
#: real ones import JAX): a module they import beyond these fails, and none of JAX's is loaded.
_WITHOUT_JAX = r"""
import importlib.util, json, pathlib, sys, types
root = pathlib.Path(sys.argv[1])
for package in ('hetjax', 'hetjax.run'):
  sys.modules[package] = types.ModuleType(package)
  sys.modules[package].__path__ = []
for name in ('hetjax._errors', 'hetjax._checks', 'hetjax.run._choices', 'hetjax.run._sections'):
  spec = importlib.util.spec_from_file_location(name, root / (name.replace('.', '/') + '.py'))
  sys.modules[name] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(sys.modules[name])
try:
  sys.modules['hetjax.run._sections'].ParallelismConfig(strategy='fsdpp')
except sys.modules['hetjax._errors'].ConfigError as e:
  error = str(e)
print(json.dumps({'error': error, 'loaded': sorted(
    m for m in sys.modules if m.partition('.')[0] in ('jax', 'jaxlib', 'numpy', 'optax'))}))
"""


def test_the_sections_check_their_names_without_jax():
  result = subprocess.run([sys.executable, '-c', _WITHOUT_JAX, str(ROOT)], capture_output=True,
                          text=True, timeout=60, check=True)
  out = json.loads(result.stdout)
  assert out['loaded'] == []
  assert out['error'].startswith("unknown parallelism.strategy 'fsdpp'; did you mean 'fsdp'?")
