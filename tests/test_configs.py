"""Experiment configs and --set overrides."""

import pytest

from hetjax import ConfigError
from hetjax.run import _config as configs
from hetjax.train import Optimizer


def test_every_shipped_config_loads_with_a_known_model():
  from hetjax import models, schmp

  assert configs.names() == ['lasso', 'lda', 'logreg', 'mf', 'mlp', 'transformer', 'wide_deep']
  for name in configs.names():
    model = configs.load(name).model
    assert model in models.NAMES or model in schmp.APPS


def test_overrides_are_typed_and_reach_model_arguments():
  config = configs.override(configs.load('mlp'), [
      'global_batch=128', 'learning_rate=1', 'model_args.hidden=512', 'strategy=fsdp',
      'model_args.new=3'])
  assert config.global_batch == 128 and config.learning_rate == 1.0
  assert isinstance(config.learning_rate, float)
  assert config.model_args == {'hidden': 512, 'width': 128, 'new': 3}
  assert config.strategy == 'fsdp'
  flags = configs.override(config, ['sync_overlap=true', 'endgame=False', 'slowdown=true'])
  assert flags.sync_overlap is True and flags.endgame is False  # true/false as absl takes them
  assert flags.slowdown == 'true'  # a text field keeps the word


@pytest.mark.parametrize('assignment, message', [
    ('global_batch', 'not of the form key=value'),
    ('batch=3', "override 'batch': unknown field"),
    ('global_batch=1.5', 'expected int, got float'),
    ('steps=True', 'expected int, got bool'),
])
def test_bad_overrides(assignment, message):
  with pytest.raises(ConfigError, match=message):
    configs.override(configs.load('mlp'), [assignment])


def test_optimizer_names():
  assert Optimizer.parse('adamw') is Optimizer.ADAMW
  with pytest.raises(ConfigError, match="unknown optimizer 'lion'; choose one of: sgd"):
    Optimizer.parse('lion')
  with pytest.raises(ConfigError, match='learning rate must be positive'):
    Optimizer.SGD.make(0.0)


@pytest.mark.parametrize('assignment, message', [
    ('mode=ring', "unknown mode 'ring'"),
    ('token_rows=-1', 'token_rows must be >= 0'),
    ('shares=(1.5,)', 'expected a tuple of ints or None, got tuple'),
    ('slowdown=3', None),  # text fields keep the text: '3'
])
def test_engine_fields_are_checked(assignment, message):
  if message is None:
    assert configs.override(configs.load('mlp'), [assignment]).slowdown == '3'
    return
  with pytest.raises(ConfigError, match=message):
    configs.override(configs.load('mlp'), [assignment])


@pytest.mark.parametrize('name, message', [
    ('no_such_file.py', 'config file no_such_file.py does not exist'),
    ('hetjax.configs.mlp:nope', "'hetjax.configs.mlp' has no function 'nope'"),
    ('no_such_module:get_config', "cannot import 'no_such_module'"),
    ('json:dumps', r'json:dumps\(\) cannot be called without arguments'),
    ('json:JSONDecoder', 'returned JSONDecoder, not hetjax.run.Config'),
])
def test_configs_of_your_own_are_checked(name, message):
  with pytest.raises(ConfigError, match=message):
    configs.load(name)


@pytest.mark.parametrize('model, message', [
    ('json:dumps', "model 'json:dumps' does not take model_args"),
    ('types:SimpleNamespace',
     "model 'types:SimpleNamespace' returned SimpleNamespace, not a hetjax.train.Task"),
])
def test_models_of_your_own_are_checked(model, message):
  from hetjax.run import _build as _programs

  config = configs.override(configs.load('mlp'), [f'model={model}'])
  with pytest.raises(ConfigError, match=message):
    _programs.make_task(config)
