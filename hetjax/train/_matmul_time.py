"""A program's matmuls timed alone, at their shapes: how much of a step its matmuls take.

MFU says how far a step is from the device's peak, not why. A step is its matmuls (and, with
cuDNN's fused attention, attention kernels) plus everything else: norms, activations, the
loss's softmax, the optimizer's update, each a pass over memory. `time_matmuls` runs each
distinct matmul of a traced step (`matmul_equations`: every ``dot_general`` and cuDNN attention
equation, with how many times the step runs it) as a program of its own, on operands of its
shapes and dtypes, with its own parameters (precision, accumulation type, layout), and times
it. The step's time less the matmuls' is what the rest costs; the model's FLOPs over the
matmuls' time is the MFU the step would reach if nothing else ran.

What is measured: each distinct equation's seconds per call, the median over rounds of
back-to-back calls waited for at the end (`hetjax.runtime.seconds_per_call`), after one
untimed call that compiles it. Calls back to back let one call's dispatch overlap the last
one's work, as in a step; a matmul too small to cover a call's dispatch is priced at the
dispatch, so on a device where they are small (a CPU's tiny test models) the sum overstates
the matmuls' share. Operands are constant-filled on the device (a matmul's time does not
depend on its values); an equation with a non-empty integer operand (cuDNN's sequence lengths,
whose values change the work) is not timed, and is listed with why.

Example::

  traced = trainer.trace_step()
  timed = time_matmuls(traced.jaxpr)
  timed.seconds, timed.flops   # the step's matmuls, once each as the step runs them
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from hetjax.runtime import seconds_per_call
from hetjax.train._flops import equation_flops, matmul_equations


@dataclasses.dataclass(frozen=True)
class TimedMatmul:
  """One distinct matmul equation of a program.

  Attributes:
    primitive: ``'dot_general'``, or the name of cuDNN's attention primitive.
    shapes: its operands' shapes; ``dtypes``: their dtypes' names.
    count: how many times the program runs it (a scan's length, identical equations merged).
    flops: matmul FLOPs of one run (`hetjax.bench.matmul_flops`'s count).
    seconds: measured seconds of one run, None when not timed (``error`` says why).
  """

  primitive: str
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[str, ...]
  count: int
  flops: float
  seconds: float | None
  error: str | None = None


@dataclasses.dataclass(frozen=True)
class MatmulTime:
  """The distinct matmuls of a program, each timed (`time_matmuls`)."""

  matmuls: tuple[TimedMatmul, ...]

  @property
  def seconds(self) -> float:
    """Seconds of one run of the program's timed matmuls, each as many times as it runs."""
    return sum(m.seconds * m.count for m in self.matmuls if m.seconds is not None)

  @property
  def flops(self) -> float:
    """FLOPs of those timed matmuls."""
    return sum(m.flops * m.count for m in self.matmuls if m.seconds is not None)

  @property
  def untimed(self) -> tuple[TimedMatmul, ...]:
    """The equations that could not be timed."""
    return tuple(m for m in self.matmuls if m.seconds is None)


def time_matmuls(jaxpr: Any, device: jax.Device | None = None, rounds: int = 5,
                 calls: int = 10) -> MatmulTime:
  """Times every distinct matmul equation of ``jaxpr`` (a ``ClosedJaxpr``, e.g. a
  `jax.stages.Traced`'s ``.jaxpr``) alone on ``device`` (default: the first of JAX's default
  backend), in the order the program first runs it (module docstring).

  Example: a step with one ``[32768, 768] × [768, 2304]`` bfloat16 projection in a scan of 12
  layers gives one `TimedMatmul` of ``count`` 12, timed once.
  """
  device = jax.devices()[0] if device is None else device
  merged: dict[str, list] = {}
  for eqn, count in matmul_equations(jaxpr):
    key = repr((eqn.primitive.name, [(v.aval.shape, str(v.aval.dtype)) for v in eqn.invars],
                sorted(eqn.params.items(), key=lambda item: item[0])))
    if key in merged:
      merged[key][1] += count
    else:
      merged[key] = [eqn, count]
  return MatmulTime(tuple(_timed(eqn, count, device, rounds, calls)
                          for eqn, count in merged.values()))


def _timed(eqn: Any, count: int, device: jax.Device, rounds: int, calls: int) -> TimedMatmul:
  avals = [v.aval for v in eqn.invars]
  shapes = tuple(tuple(a.shape) for a in avals)
  dtypes = tuple(str(a.dtype) for a in avals)
  flops = equation_flops(eqn)
  row = dict(primitive=eqn.primitive.name, shapes=shapes, dtypes=dtypes, count=count,
             flops=flops)
  if any(not jnp.issubdtype(a.dtype, jnp.inexact) and math.prod(a.shape) for a in avals):
    return TimedMatmul(**row, seconds=None,
                       error='an integer operand (its values would change the work)')
  operands = [jnp.full(a.shape, 0.01 if jnp.issubdtype(a.dtype, jnp.inexact) else 0, a.dtype,
                       device=device) for a in avals]
  primitive, params = eqn.primitive, dict(eqn.params)
  program = jax.jit(lambda *xs: primitive.bind(*xs, **params))
  try:
    seconds = seconds_per_call(program, tuple(operands), rounds, calls)
  except Exception as e:
    return TimedMatmul(**row, seconds=None, error=f'{type(e).__name__}: '
                       f'{str(e).splitlines()[0][:200] if str(e) else ""}')
  return TimedMatmul(**row, seconds=seconds)
