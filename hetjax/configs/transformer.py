"""Byte-level Transformer LM on the Python standard library's source, 2-D hybrid on 4x2."""

from hetjax.run import Config


def get_config() -> Config:
  return Config(
      model='transformer',
      model_args={'d_model': 128, 'heads': 8, 'layers': 2, 'mlp': 512, 'seq_len': 64},
      global_batch=64, optimizer='adamw', learning_rate=3e-3, steps=200, strategy='hybrid',
      mesh='4x2', log_every=10, checkpoint_every=100)
