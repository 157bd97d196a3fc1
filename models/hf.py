"""Hugging Face's Llama layout and hetjax's `llama`, both ways: the config (``config.json``) and
the tensors, by name and shape. Arrays only; reading and writing ``*.safetensors`` is
`hetjax.models.hf_files`'.

Hugging Face stores a linear layer's weight as ``[out_features, in_features]``; hetjax keeps a
projection as ``[in, …out]`` with the heads as a dimension of their own::

  model.embed_tokens.weight                 [vocab, d]           embed/tokens        [vocab, d]
  model.layers.N.input_layernorm.weight     [d]                  blocks/N/attn_norm/scale
  model.layers.N.self_attn.q_proj.weight    [heads·hd, d]        blocks/N/attn/query [d, heads, hd]
  model.layers.N.self_attn.k_proj.weight    [kv·hd, d]           blocks/N/attn/key   [d, kv, hd]
  model.layers.N.self_attn.v_proj.weight    [kv·hd, d]           blocks/N/attn/value [d, kv, hd]
  model.layers.N.self_attn.{q,k,v}_proj.bias (Qwen 2)            blocks/N/attn/{query,key,value}_bias
  model.layers.N.self_attn.o_proj.weight    [d, heads·hd]        blocks/N/attn/out   [heads, hd, d]
  model.layers.N.post_attention_layernorm.weight                 blocks/N/mlp_norm/scale
  model.layers.N.mlp.{gate,up}_proj.weight  [mlp, d]             blocks/N/{gate,up}  [d, mlp]
  model.layers.N.mlp.down_proj.weight       [d, mlp]             blocks/N/down       [mlp, d]
  model.norm.weight                         [d]                  head/norm/scale
  lm_head.weight (untied only)              [vocab, d]           head/proj           [d, vocab]

The rotary layout needs no permutation: Hugging Face's Llama checkpoints hold q and k in the
"rotate half" order that `hetjax.models.llama.rope` uses. The conversion is exact (transposes and
reshapes only), so import after export gives the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hetjax._errors import ConfigError

#: ``model_type`` of the layouts read, and what each adds to Llama's.
MODEL_TYPES = ('llama', 'qwen2', 'mistral')
#: make_task's arguments that a checkpoint's ``config.json`` always gives (`llama_args`; the
#: llama3 rope settings too, where its rope type is llama3).
ARCHITECTURE = ('vocab_size', 'd_model', 'heads', 'kv_heads', 'layers', 'mlp', 'rope_base',
                'norm_eps', 'tie_embeddings', 'qkv_bias', 'rope_scaling')


def llama_args(config: Mapping[str, Any], seq_len: int | None = None) -> dict[str, Any]:
  """`hetjax.models.llama.make_task`'s model arguments for a Hugging Face ``config.json`` of the
  Llama, Qwen 2 or Mistral layout; ``seq_len`` is the training context (default: the model's
  ``max_position_embeddings``, at most 2048).

  Raises:
    ConfigError: one line naming what is not read: another ``model_type``, an activation other
      than SiLU, a ``head_dim`` that is not ``hidden_size / num_attention_heads``, biases on
      the output projection or the MLP, a rope type other than Llama 3's, or a Mistral sliding
      window shorter than ``seq_len``.
  """
  kind = config.get('model_type')
  if kind not in MODEL_TYPES:
    raise ConfigError(f'hf config: model_type {kind!r} is not read; choose one of: '
                      f'{", ".join(MODEL_TYPES)}')
  try:
    d, heads = int(config['hidden_size']), int(config['num_attention_heads'])
    args: dict[str, Any] = {
        'vocab_size': int(config['vocab_size']), 'd_model': d, 'heads': heads,
        'kv_heads': int(config.get('num_key_value_heads') or heads),
        'layers': int(config['num_hidden_layers']), 'mlp': int(config['intermediate_size']),
        'rope_base': float(_rope(config).get('rope_theta', 10_000.0)),
        'norm_eps': float(config.get('rms_norm_eps', 1e-6)),
        'tie_embeddings': bool(config.get('tie_word_embeddings', False)),
        'qkv_bias': kind == 'qwen2'}
  except KeyError as e:
    raise ConfigError(f'hf config: {kind} config.json lacks {e.args[0]!r}') from None
  act = config.get('hidden_act', 'silu')
  if act != 'silu':
    raise ConfigError(f'hf config: hidden_act {act!r} is not read (the SwiGLU MLP is SiLU)')
  if config.get('head_dim') not in (None, d // heads):
    raise ConfigError(f'hf config: head_dim {config["head_dim"]} is not hidden_size / '
                      f'num_attention_heads = {d // heads}, which the model assumes')
  for name in ('attention_bias', 'mlp_bias'):
    if config.get(name):
      raise ConfigError(f'hf config: {name}=true is not read (no output-projection or MLP '
                        'biases in the model)')
  context = int(config.get('max_position_embeddings', 2048))
  args['seq_len'] = seq_len or min(context, 2048)
  window = config.get('sliding_window') if config.get(
      'use_sliding_window', kind == 'mistral') else None
  if window and window < args['seq_len']:
    raise ConfigError(f'hf config: {kind} sliding_window {window} is shorter than seq_len '
                      f'{args["seq_len"]}, and the model attends to the whole context')
  args.update(_rope_args(_rope(config)))
  return args


def _rope(config: Mapping[str, Any]) -> dict[str, Any]:
  """The rotary settings: transformers 5's ``rope_parameters`` (``rope_theta`` inside it), or
  the older top-level ``rope_theta`` and ``rope_scaling`` (None: none)."""
  if isinstance(config.get('rope_parameters'), Mapping):
    return dict(config['rope_parameters'])
  scaling = config.get('rope_scaling') or {}
  theta = {'rope_theta': config['rope_theta']} if 'rope_theta' in config else {}
  return {**scaling, **theta}


def _rope_args(rope: Mapping[str, Any]) -> dict[str, Any]:
  kind = rope.get('rope_type', rope.get('type'))
  if kind in (None, 'default'):
    return {'rope_scaling': 'none'}
  if kind != 'llama3':
    raise ConfigError(f'hf config: rope type {kind!r} is not read; choose llama3 or default')
  try:
    return {'rope_scaling': 'llama3', 'rope_factor': float(rope['factor']),
            'rope_low_freq_factor': float(rope['low_freq_factor']),
            'rope_high_freq_factor': float(rope['high_freq_factor']),
            'rope_original_seq_len': int(rope['original_max_position_embeddings'])}
  except KeyError as e:
    raise ConfigError(f'hf config: llama3 rope settings lack {e.args[0]!r}') from None


def hf_config(args: Mapping[str, Any], torch_dtype: str = 'float32') -> dict[str, Any]:
  """The ``config.json`` of a `llama` model of ``args`` (make_task's arguments): the Llama
  layout, or Qwen 2's with ``qkv_bias``; its weights' dtype ``torch_dtype``."""
  from hetjax.models.llama import LlamaConfig

  c = LlamaConfig.of(args)
  qwen = c.qkv_bias
  # Llama 3's scaling stretches rope_original_seq_len by rope_factor (transformers wants the
  # maximum past the original).
  context = (max(c.seq_len, round(c.rope_original_seq_len * c.rope_factor))
             if c.rope_scaling == 'llama3' else c.seq_len)
  out = {'architectures': ['Qwen2ForCausalLM' if qwen else 'LlamaForCausalLM'],
         'model_type': 'qwen2' if qwen else 'llama', 'vocab_size': c.vocab_size,
         'hidden_size': c.d_model, 'num_attention_heads': c.heads,
         'num_key_value_heads': c.kv_heads, 'num_hidden_layers': c.layers,
         'intermediate_size': c.mlp, 'hidden_act': 'silu', 'rope_theta': c.rope_base,
         'rms_norm_eps': c.norm_eps, 'tie_word_embeddings': c.tie_embeddings,
         'max_position_embeddings': context, 'torch_dtype': torch_dtype}
  if not qwen:
    out |= {'attention_bias': False, 'mlp_bias': False}
  if c.rope_scaling == 'llama3':
    out['rope_scaling'] = {'rope_type': 'llama3', 'factor': c.rope_factor,
                           'low_freq_factor': c.rope_low_freq_factor,
                           'high_freq_factor': c.rope_high_freq_factor,
                           'original_max_position_embeddings': c.rope_original_seq_len}
  return out


def _names(args: Mapping[str, Any]) -> dict[str, tuple[tuple[Any, ...], str]]:
  """``{hf name: (hetjax path, how)}``, ``how`` one of ``'same'``, ``'linear'`` (a transpose),
  ``'heads_in'`` (``[h·hd, d]`` → ``[d, h, hd]``), ``'heads_out'`` (``[d, h·hd]`` →
  ``[h, hd, d]``), ``'bias'`` (``[h·hd]`` → ``[h, hd]``)."""
  from hetjax.models.llama import LlamaConfig

  c = LlamaConfig.of(args)
  names = {'model.embed_tokens.weight': (('embed', 'tokens'), 'same'),
           'model.norm.weight': (('head', 'norm', 'scale'), 'same')}
  if not c.tie_embeddings:
    names['lm_head.weight'] = (('head', 'proj'), 'linear')
  for i in range(c.layers):
    hf, ours = f'model.layers.{i}', ('blocks', i)
    names |= {
        f'{hf}.input_layernorm.weight': ((*ours, 'attn_norm', 'scale'), 'same'),
        f'{hf}.post_attention_layernorm.weight': ((*ours, 'mlp_norm', 'scale'), 'same'),
        f'{hf}.self_attn.o_proj.weight': ((*ours, 'attn', 'out'), 'heads_out'),
        f'{hf}.mlp.gate_proj.weight': ((*ours, 'gate'), 'linear'),
        f'{hf}.mlp.up_proj.weight': ((*ours, 'up'), 'linear'),
        f'{hf}.mlp.down_proj.weight': ((*ours, 'down'), 'linear')}
    for short, long in (('q', 'query'), ('k', 'key'), ('v', 'value')):
      names[f'{hf}.self_attn.{short}_proj.weight'] = ((*ours, 'attn', long), 'heads_in')
      if c.qkv_bias:
        names[f'{hf}.self_attn.{short}_proj.bias'] = ((*ours, 'attn', f'{long}_bias'), 'bias')
  return names


def _to_ours(array: np.ndarray, how: str, shape: tuple[int, ...]) -> np.ndarray:
  if how == 'same':
    return array
  if how == 'linear':
    return array.T
  if how in ('heads_in', 'heads_out'):
    return array.T.reshape(shape)
  return array.reshape(shape)  # bias


def _to_hf(array: np.ndarray, how: str) -> np.ndarray:
  if how == 'same':
    return array
  if how == 'linear':
    return array.T
  if how == 'heads_in':
    return array.reshape(array.shape[0], -1).T
  if how == 'heads_out':
    return array.reshape(-1, array.shape[-1]).T
  return array.reshape(-1)  # bias


def _hf_shape(shape: tuple[int, ...], how: str) -> tuple[int, ...]:
  """The Hugging Face shape of a parameter of hetjax's ``shape`` (`_to_hf`'s, computed)."""
  if how == 'same':
    return shape
  if how == 'linear':
    return shape[::-1]
  if how == 'heads_in':
    return (shape[1] * shape[2], shape[0])
  if how == 'heads_out':
    return (shape[2], shape[0] * shape[1])
  return (int(np.prod(shape)),)  # bias


def to_hf(args: Mapping[str, Any], params: Mapping[Any, Any]) -> dict[str, np.ndarray]:
  """``{hf name: array}`` of a `llama` model's parameters (``nnx.to_pure_dict`` layout, on the
  host), contiguous, in Hugging Face's layout (module docstring)."""
  shapes, get = hf_tensors(args, params)
  return {name: get(name) for name in shapes}


def hf_tensors(args: Mapping[str, Any], params: Mapping[Any, Any]
               ) -> tuple[dict[str, tuple[tuple[int, ...], np.dtype]],
                          Callable[[str], np.ndarray]]:
  """``({hf name: (shape, dtype)}, get)`` of a `llama` model's parameters (arrays anywhere,
  on devices too): ``get(name)`` brings one tensor to the host in Hugging Face's layout, so a
  writer (`hetjax.models.hf_files.write_safetensors_dir`) holds one shard at a time."""
  names = _names(args)

  def at(path: tuple[Any, ...]) -> Any:
    array = params
    for key in path:
      array = array[key]
    return array

  shapes = {name: (_hf_shape(tuple(at(path).shape), how), np.dtype(at(path).dtype))
            for name, (path, how) in names.items()}

  def get(name: str) -> np.ndarray:
    path, how = names[name]
    return np.ascontiguousarray(_to_hf(np.asarray(at(path)), how))

  return shapes, get


class HfWeights:
  """A Hugging Face checkpoint's tensors as a `llama` model's parameters
  (`hetjax.sharding.Weights`): checked against the model when made, each parameter converted
  when `read`, so a caller that places one parameter at a time holds one tensor at a time.

  ``tensors`` is either a mapping ``{hf name: array}`` or a lazy source with ``keys()``,
  ``shape(name)`` and ``get(name)`` (`hetjax.models.hf_files.SafetensorsDir`); ``shapes`` is
  the model's own tree of shapes (`hetjax.sharding.abstract_model`), which every tensor must fill
  exactly.

  Raises:
    ConfigError: one line naming a missing tensor, an extra one, or a shape that is not the
      model's.
  """

  def __init__(self, args: Mapping[str, Any], tensors: Any, shapes: Mapping[Any, Any]):
    self._tensors = tensors
    self._paths = {}
    names = _names(args)
    extra = sorted(set(tensors.keys()) - set(names))
    if extra:
      raise ConfigError(f'hf checkpoint: {len(extra)} tensor(s) the model does not have, e.g. '
                        f'{extra[0]!r}')
    for name, (path, how) in names.items():
      if name not in tensors:
        raise ConfigError(f'hf checkpoint: tensor {name!r} is missing')
      shape = shapes
      for key in path:
        shape = shape[key]
      shape = tuple(getattr(shape, 'shape', shape))
      found = (tuple(tensors.shape(name)) if hasattr(tensors, 'shape') else
               tuple(np.shape(tensors[name])))
      expected = _hf_shape(shape, how)
      if found != expected:
        raise ConfigError(f'hf checkpoint: tensor {name!r} has shape {found}, the model '
                          f'needs {expected}')
      self._paths[path] = (name, how, shape)

  def paths(self) -> list[tuple[Any, ...]]:
    """The model's parameter paths, each filled by one tensor."""
    return list(self._paths)

  def read(self, path: tuple[Any, ...]) -> np.ndarray:
    """The parameter at ``path`` (keys of the ``nnx.to_pure_dict`` layout), in hetjax's layout
    and the checkpoint's dtype, read now.

    Raises:
      ConfigError: a path the checkpoint does not fill.
    """
    path = tuple(path)
    if path not in self._paths:
      raise ConfigError(f'hf checkpoint: nothing fills parameter {"/".join(map(str, path))}')
    name, how, shape = self._paths[path]
    array = (self._tensors.get(name) if hasattr(self._tensors, 'shape') else
             np.asarray(self._tensors[name]))
    return _to_ours(np.asarray(array), how, shape)


def from_hf(args: Mapping[str, Any], tensors: Mapping[str, Any],
            shapes: Mapping[Any, Any]) -> dict[Any, Any]:
  """A `llama` model's parameters (``nnx.to_pure_dict`` layout) from ``{hf name: array}``, all
  read at once (`HfWeights` reads them one at a time); ``shapes`` as `HfWeights` takes it.

  Raises:
    ConfigError: as `HfWeights`.
  """
  weights = HfWeights(args, tensors, shapes)
  out: dict[Any, Any] = {}
  for path in weights.paths():
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = weights.read(path)
  return out
