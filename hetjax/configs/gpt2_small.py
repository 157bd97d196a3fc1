"""GPT-2 small (124M parameters) for GPUs: a BPE vocabulary of 50304 (GPT-2's 50257 rounded up
to a multiple of 64), d_model 768, 12 heads, 12 layers, 1024 positions (learned), tied
embeddings, cuDNN's fused attention on a GPU (``attention='auto'``; XLA's elsewhere); bfloat16
compute over float32 parameters, blocks rematerialised keeping their matmul outputs
(``remat='save_dots'``); AdamW with weight decay 0.1, gradients clipped to norm 1, 200 warm-up
steps and a cosine decay to a tenth (nanoGPT's recipe).

``model.args.data`` must name a BPE token dataset written by ``experiments/prepare_text.py``
(the default, ``data/bpe``, is where to put it; ``--set model_args.data=DIR`` names another):
the stdlib bytes are no data for a 50304-token vocabulary. The run's model FLOPs per token,
``hetjax.models.gpt.flops_per_token``, are 855,161,856 (``6·N + 12·layers·seq_len·d_model``).

One GPU: data-parallel on a 1x1 mesh; on 8, ``--mesh=8x1``. Tied embeddings cannot be cut into
pipeline stages (`hetjax.models.gpt.GPT.chain`).
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
      model=ModelConfig('gpt', {
          'vocab_size': 50304, 'd_model': 768, 'heads': 12, 'layers': 12, 'mlp': 3072,
          'seq_len': 1024, 'positions': 'learned', 'tie_embeddings': True, 'attention': 'auto',
          'data': 'data/bpe'},
          dtype='bfloat16', param_dtype='float32', remat='save_dots'),
      data=DataConfig(global_batch=32),
      optimizer=OptimizerConfig('adamw', learning_rate=6e-4, steps=5000, schedule='cosine',
                                warmup=200, final_fraction=0.1, weight_decay=0.1,
                                clip_norm=1.0),
      parallelism=ParallelismConfig(strategy='data_parallel', mesh='1x1'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=1000))
