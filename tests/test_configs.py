"""Experiment configs and --set overrides."""

import pytest

from experiments import configs
from hetjax import ConfigError
from hetjax.train import Optimizer


def test_every_shipped_config_loads_with_a_known_model():
  import models

  assert configs.names() == ['mlp', 'transformer', 'wide_deep']
  for name in configs.names():
    assert configs.load(name).model in models.NAMES


def test_overrides_are_typed_and_reach_model_arguments():
  config = configs.override(configs.load('mlp'), [
      'global_batch=128', 'learning_rate=1', 'model_args.hidden=512', 'strategy=fsdp',
      'model_args.new=3'])
  assert config.global_batch == 128 and config.learning_rate == 1.0
  assert isinstance(config.learning_rate, float)
  assert config.model_args == {'hidden': 512, 'width': 128, 'new': 3}
  assert config.strategy == 'fsdp'


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
