"""Hugging Face checkpoints in and out of hetjax: a model directory read as a `llama` model
(`load_hf`; a run starts from one with ``model.init=hf:PATH``), and a trained run written back
in Hugging Face's layout (`save_hf`, ``hetjax-export``) for ``transformers`` to load."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from hetjax import ConfigError, sharding, train
from hetjax.models import hf, hf_files
from hetjax.run._config import Config
from hetjax.run._sections import INIT_HF, ModelConfig
from hetjax.run._task import HF_MODEL, init_path, make_task
from hetjax.run._trained import load_model, read_run_config


def load_hf(path: str | os.PathLike, *, seq_len: int | None = None, dtype: str | None = None,
            devices: Sequence[jax.Device] | None = None) -> nnx.Module:
  """The Hugging Face model directory ``path`` (``config.json`` and ``*.safetensors``, the
  Llama, Qwen 2 or Mistral layout) as a `hetjax.models.llama.Llama`, ready to call or to
  `hetjax.run.generate` from: each tensor read on its own and placed on ``devices``
  (replicated; default: this process's), the weights in the checkpoint's dtype cast to the
  model's float32 parameters.

  Example::

    model = hetjax.run.load_hf('~/models/SmolLM2-135M', seq_len=512)
    logits = model(tokens)   # float32[B, T, vocab]

  Args:
    path: the model directory (nothing is downloaded).
    seq_len: the context the model is built for (default: the checkpoint's, at most 2048).
    dtype: the compute dtype (``'float32'``, ``'bfloat16'``); None: float32.
    devices: where to put the parameters (default: ``jax.local_devices()``).

  Raises:
    ConfigError: one line: no such directory, a layout or option that is not read, a missing,
      extra or misshapen tensor.
  """
  args = {} if seq_len is None else {'seq_len': seq_len}
  config = Config(model=ModelConfig(HF_MODEL, args, dtype=dtype,
                                    init=f'{INIT_HF}{os.fspath(path)}'))
  task = make_task(config)
  devices = list(jax.local_devices() if devices is None else devices)
  mesh = sharding.make_mesh((len(devices), 1), devices=devices)
  graphdef, params, _ = sharding.init_sharded(
      task.make_model, mesh, train.Strategy.DATA_PARALLEL.rules().params, weights=task.weights)
  return nnx.merge(graphdef, params)


def save_hf(run_dir: str | os.PathLike, path: str | os.PathLike, *, step: int | None = None,
            max_shard_bytes: int | None = None, overwrite: bool = False) -> pathlib.Path:
  """Writes a `llama` run's parameters at ``step`` (default: the latest checkpoint) as a
  Hugging Face model directory that ``transformers`` loads (``AutoModelForCausalLM
  .from_pretrained(path)``): ``config.json`` (the Llama layout, or Qwen 2's with ``qkv_bias``),
  the weights in the parameters' dtype in safetensors shards of at most ``max_shard_bytes``
  (default 5 GB) with their index, and the tokenizer's files where the run's ``model.init``
  directory or token dataset has them. A tensor at a time is brought to the host; the directory
  appears only once complete.

  Example::

    hetjax.run.save_hf('runs/finetune', 'exports/finetune')

  Args:
    run_dir: a run directory of `hetjax.run.train` of model ``llama``, a mode whose checkpoints
      hold the whole model (`hetjax.run.load_model`).
    path: the directory to write.
    step: the checkpoint step; None: the latest.
    max_shard_bytes: the largest shard (default transformers' 5 GB).
    overwrite: replace a non-empty ``path``.

  Raises:
    ConfigError: one line: no run or checkpoint there, a run of another model or of a mode
      whose checkpoints hold the model in pieces, a non-empty ``path`` without ``overwrite``.
  """
  config = read_run_config(run_dir)
  if config.model.name != HF_MODEL:
    raise ConfigError(f'{run_dir} trained model {config.model.name!r}: save_hf writes '
                      f'{HF_MODEL!r} runs in the Hugging Face layout')
  model = load_model(run_dir, step, devices=jax.local_devices()[:1])
  args = make_task(config, weights=False).config
  params = nnx.to_pure_dict(nnx.state(model))
  shapes, get = hf.hf_tensors(args, params)
  dtypes = {np.dtype(dtype).name for _, dtype in shapes.values()}
  torch_dtype = dtypes.pop() if len(dtypes) == 1 else 'float32'
  sources = [init_path(config)] if config.model.init is not None else []
  if args.get('data'):
    sources.append(os.fspath(args['data']))
  return hf_files.write_safetensors_dir(
      path, hf.hf_config(args, torch_dtype), shapes, get,
      max_shard_bytes=hf_files.MAX_SHARD_BYTES if max_shard_bytes is None else max_shard_bytes,
      copy_from=sources, overwrite=overwrite)
