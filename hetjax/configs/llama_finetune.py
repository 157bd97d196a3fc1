"""Fine-tuning a Hugging Face Llama-family checkpoint (Llama, Qwen 2, Mistral): give the model
directory with ``--set model.init=hf:PATH``; its ``config.json`` gives the architecture, so the
model's arguments here are only the context and the data::

  hetjax-train --config=llama_finetune --set model.init=hf:~/models/SmolLM2-135M \\
      --set model.args.data=data/mytext --steps=200

``data`` is a token dataset made with the checkpoint's own tokenizer (``hetjax-prepare-text
--tokenizer=~/models/SmolLM2-135M``); None trains on the standard library's bytes, which any
vocabulary of at least 256 ids reads (the token ids are then bytes, not the tokenizer's). A low
learning rate with a short warmup, one device (``--mesh=8x1`` for data parallelism, FSDP for models
that do not fit one device: ``--strategy=fsdp``). Without ``model.init`` this trains a small
``llama`` from scratch.
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
      model=ModelConfig('llama', {'seq_len': 128, 'data': None}),
      data=DataConfig(global_batch=8),
      optimizer=OptimizerConfig('adamw', learning_rate=2e-5, steps=100, schedule='cosine',
                                warmup=10, final_fraction=0.1, clip_norm=1.0,
                                weight_decay=0.0),
      eval=EvalConfig(every=50, batches=2),
      parallelism=ParallelismConfig(strategy='data_parallel', mesh='1x1'),
      logging=LoggingConfig(every=10), checkpoint=CheckpointConfig(every=50))
