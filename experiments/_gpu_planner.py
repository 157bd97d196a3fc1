"""The planner on the device: its profile, its plan for one device, and that plan trained there.

A part of ``experiments/gpu_check.py``. For the ``gpt`` and ``wide_deep`` models, on JAX's default
backend and its first device only:

1. **Profile.** `hetjax.planner.profile_submodels` at the step's batch, ``timed=True``: XLA's
   analyses of each sub-model compiled alone for the default backend's device (FLOPs, bytes),
   and its forward + backward timed there on the real step's inputs, at the batch and twice it
   (measured seconds, and the FLOP/s it reached: the profile's FLOPs over that time). The
   loss's whole gradient is timed as one program too: what the sub-models timed apart took
   beyond it is a program call's fixed cost, which the step pays once (``call_s``), taken off
   every sub-model's time but the first's.
2. **Plan.** The cluster is this one device as `hetjax.planner.measure_cluster` measures it (a
   float32 matmul for FLOP/s, 256² on a CPU and 4096² on an accelerator; an update of 16 MiB, or
   256 MiB on an accelerator, for bandwidth; an accelerator runs 16 of each in one program);
   `hetjax.planner.search` with `hetjax.planner.CompiledCost` (``hetjax-plan``'s
   default; on one device every option is `AnalyticCost`'s) picks the plan and predicts its
   step time: each sub-model's timed forward + backward plus its optimizer update's memory
   traffic over the measured bandwidth (``hetjax-plan --profile=timed``).
3. **Trained.** `hetjax.planner.compile_plan` builds the plan's trainer, as ``hetjax-train
   --plan`` does (one device: a `hetjax.train.Trainer` on the plan's mesh), and its compiled
   step runs from a state filled from the host on batches placed beforehand (the host's data
   pipeline is not timed: the planner does not model it). Measured: the median over rounds of
   back-to-back steps, per step.

``ratio`` is predicted / measured; the goal is 0.75–1.25. Every row says which of its fields are
``measured`` (timed on the device), ``modelled`` (the planner's prediction) or ``analysed``
(XLA's cost analysis, counted rather than timed).

Example::

  rows = run(quick=True)
  print('\\n'.join(markdown(rows)))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hetjax import models, planner
from hetjax.runtime import device_memory, seconds_per_call

GOAL = 0.25  # predicted within this fraction of measured

_QUICK = {'gpt': ({'d_model': 32, 'heads': 2, 'layers': 1, 'mlp': 64, 'seq_len': 16}, 8),
          'wide_deep': ({'rows': 1024, 'dim': 16, 'hidden': 32, 'hidden2': 16}, 64)}
# gpt: 28 M parameters, 340 MB with Adam's slots; wide_deep: the model's defaults (a 25.6 MB table).
_FULL = {'gpt': ({'d_model': 768, 'heads': 12, 'layers': 4, 'mlp': 3072, 'seq_len': 512}, 32),
         'wide_deep': ({}, 4096)}

_SUBMODEL_MEASURED = ('measured_s', 'flops_per_s')
_SUBMODEL_MODELLED = ('predicted_s',)
_SUBMODEL_ANALYSED = ('flops_per_step', 'params', 'param_bytes', 'bytes_accessed_per_example',
                      'bytes_accessed_per_step', 'activation_bytes_per_example')


def run(quick: bool) -> list[dict]:
  """One row per model: its sub-models' profiles and times, its plan, predicted and measured.

  Args:
    quick: tiny models and few timing rounds (seconds on a CPU), else the sizes in ``_FULL``.

  Returns:
    Rows with ``part`` ``'planner'``, ``model``, ``kwargs``, ``batch``, ``device``,
    ``device_flops_per_s`` and ``device_bytes_per_s`` (the cluster as measured),
    ``submodels`` (one dict each: ``name``, ``layout``, the profile's fields, ``measured_s``,
    ``flops_per_s``, ``predicted_s``), ``plan`` (its layouts, e.g. ``'embed dp1, block_0
    dp1, head dp1'``), ``predicted_step_s``, ``measured_step_s``, ``ratio``, ``met`` and the
    ``measured`` / ``modelled`` / ``analysed`` lists of field names (``submodels[].x``: the
    field ``x`` of every sub-model).
  """
  devices = jax.devices()[:1]
  rounds, calls = (3, 2) if quick else (5, 5)
  cluster = planner.measure_cluster(devices)
  worker = cluster.workers[0]
  rows = []
  for name, (kwargs, batch) in (_QUICK if quick else _FULL).items():
    task = models.make_task(name, **kwargs)
    profiles = planner.profile_submodels(task, batch, timed=True)
    cost = planner.CompiledCost(task, devices=devices)
    plan = planner.search(profiles, cluster, batch, cost, micro_batches=1)
    submodels = []
    for profile, sub in zip(profiles, plan.submodels, strict=True):
      seconds = profile.timed_seconds(batch)
      flops = profile.flops_per_example * batch
      submodels.append({
          'name': profile.name, 'layout': sub.layout.name(plan.group_devices(sub)),
          'flops_per_step': flops, 'params': profile.params, 'param_bytes': profile.param_bytes,
          'bytes_accessed_per_example': profile.bytes_accessed_per_example,
          'bytes_accessed_per_step': profile.bytes_accessed_per_step,
          'activation_bytes_per_example': profile.activation_bytes_per_example,
          # A sub-model that took no longer than a program call's fixed cost is left 0 s:
          # no rate.
          'measured_s': seconds, 'flops_per_s': flops / seconds if seconds > 0 else None,
          'predicted_s': sub.predicted_s})
    measured = _step_seconds(plan, task, batch, devices, rounds, calls)
    ratio = plan.predicted_step_s / measured
    rows.append({
        'part': 'planner', 'model': name, 'kwargs': dict(kwargs), 'batch': batch,
        'device': f'{devices[0].platform}: {devices[0].device_kind}',
        'device_flops_per_s': worker.flops_per_s, 'device_bytes_per_s': worker.memory_bytes_per_s,
        'submodels': submodels, 'plan': ', '.join(f'{s["name"]} {s["layout"]}' for s in submodels),
        'predicted_step_s': plan.predicted_step_s, 'measured_step_s': measured, 'ratio': ratio,
        'met': abs(ratio - 1) <= GOAL, 'call_s': profiles[0].call_seconds,
        'measured': ['measured_step_s', 'device_flops_per_s', 'device_bytes_per_s', 'call_s',
                     *(f'submodels[].{f}' for f in _SUBMODEL_MEASURED)],
        'modelled': ['predicted_step_s', *(f'submodels[].{f}' for f in _SUBMODEL_MODELLED)],
        'analysed': [f'submodels[].{f}' for f in _SUBMODEL_ANALYSED]})
  return rows


def markdown(rows: list[dict]) -> list[str]:
  """The rows as a heading, a table of sub-models, a table of plans and the goal line."""
  lines = ['### The planner on the device', '']
  if rows:
    lines += [f'{rows[0]["device"]}; the plan\'s cluster: this one device, measured at '
              f'{rows[0]["device_flops_per_s"] / 1e12:.3g} TFLOP/s (float32 matmul) and '
              f'{(rows[0]["device_bytes_per_s"] or 0) / 1e9:.3g} GB/s (an update).', '']
  lines += ['| model | sub-model | layout | GFLOP/step | measured TFLOP/s | measured ms '
            '| predicted ms |', '|---|---|---|---:|---:|---:|---:|']
  rate = lambda x: '—' if x is None else f'{x / 1e12:.3g}'  # noqa: E731
  for row in rows:
    for s in row['submodels']:
      lines.append(f'| {row["model"]} | {s["name"]} | {s["layout"]} | '
                   f'{s["flops_per_step"] / 1e9:.4g} | {rate(s["flops_per_s"])} | '
                   f'{1e3 * s["measured_s"]:.3f} | {1e3 * s["predicted_s"]:.3f} |')
  calls = ', '.join(f'{row["model"]} {1e3 * row["call_s"]:.3f} ms' for row in rows)
  lines += ['', 'Sub-model: forward + backward alone, measured on the device, less a program '
            'call\'s fixed cost for all but the first (what the sub-models timed apart took '
            f'beyond the whole gradient timed as one program, per call too many: {calls}); '
            'predicted: the plan\'s node (its optimizer update included).', '',
            '| model | batch | plan | predicted ms | measured ms | predicted / measured |',
            '|---|---:|---|---:|---:|---:|']
  for row in rows:
    lines.append(f'| {row["model"]} | {row["batch"]} | {row["plan"]} | '
                 f'{1e3 * row["predicted_step_s"]:.3f} | {1e3 * row["measured_step_s"]:.3f} | '
                 f'{row["ratio"]:.2f} |')
  met = bool(rows) and all(row['met'] for row in rows)
  detail = ', '.join(f'{row["model"]} {row["ratio"]:.2f}' for row in rows)
  lines += ['', f'goal: predicted within {GOAL:.0%} of measured: {"met" if met else "not met"} '
            f'({detail})']
  return lines


def _step_seconds(plan: planner.Plan, task, batch: int, devices: list, rounds: int,
                  calls: int) -> float:
  """Seconds per step of ``plan`` trained on ``devices`` (module docstring, step 3)."""
  compiled = planner.compile_plan(plan, task, optax.adam(1e-3), batch,
                                  device_memory(devices), devices=devices)
  trainer, program = compiled.trainer, compiled.compiled
  batches = [trainer.put_batch(trainer.global_batch_at(s)) for s in range(calls)]
  # The state is filled from the host, not initialised by the model's init: that would cost
  # one more compile, and a step's time does not depend on the values.
  rng, abstract = np.random.default_rng(0), trainer.abstract_state()
  place = lambda tree, fill: jax.tree.map(  # noqa: E731
      lambda x: jax.device_put(fill(x), x.sharding), tree)
  state = [dataclasses.replace(abstract, step=place(abstract.step, _zeros),
                               params=place(abstract.params, lambda x: _values(x, rng)),
                               opt_state=place(abstract.opt_state, _zeros))]  # as Adam starts

  def steps() -> Any:
    for b in batches:
      state[0], metrics = program(state[0], b)
    return metrics

  return seconds_per_call(steps, (), rounds, 1) / calls


def _zeros(x: jax.ShapeDtypeStruct) -> np.ndarray:
  return np.zeros(x.shape, x.dtype)


def _values(x: jax.ShapeDtypeStruct, rng: np.random.Generator) -> np.ndarray:
  """Host values of ``x``'s shape: small normal floats (no denormals, no overflow)."""
  if not jnp.issubdtype(x.dtype, jnp.inexact):
    raise ValueError(f'cannot fill a {x.dtype} array of shape {x.shape} with made-up values')
  return np.asarray(0.02 * rng.standard_normal(x.shape), x.dtype)
