"""Per-sub-model profiles measured by XLA: each sub-model compiled alone, forward and backward.

`profile_submodels` needs each sub-model's inputs. It traces the task's loss once on a real batch
of ``batch_size`` rows, with every sub-model of a throwaway copy of the model replaced by a
`_Recorder` that notes the shapes and dtypes of its arguments and output. The trace is abstract
(`jax.eval_shape`): the sub-models see the same shapes as in a real step, but no parameter is
allocated and nothing is computed.

Each sub-model is then compiled alone for one device of JAX's default backend (the GPU where
there is one: its fusions decide the temporaries), as ``vjp`` with respect to its
parameters and floating-point inputs, fed a cotangent of its output's shape, returning the output
and the gradients (so neither half can be pruned). The lowered program's ``cost_analysis()``
gives the FLOPs (or its matmuls counted from the jaxpr where XLA counted fewer:
`hetjax.train.program_flops`), the compiled program's the bytes accessed, and its
``memory_analysis()`` the temporaries: the activations the backward pass keeps, plus scratch.
On a GPU XLA's analysis misses the matmuls, compiled or lowered: it can count a small fraction of
what a transformer block does. Identical sub-models (the transformer's
blocks) are compiled once.

Two consequences of measuring a sub-model alone: its inputs are arguments of the program, not
temporaries, so a single dense layer (which keeps only its input) shows no activation bytes;
what a real step keeps for it also includes its input, the previous sub-model's output. The
cotangent of its output is an argument too: for the last sub-model it is the loss's gradient
with respect to the model's output (a language model's logits' gradient), which a real step
holds while that sub-model's backward runs, so its bytes are added to the last sub-model's
activations. And
bytes accessed includes traffic per step (parameters read, gradients written — a dense
embedding gradient touches the whole table), so each sub-model is compiled at ``batch_size``
and twice that: the slope is the per-example traffic, the rest the per-step traffic.

These analyses are made on the optimised HLO, before machine code, so the programs are compiled
with ``xla_backend_optimization_level=0``: the numbers are the same and compiling is markedly
faster.

A model that lists no ``submodels()`` is profiled as one part, `WHOLE_MODEL` (``'model'``): its
program is the task's loss on the batch (`WholeModel`), forward and backward, so its output is
the per-example losses and its activations are the step's. What tensor parallelism all-reduces
is then not that output but the outputs of its row-parallel layers (`_row_outputs`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec, SingleDeviceSharding

from hetjax._errors import ConfigError
from hetjax.planner import _profile_timing
from hetjax.planner._layout import FSDP_AXES, TENSOR_AXES
from hetjax.planner._profile_types import SubmodelProfile
from hetjax.planner._whole import WHOLE_MODEL, WholeModel
from hetjax.runtime import seconds_per_call
from hetjax.train import HasSubmodels, Task, program_flops

_COMPILER_OPTIONS = {'xla_backend_optimization_level': 0}


def profile_submodels(task: Task, batch_size: int = 32, seed: int = 0, timed: bool = False
                      ) -> tuple[SubmodelProfile, ...]:
  """Measures every sub-model of ``task``'s model at ``batch_size``, in forward order.

  Example::

    profiles = profile_submodels(models.make_task('mlp', hidden=64, width=32))
    [p.name for p in profiles]   # ['up', 'down', 'head']
    profiles[0].params           # 64·64 + 64 = 4160

  A model without ``submodels()`` is measured whole, as one part named ``'model'``
  (`hetjax.planner.WHOLE_MODEL`)::

    [p.name for p in profile_submodels(task_of_a_plain_model)]   # ['model']

  Args:
    task: a task; the parts measured are its model's ``submodels()``
      (`hetjax.train.HasSubmodels`), or the whole model as one.
    batch_size: rows of the batch the sub-models are compiled for; per-example numbers are the
      measured ones divided by it.
    seed: seeds the model's (abstract) initialisation and picks the batch.
    timed: also time each sub-model's forward + backward on the default backend's first device,
      at ``batch_size`` and twice it (`hetjax.planner._profile_timing`): the profiles then carry
      ``seconds_per_example`` and ``seconds_per_step``, and the cost model prices their compute
      from those times (`hetjax.planner.AnalyticCost`). The programs are then compiled at
      XLA's default options (the times are those of the code a step runs), each once, analysed
      and timed; the loss's whole gradient is timed once more, as one program, to find what a
      program call costs (``call_seconds``: the step pays it once, not once a sub-model).

  Returns:
    One `SubmodelProfile` per sub-model, in the order of ``submodels()``; one for the whole
    model when it lists none.

  Raises:
    ConfigError: if ``batch_size`` is not positive, or the loss never calls a sub-model.
  """
  if batch_size < 1:
    raise ConfigError(f'batch_size must be positive, got {batch_size}')
  model = _abstract_model(task, seed)
  device = jax.devices()[0]
  # The model's state as arrays on the device when the sub-models are timed: their inputs are
  # then taken from the loss run on it (`_record_calls`).
  state = (_profile_timing.filled(nnx.split(model)[1], device, np.random.default_rng(seed))
           if timed else None)
  batch = task.data.global_batch(seed, 0, batch_size)
  calls, inputs = _record_calls(task, model, batch, state)
  # Bytes accessed (and times) at two batch sizes separate what grows with the rows from what
  # does not (a dense embedding gradient touches the whole table whatever the batch).
  doubled, doubled_inputs = _record_calls(
      task, model, task.data.global_batch(seed, 0, 2 * batch_size), state)
  compile_cache: dict[Any, _Analysis] = {}
  profiles, separate = [], []
  held: set[int] = set()  # the parameters an earlier sub-model holds (`_own_parameters`)
  parts = _parts(task, model)
  # The whole model's tensor-parallel activation is its row-parallel layers' (module docstring).
  tensor = None if isinstance(model, HasSubmodels) else _row_outputs(task, model, batch)
  last = list(parts)[-1]
  for name, module in parts.items():
    if name not in calls:
      raise ConfigError(f'the loss of {task.name!r} never calls its sub-model {name!r}')
    args, kwargs, out = calls[name]
    one = _analyse(module, args, kwargs, out, compile_cache, inputs and inputs[name])
    two = _analyse(module, *doubled[name], compile_cache,
                   doubled_inputs and doubled_inputs[name])
    flops, accessed, temp = one.flops, one.accessed, one.temp
    per_example = max(two.accessed - accessed, 0.0) / batch_size
    timing = {}
    if timed:
      fixed, per_row = _profile_timing.fit_line(batch_size, one.seconds, two.seconds)
      timing = {'seconds_per_step': fixed, 'seconds_per_example': per_row}
      separate.append(one.seconds)
    params = nnx.state(module, nnx.Param)
    leaves = _own_parameters(module, held)
    split, shard = _axis_sizes(params)
    param_bytes = float(sum(_nbytes(p) for p in leaves))
    output = sum(_nbytes(o) for o in jax.tree.leaves(out))
    # The loss's gradient with respect to the model's output is live while the last sub-model's
    # backward runs; compiled alone, that sub-model is handed it as an argument (module
    # docstring), so it is added here: GPT-2 small's logits' gradient, batch × 1024 × 50304
    # float32 (about 25 GiB at batch 128), is about a third of its step's memory, which the
    # planner would otherwise leave out.
    kept = temp + (output if name == last else 0)
    profiles.append(SubmodelProfile(
        name=name,
        params=sum(math.prod(p.shape) for p in leaves),
        param_bytes=param_bytes,
        flops_per_example=flops / batch_size,
        bytes_accessed_per_example=per_example,
        bytes_accessed_per_step=max(accessed - per_example * batch_size, 0.0),
        output_bytes_per_example=output / batch_size,
        activation_bytes_per_example=kept / batch_size,
        split_sizes=split,
        shard_sizes=shard,
        tensor_reductions=_tensor_reductions(params),
        fsdp_arrays=_fsdp_arrays(params),
        tensor_bytes_per_example=tensor, **timing))
  if timed and len(profiles) > 1:  # one program call a step, not one a sub-model
    call = _profile_timing.call_seconds(separate, _gradient_seconds(task, model, state, batch))
    profiles = [dataclasses.replace(
        p, call_seconds=call,
        seconds_per_step=p.seconds_per_step if i == 0 else max(p.seconds_per_step - call, 0.0))
        for i, p in enumerate(profiles)]
  return tuple(profiles)


def _gradient_seconds(task: Task, model: nnx.Module, state: Any, batch: Any) -> float:
  """Seconds per call of the task's loss gradient (with respect to the parameters) on
  ``state`` and ``batch`` (the one `profile_submodels` records at), as one program on the
  default device: the sub-models' work as the step runs it, without the update."""
  graphdef, _ = nnx.split(model)

  def gradient(state, batch):
    inner, params, rest = nnx.split(nnx.merge(graphdef, state), nnx.Param, ...)
    return jax.grad(lambda p: task.loss(nnx.merge(inner, p, rest), batch).mean())(params)

  return seconds_per_call(jax.jit(gradient), (state, jax.device_put(batch, jax.devices()[0])))


@dataclasses.dataclass(frozen=True)
class SubmodelCall:
  """One sub-model of an abstract model and its first call in the task's loss.

  Attributes:
    module: the sub-model (abstract: its parameters are `jax.ShapeDtypeStruct`).
    args, kwargs: the call's arguments, as `jax.ShapeDtypeStruct`.
    out: its output, as `jax.ShapeDtypeStruct`.
  """

  module: nnx.Module
  args: tuple
  kwargs: dict
  out: Any


def submodel_calls(task: Task, batch_size: int, seed: int = 0) -> dict[str, SubmodelCall]:
  """Every sub-model of ``task``'s (abstract) model with the shapes it sees in a step of
  ``batch_size`` rows, in forward order: what compiling a sub-model alone needs.

  Example: for the transformer at batch 64, ``calls['block_0'].args`` is one
  ``float32[64, 63, d_model]`` (the residual stream of 63 input positions).

  Raises:
    ConfigError: as `profile_submodels`.
  """
  if batch_size < 1:
    raise ConfigError(f'batch_size must be positive, got {batch_size}')
  model = _abstract_model(task, seed)
  calls, _ = _record_calls(task, model, task.data.global_batch(seed, 0, batch_size))
  out = {}
  for name, module in _parts(task, model).items():
    if name not in calls:
      raise ConfigError(f'the loss of {task.name!r} never calls its sub-model {name!r}')
    out[name] = SubmodelCall(module, *calls[name])
  return out


def _abstract_model(task: Task, seed: int) -> nnx.Module:
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: task.make_model(nnx.Rngs(seed)))


def _parts(task: Task, model: nnx.Module) -> dict[str, nnx.Module]:
  """The parts to measure: the model's sub-models, or the whole model with its loss as one."""
  if isinstance(model, HasSubmodels):
    return model.submodels()
  return {WHOLE_MODEL: WholeModel(model, task.loss)}


class _Recorder(nnx.Module):
  """Stands in for a sub-model: calls it and reports the arguments and output (tracers)."""

  def __init__(self, inner: nnx.Module, report: Callable[[tuple, dict, Any], None]):
    self.inner = inner
    self.report = report

  def __call__(self, *args, **kwargs):
    out = self.inner(*args, **kwargs)
    self.report(args, kwargs, out)
    return out


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)


def _record_calls(task: Task, model: nnx.Module, batch, state: Any = None
                  ) -> tuple[dict[str, tuple[tuple, dict, Any]], dict[str, tuple] | None]:
  """``{sub-model name: (args, kwargs, output)}`` as `jax.ShapeDtypeStruct`, from the first
  call of each sub-model while tracing ``task.loss`` on ``batch``; and, given ``state`` (the
  model's state as arrays), ``{name: (args, kwargs)}`` as arrays: the loss jitted on ``state``
  and ``batch``, returning every sub-model's inputs (what is computed after the last of them is
  pruned). Without ``state`` the trace is abstract and the second result None."""
  graphdef, abstract = nnx.split(model)
  calls: dict[str, tuple[tuple, dict, Any]] = {}
  values: dict[str, tuple] = {}

  def note(name, args, kwargs, out):
    if name not in calls:
      calls[name] = _abstract((args, kwargs, out))
      values[name] = (args, kwargs)

  def loss(state, batch):
    copy = nnx.merge(graphdef, state)
    if not isinstance(copy, HasSubmodels):  # the whole model: one call, of the loss itself
      _Recorder(WholeModel(copy, task.loss),
                lambda a, k, o: note(WHOLE_MODEL, a, k, o))(batch)
      return values
    names = {id(module): name for name, module in copy.submodels().items()}
    for path, node in list(nnx.iter_graph(copy)):
      if path and id(node) in names:
        name = names[id(node)]
        _replace(copy, path, _Recorder(node, lambda a, k, o, name=name: note(name, a, k, o)))
    task.loss(copy, batch)
    return values

  if state is None:
    jax.eval_shape(loss, abstract, batch)
    return calls, None
  return calls, jax.jit(loss)(state, batch)


def _at(root: nnx.Module, path: tuple) -> Any:
  """The node at ``path`` under ``root``: attributes, and items of `nnx.List`s."""
  node = root
  for key in path:
    node = node[key] if isinstance(key, int) else getattr(node, key)
  return node


def _replace(root: nnx.Module, path: tuple, new: nnx.Module) -> None:
  """Puts ``new`` at ``path`` under ``root``: an attribute, or an item of an `nnx.List`."""
  parent = _at(root, path[:-1])
  if isinstance(path[-1], int):
    parent[path[-1]] = new
  else:
    setattr(parent, path[-1], new)


@dataclasses.dataclass(frozen=True)
class _Analysis:
  """One sub-model program's FLOPs (lowered), bytes accessed and temporaries (compiled), and
  its seconds per call when timed (else None)."""

  flops: float
  accessed: float
  temp: float
  seconds: float | None = None


def _analyse(module: nnx.Module, args: tuple, kwargs: dict, out: Any, cache: dict,
             values: tuple | None = None) -> _Analysis:
  """XLA's analyses of ``module``'s forward + backward on one device of the default backend;
  given ``values`` (the call's ``(args, kwargs)`` as arrays), compiled at XLA's default options
  and timed on them (`hetjax.planner._profile_timing`)."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  device = SingleDeviceSharding(jax.devices()[0])
  on_device = lambda t: jax.tree.map(  # noqa: E731
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), t)
  inputs, treedef = jax.tree.flatten((args, kwargs))
  inexact = [jnp.issubdtype(x.dtype, jnp.inexact) for x in inputs]
  outputs = [o for o in jax.tree.leaves(out) if jnp.issubdtype(o.dtype, jnp.inexact)]
  abstract = on_device((params, rest, inputs, outputs))
  key = (graphdef, jax.tree.structure(abstract), tuple(jax.tree.leaves(abstract)))
  if key in cache:
    return cache[key]

  def forward_backward(params, rest, inputs, cotangents):
    def forward(params, floats):
      it = iter(floats)
      full = [next(it) if f else x for x, f in zip(inputs, inexact, strict=True)]
      call_args, call_kwargs = jax.tree.unflatten(treedef, full)
      result = nnx.merge(graphdef, params, rest)(*call_args, **call_kwargs)
      return [o for o in jax.tree.leaves(result) if jnp.issubdtype(o.dtype, jnp.inexact)], result

    floats = [x for x, f in zip(inputs, inexact, strict=True) if f]
    _, pullback, result = jax.vjp(forward, params, floats, has_aux=True)
    return result, pullback(cotangents)

  traced = jax.jit(forward_backward).trace(*abstract)
  lowered = traced.lower()
  compiled = lowered.compile(compiler_options=_COMPILER_OPTIONS if values is None else None)
  cost = compiled.cost_analysis()
  memory = compiled.memory_analysis()
  seconds = None
  if values is not None:
    fill = functools.partial(_profile_timing.filled, device=jax.devices()[0],
                             rng=np.random.default_rng(0))
    seconds = seconds_per_call(
        compiled, (fill(params), fill(rest), jax.tree.leaves(values), fill(outputs)))
  # XLA's count of the lowered program, or its matmuls' where XLA counted fewer (module
  # docstring); a backend with no analysis of lowered programs falls back to the compiled count.
  flops = program_flops(traced, lowered) or float(cost['flops'])
  cache[key] = _Analysis(flops, float(cost['bytes accessed']), float(memory.temp_size_in_bytes),
                         seconds)
  return cache[key]


def _own_parameters(module: nnx.Module, held: set[int]) -> list[Any]:
  """``module``'s parameters (abstract arrays) that no earlier sub-model holds, adding them to
  ``held`` (their `nnx.Param` objects' ids). A parameter two sub-models share (a head tied to
  the embedding's table) is stored, updated and given optimizer state once: it counts in the
  first sub-model that holds it. Counted in both, GPT-2 small's table (154 MB, 463 MB with
  Adam's slots) was priced twice."""
  own = []
  for _, node in nnx.iter_graph(module):
    if isinstance(node, nnx.Param) and id(node) not in held:
      held.add(id(node))
      own.append(node.get_value())
  return own


def _axis_sizes(params: nnx.State) -> tuple[dict[str, int], dict[str, int]]:
  """``(split_sizes, shard_sizes)``: per logical name, the smallest dimension carrying it."""
  is_spec = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731
  specs = jax.tree.leaves(nnx.to_pure_dict(nnx.get_partition_spec(params)), is_leaf=is_spec)
  shapes = jax.tree.leaves(nnx.to_pure_dict(params))
  sizes: dict[str, int] = {}
  for spec, shape in zip(specs, shapes, strict=True):
    for entry, size in zip(spec or (), shape.shape, strict=False):
      for name in entry if isinstance(entry, tuple) else (entry,):
        if name is not None:
          sizes[name] = min(sizes.get(name, size), size)
  pick = lambda axes: {a: sizes[a] for a in axes if a in sizes}  # noqa: E731
  return pick(TENSOR_AXES), pick(FSDP_AXES)


def _specs(params: nnx.State) -> list[tuple[set, ...]]:
  """Per parameter array, the set of logical names on each dimension (empty: unnamed); a spec
  shorter than its array's rank leaves the trailing dimensions unnamed, as JAX and Flax read
  it."""
  is_spec = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731
  specs = jax.tree.leaves(nnx.to_pure_dict(nnx.get_partition_spec(params)), is_leaf=is_spec)
  shapes = jax.tree.leaves(nnx.to_pure_dict(params))
  return [tuple(set(e) if isinstance(e, tuple) else {e} - {None}
                for e in (*(spec or ()), *(None,) * (len(shape.shape) - len(spec or ()))))
          for spec, shape in zip(specs, shapes, strict=True)]


def _row_outputs(task: Task, model: nnx.Module, batch: Any) -> float | None:
  """Of a model profiled whole, the bytes per example of one tensor-parallel all-reduce: the
  output of the layer that holds each row-parallel parameter (those `_tensor_reductions`
  counts: rank ≥ 2, a tensor axis on the first, input, dimension, whose partial sums are added
  up), averaged over them; None when it has none.

  The outputs are read from the loss traced abstractly on ``batch`` with each such layer
  wrapped in a `_Recorder`. A parameter the model's root holds itself, or whose layer the loss
  never calls, counts as a row-parallel matmul's output: its last dimension per position, times
  the task's ``tokens_per_example`` (at least one position); so does every one if the loss
  fails with its layers wrapped (it reads an attribute of a layer, not only calls it).

  Example: an MLP ``x → ('embed', 'mlp') → ('mlp', 'embed') → ('embed', 'classes')`` has one
  row-parallel kernel, the second; its output is ``float32[B, embed]``: ``4 · embed`` bytes.
  """
  params = nnx.state(model, nnx.Param)
  paths = [tuple(getattr(k, 'key', getattr(k, 'idx', k)) for k in path) for path, _ in
           jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]]
  rows = [(path, leaf) for path, leaf, dims in zip(
      paths, jax.tree.leaves(nnx.to_pure_dict(params)), _specs(params), strict=True)
      if len(dims) >= 2 and dims[0] & set(TENSOR_AXES)]
  if not rows:
    return None
  layers = sorted({path[:-1] for path, _ in rows if len(path) > 1}, key=len, reverse=True)
  graphdef, abstract = nnx.split(model)
  rows_in_batch = jax.tree.leaves(batch)[0].shape[0]
  outputs: dict[tuple, float] = {}

  def note(layer, out):
    if layer not in outputs:
      outputs[layer] = sum(_nbytes(o) for o in jax.tree.leaves(out)
                           if jnp.issubdtype(o.dtype, jnp.inexact)) / rows_in_batch

  def loss(state, batch):
    copy = nnx.merge(graphdef, state)
    for layer in layers:  # deepest first: a wrapped layer's own layers are wrapped already
      _replace(copy, layer, _Recorder(_at(copy, layer),
                                      lambda a, k, o, layer=layer: note(layer, o)))
    return task.loss(copy, batch)

  try:
    jax.eval_shape(loss, abstract, batch)
  except Exception:  # a model that needs its layers unwrapped: estimated below instead
    outputs.clear()
  positions = max(1, task.tokens_per_example)
  sizes = [outputs.get(path[:-1], leaf.shape[-1] * jnp.dtype(leaf.dtype).itemsize * positions)
           for path, leaf in rows]
  return sum(sizes) / len(sizes)


def _tensor_reductions(params: nnx.State) -> int:
  """Parameters of rank ≥ 2 whose first (input) dimension is a tensor axis, at least 1: the
  activation all-reduces per pass when tensor parallelism splits them (see `SubmodelProfile`)."""
  return max(1, sum(bool(dims[0] & set(TENSOR_AXES)) for dims in _specs(params)
                    if len(dims) >= 2))


def _fsdp_arrays(params: nnx.State) -> int:
  """Parameter arrays with an FSDP axis on some dimension, at least 1: FSDP's all-gathers."""
  return max(1, sum(any(d & set(FSDP_AXES) for d in dims) for dims in _specs(params)))


def _nbytes(x: Any) -> int:
  return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize

