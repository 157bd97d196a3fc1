"""GPT-2 style LM on the Python standard library's bytes, small enough for CPUs: 1.3M
parameters (d_model 128, 8 heads, 6 layers, rotary positions), 2-D hybrid on 4x2.

The model's last tenth of the corpus is held out (`hetjax.train.Task.eval_data`), evaluated
every 100 steps. ``--set model.args.data=DIR`` trains on a dataset of
``experiments/prepare_text.py`` instead. Sizes keep
``'embed'`` (128), ``'mlp'`` (512), ``'heads'`` (8) and ``'vocab'`` (256) divisible by 8, so
every built-in strategy can split them over 8 devices.
"""

from hetjax.run import (
  CheckpointConfig,
  Config,
  DataConfig,
  EvalConfig,
  LoggingConfig,
  ModelConfig,
  OptimizerConfig,
  ParallelismConfig,
)


def get_config() -> Config:
  return Config(
      model=ModelConfig('gpt', {
          'vocab_size': 256, 'd_model': 128, 'heads': 8, 'layers': 6, 'mlp': 512,
          'seq_len': 128, 'positions': 'rotary', 'tie_embeddings': False, 'attention': 'auto',
          'data': None},
          dtype='float32', param_dtype='float32', remat='none'),
      data=DataConfig(global_batch=32),
      optimizer=OptimizerConfig('adamw', learning_rate=3e-3, steps=300, schedule='cosine',
                                warmup=30, final_fraction=0.1, clip_norm=1.0),
      eval=EvalConfig(every=100, batches=2),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=100))
