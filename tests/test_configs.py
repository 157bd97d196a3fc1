"""Run configs: sections, --set overrides (dotted and flat keys), JSON, loading."""

import pytest

from hetjax import ConfigError, run
from hetjax.train import Optimizer


def test_every_shipped_config_loads_with_a_known_model():
  from hetjax import models, schmp

  assert run.config_names() == ['cdmf', 'gpt', 'gpt2_small', 'lasso', 'lda', 'llama_1b',
                                'llama_finetune', 'llama_tiny', 'logreg', 'mf', 'mlp', 'svm',
                                'transformer', 'wide_deep']
  for name in run.config_names():
    model = run.load_config(name).model.name
    assert model in models.NAMES or model in schmp.APPS


def test_overrides_are_typed_and_reach_model_arguments():
  config = run.override(run.load_config('mlp'), [
      'global_batch=128', 'learning_rate=1', 'model_args.hidden=512', 'strategy=fsdp',
      'model_args.new=3'])
  assert config.data.global_batch == 128 and config.optimizer.learning_rate == 1.0
  assert isinstance(config.optimizer.learning_rate, float)
  assert config.model.args == {'hidden': 512, 'width': 128, 'new': 3}
  assert config.parallelism.strategy == 'fsdp'
  flags = run.override(config, ['sync_overlap=true', 'endgame=False', 'slowdown=true'])
  assert flags.pipeline.sync_overlap is True and flags.balance.endgame is False  # as absl
  assert flags.emulation.slowdown == 'true'  # a text field keeps the word


def test_dotted_and_flat_keys_set_the_same_field():
  base = run.load_config('mlp')
  dotted = run.override(base, ['optimizer.learning_rate=0.5', 'model.args.hidden=64',
                               'checkpoint.every=7', 'logging.every=3', 'ps.protocol=bsp'])
  flat = run.override(base, ['learning_rate=0.5', 'model_args.hidden=64', 'checkpoint_every=7',
                             'log_every=3', 'ps=bsp'])
  assert dotted == flat
  assert dotted.checkpoint.every == 7 and dotted.model.args['hidden'] == 64
  assert set(run.config_keys()) >= {'optimizer.learning_rate', 'learning_rate',
                                    'balance.policy', 'policy'}


@pytest.mark.parametrize('assignment, message', [
    ('learnin_rate=0.1', "unknown key; did you mean 'learning_rate'"),
    ('optimizer.learnig_rate=0.1', "did you mean 'optimizer.learning_rate'"),
    ('data.policy=lbbsp', "did you mean 'balance.policy'"),  # the right field, wrong section
    ('model.args=3', 'set one argument at a time'),
    ('checkpoint.every=0', 'checkpoint.every must be >= 1, got 0'),
    ('optimizer.learning_rate=0', 'optimizer.learning_rate must be > 0'),
    ('schmp.staleness=-1', r'schmp.staleness must be >= 0 \(0: exact\), got -1'),
])
def test_a_mistyped_or_refused_key_is_one_line_naming_it(assignment, message):
  with pytest.raises(ConfigError, match=message) as error:
    run.override(run.load_config('mlp'), [assignment])
  assert '\n' not in str(error.value)


def test_sections_check_their_own_fields():
  with pytest.raises(ConfigError, match=r'balance.bucket must be >= 0 \(0: automatic\)'):
    run.BalanceConfig(bucket=-1)
  with pytest.raises(ConfigError, match=r"unknown parallelism\.mode 'ring'"):
    run.ParallelismConfig(mode='ring')
  with pytest.raises(ConfigError, match=r'Config\.data must be a DataConfig, got dict'):
    run.Config(model='mlp', data={'global_batch': 3})
  assert run.Config(model='mlp').model == run.ModelConfig('mlp', {})


def test_json_round_trips_and_reads_the_flat_form_of_older_runs():
  for name in run.config_names():
    config = run.load_config(name)
    assert run.Config.from_json(config.to_json()) == config
  old = {'model': 'mlp', 'model_args': {'hidden': 8}, 'global_batch': 32, 'checkpoint_every': 4,
         'shares': [3, 1]}
  config = run.Config.from_json(old)
  assert (config.model.args, config.data.global_batch, config.checkpoint.every,
          config.balance.shares) == ({'hidden': 8}, 32, 4, (3, 1))
  with pytest.raises(ConfigError, match="unknown config section 'optimiser'; did you mean "
                                        "'optimizer'"):
    run.Config.from_json({'model': {'name': 'mlp'}, 'optimiser': {}})
  with pytest.raises(ConfigError, match=r"unknown config field 'data\.batch'"):
    run.Config.from_json({'model': {'name': 'mlp'}, 'data': {'batch': 3}})


@pytest.mark.parametrize('assignment, message', [
    ('global_batch', 'not of the form key=value'),
    ('batch=3', "override 'batch': unknown key"),
    ('global_batch=1.5', 'expected int, got float'),
    ('steps=True', 'expected int, got bool'),
])
def test_bad_overrides(assignment, message):
  with pytest.raises(ConfigError, match=message):
    run.override(run.load_config('mlp'), [assignment])


def test_optimizer_names():
  assert Optimizer.parse('adamw') is Optimizer.ADAMW
  with pytest.raises(ConfigError, match="unknown optimizer 'lion'; choose one of: sgd"):
    Optimizer.parse('lion')
  with pytest.raises(ConfigError, match='learning rate must be positive'):
    Optimizer.SGD.make(0.0)


@pytest.mark.parametrize('assignment, message', [
    ('mode=ring', "unknown parallelism.mode 'ring'"),
    ('token_rows=-1', 'token_rows must be >= 0'),
    ('shares=(1.5,)', 'expected a tuple of ints or None, got tuple'),
    ('slowdown=3', None),  # text fields keep the text: '3'
])
def test_engine_fields_are_checked(assignment, message):
  if message is None:
    assert run.override(run.load_config('mlp'), [assignment]).emulation.slowdown == '3'
    return
  with pytest.raises(ConfigError, match=message):
    run.override(run.load_config('mlp'), [assignment])


@pytest.mark.parametrize('name, message', [
    ('no_such_file.py', 'config file no_such_file.py does not exist'),
    ('hetjax.configs.mlp:nope', "'hetjax.configs.mlp' has no function 'nope'"),
    ('no_such_module:get_config', "cannot import 'no_such_module'"),
    ('json:dumps', r'json:dumps\(\) cannot be called without arguments'),
    ('json:JSONDecoder', 'returned JSONDecoder, not hetjax.run.Config'),
])
def test_configs_of_your_own_are_checked(name, message):
  with pytest.raises(ConfigError, match=message):
    run.load_config(name)


@pytest.mark.parametrize('model, message', [
    ('json:dumps', "model 'json:dumps' does not take model_args"),
    ('types:SimpleNamespace',
     "model 'types:SimpleNamespace' returned SimpleNamespace, not a hetjax.train.Task"),
])
def test_models_of_your_own_are_checked(model, message):
  from hetjax import run as _programs

  config = run.override(run.load_config('mlp'), [f'model={model}'])
  with pytest.raises(ConfigError, match=message):
    _programs.make_task(config)
