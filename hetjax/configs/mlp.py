"""MLP classifier on scikit-learn's digits, 2-D hybrid on 4x2 devices."""

from hetjax.run import Config


def get_config() -> Config:
  return Config(
      model='mlp', model_args={'hidden': 256, 'width': 128}, global_batch=256,
      optimizer='adam', learning_rate=3e-3, steps=200, strategy='hybrid', mesh='4x2',
      log_every=20, checkpoint_every=100)
