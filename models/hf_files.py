"""A Hugging Face model directory on disk: ``config.json`` and the weights in ``*.safetensors``,
one file (``model.safetensors``) or shards listed by ``model.safetensors.index.json``.

`SafetensorsDir` reads it lazily: the headers say every tensor's name, shape and dtype, and a
tensor's bytes are read (memory-mapped, by `safetensors`' ``safe_open``) only when asked for, one
tensor at a time. `write_safetensors_dir` writes one the way ``transformers``'
``save_pretrained`` does: shards of at most ``max_shard_bytes``, an index naming each tensor's
shard, ``{'format': 'pt'}`` metadata; into a temporary folder renamed into place, so a failed
write leaves nothing half-written. Names and layouts are `hetjax.models.hf`'s.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from hetjax._errors import ConfigError

CONFIG = 'config.json'
SINGLE = 'model.safetensors'
INDEX = 'model.safetensors.index.json'
#: transformers' default ``max_shard_size`` (5 GB).
MAX_SHARD_BYTES = 5 * 10**9
#: The tokenizer's files, copied beside an export when the source directory has them.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                   'generation_config.json')


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
  """The ``config.json`` of the model directory ``directory``.

  Raises:
    ConfigError: no such directory, no ``config.json`` there, or one that is not a JSON object.
  """
  path = pathlib.Path(directory).expanduser()
  if not path.is_dir():
    raise ConfigError(f'hf checkpoint: {path} is not a directory' if path.exists() else
                      f'hf checkpoint: no directory {path}')
  config_path = path / CONFIG
  if not config_path.is_file():
    raise ConfigError(f'hf checkpoint: {path} has no {CONFIG}')
  try:
    config = json.loads(config_path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConfigError(f'hf checkpoint: {config_path} is not readable JSON ({e})') from None
  if not isinstance(config, dict):
    raise ConfigError(f'hf checkpoint: {config_path} is not a JSON object')
  return config


class SafetensorsDir:
  """The tensors of a model directory, by name: shapes from the headers, each tensor read when
  asked (`get`). Use as a context manager, or `close` it, to release the files.

  Example::

    with SafetensorsDir('~/models/Llama-3.2-1B') as tensors:
      tensors.shape('model.norm.weight')      # (2048,)
      norm = tensors.get('model.norm.weight')  # np.ndarray, read now

  Raises:
    ConfigError: no ``model.safetensors`` and no index; an index that names a missing shard or
      is not readable; a shard that is not a safetensors file; a tensor in two shards.
  """

  def __init__(self, directory: str | os.PathLike):
    from safetensors import safe_open  # the package is needed only when weights are read

    self.directory = pathlib.Path(directory).expanduser()
    index, single = self.directory / INDEX, self.directory / SINGLE
    if index.is_file():
      try:
        weight_map = json.loads(index.read_text())['weight_map']
        files = sorted(set(weight_map.values()))
      except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
              AttributeError) as e:
        raise ConfigError(f'hf checkpoint: {index} is not an index of safetensors shards '
                          f'({type(e).__name__}: {e})') from None
    elif single.is_file():
      files = [SINGLE]
    else:
      raise ConfigError(f'hf checkpoint: {self.directory} has neither {SINGLE} nor {INDEX}')
    self._files: dict[str, Any] = {}
    self._where: dict[str, str] = {}
    try:
      for name in files:
        path = self.directory / name
        if not path.is_file():
          raise ConfigError(f'hf checkpoint: {INDEX} names shard {name}, which is missing')
        try:
          handle = safe_open(str(path), framework='np')
        except Exception as e:  # safetensors raises its own error types for a bad header
          raise ConfigError(f'hf checkpoint: {path} is not a safetensors file ({e})') from None
        self._files[name] = handle
        for key in handle.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
          if key in self._where:
            raise ConfigError(f'hf checkpoint: tensor {key!r} is in both {self._where[key]} '
                              f'and {name}')
          self._where[key] = name
    except ConfigError:
      self.close()
      raise

  def __enter__(self) -> SafetensorsDir:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Releases the files (reading after this fails)."""
    for handle in self._files.values():
      exit_ = getattr(handle, '__exit__', None)
      if exit_ is not None:
        exit_(None, None, None)
    self._files = {}

  def keys(self) -> list[str]:
    """Every tensor's name, sorted."""
    return sorted(self._where)

  def __contains__(self, name: object) -> bool:
    return name in self._where

  def shape(self, name: str) -> tuple[int, ...]:
    """The shape of tensor ``name`` (from its file's header; nothing is read)."""
    return tuple(self._files[self._where[name]].get_slice(name).get_shape())

  def get(self, name: str) -> np.ndarray:
    """Tensor ``name``, read now (bfloat16 as `ml_dtypes.bfloat16`)."""
    return self._files[self._where[name]].get_tensor(name)


def write_safetensors_dir(directory: str | os.PathLike, config: Mapping[str, Any],
                          shapes: Mapping[str, tuple[tuple[int, ...], Any]],
                          get: Callable[[str], np.ndarray], *,
                          max_shard_bytes: int = MAX_SHARD_BYTES,
                          copy_from: Iterable[str | os.PathLike] = (),
                          overwrite: bool = False) -> pathlib.Path:
  """Writes a model directory: ``config``, then the tensors named by ``shapes`` (``{name:
  (shape, dtype)}``) in that order, each fetched by ``get(name)`` while its shard is written, so
  at most one shard is held at once. One shard is ``model.safetensors``; several are
  ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``. The tokenizer's
  files (`TOKENIZER_FILES`) found in a ``copy_from`` directory are copied beside them.

  Raises:
    ConfigError: ``directory`` exists and is not empty (without ``overwrite``), or is a file; a
      ``max_shard_bytes`` under 1; a fetched tensor of another shape than ``shapes`` says.
  """
  out = pathlib.Path(directory).expanduser()
  if out.exists() and not out.is_dir():
    raise ConfigError(f'hf export: {out} is a file, not a directory')
  if out.is_dir() and any(out.iterdir()) and not overwrite:
    raise ConfigError(f'hf export: {out} is not empty (overwrite=True, --overwrite, replaces it)')
  if max_shard_bytes < 1:
    raise ConfigError(f'hf export: max_shard_bytes must be at least 1, got {max_shard_bytes}')
  from safetensors.numpy import save_file

  shards = _shards({name: int(np.prod(shape)) * np.dtype(dtype).itemsize
                    for name, (shape, dtype) in shapes.items()}, max_shard_bytes)
  out.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))
  try:
    (staging / CONFIG).write_text(json.dumps(dict(config), indent=2, sort_keys=True) + '\n')
    files = ([SINGLE] if len(shards) == 1 else
             [f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors' for i in range(len(shards))])
    weight_map, total = {}, 0
    for file, names in zip(files, shards, strict=True):
      tensors = {}
      for name in names:
        array = np.ascontiguousarray(get(name))
        if array.shape != tuple(shapes[name][0]):
          raise ConfigError(f'hf export: tensor {name!r} has shape {array.shape}, expected '
                            f'{tuple(shapes[name][0])}')
        tensors[name] = array
        weight_map[name] = file
        total += array.nbytes
      save_file(tensors, str(staging / file), metadata={'format': 'pt'})
      del tensors
    if len(files) > 1:
      index = {'metadata': {'total_size': total}, 'weight_map': weight_map}
      (staging / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + '\n')
    for source in copy_from:
      for name in TOKENIZER_FILES:
        found = pathlib.Path(source).expanduser() / name
        if found.is_file() and not (staging / name).exists():
          shutil.copyfile(found, staging / name)
    if out.exists():
      shutil.rmtree(out)
    staging.rename(out)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return out


def _shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
  """Names in order, cut into runs of at most ``max_bytes`` (a larger tensor alone in its own);
  at least one shard, empty when there is nothing."""
  shards: list[list[str]] = [[]]
  used = 0
  for name, size in sizes.items():
    if shards[-1] and used + size > max_bytes:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += size
  return shards
