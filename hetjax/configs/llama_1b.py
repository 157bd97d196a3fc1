"""A Llama 3.2 1B-shaped model for one GPU (``models/llama.py``; the GPU check's): vocabulary
128256, d_model 2048, 32 query heads sharing 8 key/value heads, 16 SwiGLU blocks of 8192, rotary
positions at base 500000 with Llama 3.1's frequency scaling (factor 32), tied embeddings, 2048
positions; bfloat16 compute over float32 parameters, blocks rematerialised keeping their matmul
outputs (``remat='save_dots'``); AdamW with weight decay 0.1 and gradients clipped to norm 1.

``model.args.data`` must name a token dataset of ``experiments/prepare_text.py`` whose vocabulary
fits 128256 (the default, ``data/llama``, is where to put it). Data-parallel on a 1x1 mesh.
"""

from hetjax.run import (
  CheckpointConfig,
  Config,
  DataConfig,
  LoggingConfig,
  ModelConfig,
  OptimizerConfig,
  ParallelismConfig,
)


def get_config() -> Config:
  return Config(
      model=ModelConfig('llama', {
          'vocab_size': 128256, 'd_model': 2048, 'heads': 32, 'kv_heads': 8, 'layers': 16,
          'mlp': 8192, 'seq_len': 2048, 'rope_base': 500_000.0, 'rope_scaling': 'llama3',
          'rope_factor': 32.0, 'rope_low_freq_factor': 1.0, 'rope_high_freq_factor': 4.0,
          'rope_original_seq_len': 8192, 'norm_eps': 1e-5, 'qkv_bias': False,
          'tie_embeddings': True, 'attention': 'auto',
          'data': 'data/llama'},
          dtype='bfloat16', param_dtype='float32', remat='save_dots'),
      data=DataConfig(global_batch=8),
      optimizer=OptimizerConfig('adamw', learning_rate=3e-4, steps=2000, schedule='cosine',
                                warmup=100, final_fraction=0.1, weight_decay=0.1,
                                clip_norm=1.0),
      parallelism=ParallelismConfig(strategy='data_parallel', mesh='1x1'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=500))
