"""A Llama-family LM small enough for a CPU's seconds (``models/llama.py``): d_model 64, 8 query
heads sharing 2 key/value heads (grouped-query attention), 2 SwiGLU blocks, rotary positions, on
the Python standard library's bytes; 2-D hybrid on 4x2, where the key/value heads split over
``'model'`` with the query heads. ``--set model.args.data=DIR`` trains on a dataset of
``experiments/prepare_text.py`` instead. ``'embed'`` (64), ``'mlp'`` (176), ``'heads'`` (8) and
``'vocab'`` (256) divide by 8, so every built-in strategy splits them over 8 devices.
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
      model=ModelConfig('llama', {
          'vocab_size': 256, 'd_model': 64, 'heads': 8, 'kv_heads': 2, 'layers': 2, 'mlp': 176,
          'seq_len': 64, 'rope_base': 10_000.0, 'rope_scaling': 'none', 'rope_factor': 8.0,
          'rope_low_freq_factor': 1.0, 'rope_high_freq_factor': 4.0,
          'rope_original_seq_len': 8192, 'norm_eps': 1e-5, 'qkv_bias': False,
          'tie_embeddings': False, 'attention': 'auto', 'data': None},
          dtype='float32', param_dtype='float32', remat='none'),
      data=DataConfig(global_batch=16),
      optimizer=OptimizerConfig('adamw', learning_rate=3e-3, steps=200, schedule='cosine',
                                warmup=20, final_fraction=0.1, clip_norm=1.0),
      eval=EvalConfig(every=100, batches=2),
      parallelism=ParallelismConfig(strategy='hybrid', mesh='4x2'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=100))
