"""FLOPs of a training step as XLA counts them: the numerator of model FLOPs utilisation (MFU).

XLA's ``cost_analysis()`` counts the optimised program's floating-point operations: every
matmul and convolution, and the elementwise work (softmax, norms, activations, the loss, the
optimizer's update) that the analytic 6·N·tokens leaves out. On a program partitioned over
several devices it counts **one device's part**: measured with jax 0.10.2 on XLA:CPU, the
transformer of `tests/test_flops.py` (d_model 64, 2 layers, batch 32 × 63 tokens) reports
1.674e9 FLOPs on one device and 4.189e8 per device data-parallel over 4 (× 4 = 1.676e9),
4.187e8 under FSDP over 4 and 4.348e8 tensor-parallel over 4 (+4 % × 4: the norms and the loss
run on every device of a tensor-parallel group). `hetjax.pipeline`'s roofline costs read it the
same way. `step_flops` multiplies by the mesh's devices.

Against the analytic count, 6·N·tokens for the N parameters of matmuls (embedding tables are
gathers and count nothing), plus attention's 12·layers·T²·d_model per sequence of T tokens
(the score and value matmuls, forward and backward, the causal mask not exploited), XLA's count
on one device of the shipped transformer at jax 0.10.2 (`flops_ratio`):

==========================================  ======  =================
d_model, heads, layers, mlp, T; batch       vs 6N   vs 6N + attention
==========================================  ======  =================
32, 4, 2, 64, 15; 16                        1.235   1.146
64, 4, 2, 256, 63; 32                       1.207   1.058
128, 8, 2, 512, 63; 64                      1.118   1.039
256, 8, 4, 1024, 127; 16                    1.102   1.020
==========================================  ======  =================

The excess over 6N + attention is the elementwise work, a smaller part the wider the model.
"""

from __future__ import annotations

import math
from typing import Any

from hetjax._errors import ConfigError
from hetjax.train._trainer import Trainer


def compiled_flops(compiled: Any) -> float:
  """``cost_analysis()['flops']`` of a compiled program (a `jax.stages.Compiled`): one device's
  part of a partitioned program (module docstring); 0.0 when the backend gives no analysis.

  JAX has returned the analysis as a dict (now), as a list of one dict per program (before
  0.4.30) and as None (backends without one); all are read here.

  Example::

    compiled_flops(jax.jit(lambda a: a @ a).lower(jnp.ones((64, 64))).compile())   # 524288.0
  """
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # a backend without cost analysis raises errors of its own
    return 0.0
  if isinstance(analysis, list | tuple):
    analysis = analysis[0] if analysis else None
  if not analysis:
    return 0.0
  flops = float(analysis.get('flops', 0.0))
  return flops if math.isfinite(flops) and flops > 0 else 0.0


def matmul_flops(jaxpr: Any) -> float:
  """FLOPs of the matmuls in ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``, e.g. a
  `jax.stages.Traced`'s ``.jaxpr``): 2 · output elements · contracted size of every
  ``dot_general``, counted in the jaxprs nested in its equations too (a ``scan``'s body times
  its length, a ``cond``'s costliest branch, a ``while``'s body once), and cuDNN's fused
  attention (`jax.nn.dot_product_attention` with ``implementation='cudnn'``), which XLA sees
  as a custom call: its two matmuls, 4 · B · N · T · S · H forward, twice that backward (the
  scores recomputed there are not counted, as remat's are not), the causal mask not exploited
  (so the same as XLA's attention's dot_generals).

  Example::

    traced = jax.jit(lambda a, b: a @ b).trace(jnp.ones((8, 16)), jnp.ones((16, 4)))
    matmul_flops(traced.jaxpr)   # 2 · 8 · 4 · 16 = 1024.0
  """
  return sum(equation_flops(eqn) * count for eqn, count in matmul_equations(jaxpr))


def matmul_equations(jaxpr: Any) -> list[tuple[Any, int]]:
  """The matmul equations of ``jaxpr`` (every ``dot_general`` and cuDNN attention equation)
  with how many times the program runs each, as `matmul_flops` counts them: nested jaxprs
  included, a ``scan``'s body times its length, a ``cond``'s costliest branch, a ``while``'s
  body once. What `hetjax.bench.time_matmuls` times."""
  inner = getattr(jaxpr, 'jaxpr', jaxpr)
  found: list[tuple[Any, int]] = []
  for eqn in inner.eqns:
    if eqn.primitive.name == 'dot_general' or eqn.primitive.name.startswith(_CUDNN_ATTENTION):
      found.append((eqn, 1))
      continue
    nested = [matmul_equations(j) for v in eqn.params.values() for j in _jaxprs(v)]
    if eqn.primitive.name == 'cond':
      nested = [max(nested, key=lambda eqns: sum(equation_flops(e) * n for e, n in eqns),
                    default=[])]
    times = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    found += [(e, n * times) for eqns in nested for e, n in eqns]
  return found


def equation_flops(eqn: Any) -> float:
  """Matmul FLOPs of one run of a ``dot_general`` (2 · output elements · contracted size) or
  cuDNN attention equation (`_attention_flops`)."""
  if eqn.primitive.name.startswith(_CUDNN_ATTENTION):
    return _attention_flops(eqn)
  (contracting, _), _ = eqn.params['dimension_numbers']
  lhs = eqn.invars[0].aval.shape
  return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)


#: cuDNN's fused attention primitives (and their ``_wrapper`` and fp8 forms) start with this.
_CUDNN_ATTENTION = 'dot_product_attention_'


def _attention_flops(eqn: Any) -> float:
  """Matmul FLOPs of one cuDNN attention equation: its query is ``[B, T, N, H]`` (or ``[B, N,
  T, H]``, ``layout`` BNTH = 1), its key has S positions; forward 4·B·N·T·S·H, backward
  twice that."""
  query, key = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
  layout = eqn.params.get('layout')
  seq_axis = 2 if getattr(layout, 'value', layout) == 1 else 1
  forward = 4.0 * math.prod(query) * key[seq_axis]
  return 2 * forward if 'bwd' in eqn.primitive.name else forward


def _jaxprs(value: Any) -> list:
  """The jaxprs in one equation parameter: itself, or the members of a tuple of them."""
  items = value if isinstance(value, tuple | list) else (value,)
  return [v for v in items if hasattr(getattr(v, 'jaxpr', v), 'eqns')]


def program_flops(traced: Any, lowered: Any = None) -> float:
  """FLOPs of a traced program (`jax.stages.Traced`): XLA's count of its lowered HLO
  (`compiled_flops`; ``lowered``, ``traced.lower()``, when the caller has it already, else it is
  lowered here), or its matmuls' (`matmul_flops`) where XLA counted fewer. On a GPU XLA's
  analysis misses matmuls: it can count a small fraction of what a transformer block's matmuls
  do (jax#22249 shows the same for a dense layer). Where XLA counts them (a CPU), its
  count is the larger: the matmuls plus the elementwise work.

  Example::

    program_flops(trainer.trace_step())   # what hetjax's MFU counter divides by
  """
  lowered = traced.lower() if lowered is None else lowered
  return max(compiled_flops(lowered), matmul_flops(traced.jaxpr))


def step_flops(trainer: Trainer) -> float:
  """FLOPs of one whole SPMD step of ``trainer`` (every device's part together): XLA's count
  for one device (`compiled_flops` of `Trainer.compile_step`) times the mesh's devices, or the
  step's matmuls (`matmul_flops`) where that is fewer (a GPU's count misses them).

  It compiles the step ahead of time (abstract state: nothing is allocated), once more than the
  run itself does unless the persistent compilation cache holds it. Other modes run the same
  model on the same global batch; count them with a one-device `Trainer` of the task (its
  FLOPs are the model's, whatever the layout)::

    one = Trainer(task, optimizer, global_batch, make_mesh((1, 1), devices=jax.devices()[:1]),
                  Strategy.DATA_PARALLEL.rules())
    flops = step_flops(one)

  Example::

    step_flops(trainer)   # 1.67e9 for tests/test_flops.py's transformer, batch 32

  Raises:
    ConfigError: ``trainer`` is not a `Trainer`.
  """
  if not isinstance(trainer, Trainer):
    raise ConfigError(f'step_flops counts the step of a Trainer (SPMD), got '
                      f'{type(trainer).__name__}: count its task with a one-device Trainer')
  counted = compiled_flops(trainer.compile_step()) * trainer.mesh.devices.size
  # A GPU's compiled program hides its matmuls in cuBLAS calls (`program_flops`): at least those.
  return max(counted, matmul_flops(trainer.trace_step().jaxpr))


def flops_ratio(xla_flops: float, analytic_flops: float) -> float:
  """XLA's count over an analytic one (6·N·tokens, plus attention): a check that the MFU's
  numerator counts what the model computes. About 1.0–1.25 for the shipped transformer at
  jax 0.10.2 (module docstring); far below 1, XLA missed work (a custom call it cannot see
  into); far above, the analytic count left out a part of the model.

  Example::

    flops_ratio(1.674e9, 6 * 114_688 * 32 * 63)   # 1.207: the module docstring's d_model 64

  Raises:
    ConfigError: either count is not a positive finite number.
  """
  for name, value in (('xla_flops', xla_flops), ('analytic_flops', analytic_flops)):
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
      raise ConfigError(f'flops_ratio: {name} must be a positive number, got {value!r}')
  return float(xla_flops) / float(analytic_flops)
