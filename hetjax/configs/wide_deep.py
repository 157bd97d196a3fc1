"""Wide & deep recommender on synthetic Zipf clicks: a 10^5-row table, 2-D hybrid on 4x2."""

from hetjax.run import Config


def get_config() -> Config:
  return Config(
      model='wide_deep', model_args={'rows': 100_000, 'dim': 64, 'fields': 4},
      global_batch=512, optimizer='adam', learning_rate=2e-3, steps=200, strategy='hybrid',
      mesh='4x2', log_every=20, checkpoint_every=100)
