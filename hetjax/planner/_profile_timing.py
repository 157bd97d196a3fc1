"""Timing a sub-model's forward + backward on the device: the planner's measured compute.

Why time rather than count: a cost model built from FLOPs and bytes prices each sub-model as
``max(FLOPs / peak, bytes / bandwidth)``, and on a GPU that is far from what the device does.
A transformer block on a GPU takes well over the time its roofline says, because its matmuls,
softmax and layer norms do not overlap their memory traffic with the tensor cores' work; a small
model's step (wide & deep's) is mostly kernel launches, which no FLOP or byte count sees. A large
model's sub-models, timed alone, sum to close to its measured step. Fela profiles its sub-models
on the hardware for the same reason.

What is timed is the program `hetjax.planner.profile_submodels` analyses (the sub-model's
``vjp`` with respect to its parameters and floating-point inputs, fed a cotangent of its
output's shape), compiled for the device at XLA's default options, on inputs of the real step:
the task's loss is run once, jitted, on a real batch, with parameters filled from the host
(`filled`: small normals; a step's time does not depend on the values), and every sub-model's
arguments are taken from it (token ids in range, activations of the right scale). One untimed
call compiles and touches the buffers; then the median over ``rounds`` of ``calls`` back-to-back
calls, waited for at the end, per call (`hetjax.runtime.seconds_per_call`): back-to-back, as a
step issues its sub-models, so that a call's dispatch overlaps the previous one's work.

**One call a step.** Each sub-model timed as its own program pays a program call's fixed cost
(dispatch, launch, the wait for the first kernel) that the step, one program, pays once. For a
sub-model that takes not much longer than that cost it is most of the time: a small model's
sub-models timed alone can sum to well over its whole step (update included), and the planner
then predicts that much over the step. So the whole loss's gradient is timed too, as one
program at the profile's batch, and `call_seconds` is what the separate programs took beyond it,
per call too many; every sub-model but the first has it taken off its fixed time (the first
carries the step's one call). Where the separate programs sum to no more than the one, it is 0
and nothing changes. (On a CPU it is not 0 either for small models, measured alone; what makes
it up there was not examined.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hetjax._errors import ConfigError


def filled(abstract: Any, device: jax.Device, rng: np.random.Generator) -> Any:
  """Arrays of ``abstract``'s shapes and dtypes on ``device``, put from the host: small normal
  values (0.02 σ: no denormals, no overflow) for floating-point leaves, zeros for the rest
  (integer counters, booleans).

  Raises:
    ConfigError: for a leaf that cannot be made on the host (a PRNG key array in the model's
      state): such a model's sub-models cannot be timed.
  """
  def one(x):
    dtype = x.dtype
    if jnp.issubdtype(dtype, jnp.inexact):
      value = np.asarray(0.02 * rng.standard_normal(x.shape), dtype)
    elif jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
      value = np.zeros(x.shape, dtype)
    else:
      raise ConfigError(f'cannot time the sub-models: their state holds a {dtype} array of '
                        f'shape {x.shape}, which cannot be made up on the host (profile them '
                        'without timing: --profile=analysed)')
    return jax.device_put(value, device)
  return jax.tree.map(one, abstract)


def fit_line(batch: int, seconds: float, doubled_seconds: float) -> tuple[float, float]:
  """``(seconds_per_step, seconds_per_example)`` of the line through the times at ``batch`` and
  ``2 · batch`` rows, both clamped at zero: a step time that does not grow with the rows (a
  GPU's flat region, or noise) is all fixed cost; one that grew faster than the rows is all
  per-example cost.

  Example::

    >>> fit_line(32, 2.0e-3, 3.0e-3)   # 1 ms fixed, 31.25 µs a row
    (0.001, 3.125e-05)
  """
  slope = max(doubled_seconds - seconds, 0.0) / batch
  return max(seconds - slope * batch, 0.0), (seconds / batch if slope * batch > seconds
                                             else slope)


def call_seconds(separate: Sequence[float], whole: float) -> float:
  """A program call's fixed seconds, from n sub-models timed as n programs (``separate``) and
  the step's work timed as one (``whole``): ``(sum(separate) − whole) / (n − 1)``, at least 0,
  and 0 for one sub-model (module docstring).

  Example (three sub-models timed alone, the whole gradient timed as 0.25 ms)::

    >>> round(call_seconds([0.088e-3, 0.142e-3, 0.178e-3], 0.25e-3) * 1e6, 1)   # µs
    79.0
  """
  if len(separate) < 2:
    return 0.0
  return max(sum(separate) - whole, 0.0) / (len(separate) - 1)
