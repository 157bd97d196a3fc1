"""What the planner knows about one sub-model: measured sizes and costs, per example."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class SubmodelProfile:
  """One sub-model's costs, from XLA's analyses of the sub-model compiled alone (or made up,
  in tests). Per-example quantities scale linearly with the batch.

  Attributes:
    name: the sub-model's name, as `HasSubmodels.submodels()` gives it (``'model'``,
      `hetjax.planner.WHOLE_MODEL`, for the whole of a model without them).
    params: parameter count.
    param_bytes: bytes of its parameters. A parameter shared with an earlier sub-model (a head
      tied to the embedding's table) counts there, not here: it is stored and updated once.
    flops_per_example: forward + backward FLOPs per example (`cost_analysis()['flops']`).
    bytes_accessed_per_example: memory traffic per example (`cost_analysis()['bytes accessed']`
      at two batch sizes: the slope).
    bytes_accessed_per_step: traffic that does not grow with the batch (the intercept):
      parameters read, gradients written — a dense embedding gradient's whole table.
    output_bytes_per_example: bytes of its output activation per example: what crosses to the
      next sub-model (and back, as a gradient), i.e. what resharding between them moves.
    activation_bytes_per_example: activations kept for the backward pass per example
      (`memory_analysis()` temporaries of the sub-model's gradient program; for the last
      sub-model, plus the loss's gradient with respect to its output).
    split_sizes: for each logical axis of its parameters that tensor parallelism may split
      (``'mlp'``, ``'heads'``, ``'vocab'``, ``'table'``), the size of that dimension (the
      smallest, if several parameters carry the name): a degree must divide it.
    shard_sizes: the same for the axes FSDP may split (``'embed'``, ``'table'``).
    tensor_reductions: activation all-reduces per pass under tensor parallelism: its
      parameters whose input (first) dimension is a tensor axis, at least 1. A row-parallel
      matmul (``('mlp', 'embed')``, attention's ``('heads', …, 'embed')``) or a row-sharded
      table leaves partial sums of the output to add up, forward; its column-parallel partner
      does the same for the input gradient, backward. A transformer block has two (attention
      output, MLP down), an embedding table or an MLP pair one.
    fsdp_arrays: parameter arrays carrying an FSDP axis (``'embed'``, ``'table'``), at least 1:
      the all-gathers FSDP issues, one per array (XLA:CPU gathers each separately, mostly once
      per step, the backward reusing the forward's: a transformer block has 11 such arrays, and
      its compiled FSDP step 13 all-gathers per block).
    seconds_per_example, seconds_per_step: the sub-model's forward + backward timed on a device
      (``profile_submodels(..., timed=True)``) at the profile's batch and twice it: the slope
      and the intercept of that line (`hetjax.planner._profile_timing`); None when not timed.
      The cost model then prices its compute from them, not from FLOPs and bytes, taking the
      device timed on to be as fast as the cluster's fastest: a worker k times slower
      (``flops_per_s``) runs the sub-model k times longer.
    call_seconds: of a timed program, the fixed cost of calling it (dispatch, launch), which a
      step, one program, pays once: what the sub-models timed as separate programs took beyond
      the loss's whole gradient timed as one, per call too many (`hetjax.planner.
      _profile_timing.call_seconds`). Already taken off ``seconds_per_step`` of every
      sub-model but the first, which carries the step's one call; 0 when not timed.
    tensor_bytes_per_example: bytes per example each of the ``tensor_reductions`` all-reduces
      moves, when that is not the output's; None: ``output_bytes_per_example``. A sub-model
      ends in its row-parallel layer, so its output is what the all-reduce adds up. The whole
      model as one part (`hetjax.planner.WHOLE_MODEL`) outputs its per-example losses, 4 bytes,
      while its row-parallel layers' outputs are what tensor parallelism all-reduces: the mean
      of those (`hetjax.planner.profile_submodels`).
  """

  name: str
  params: int
  param_bytes: float
  flops_per_example: float
  bytes_accessed_per_example: float = 0.0
  bytes_accessed_per_step: float = 0.0
  output_bytes_per_example: float = 0.0
  activation_bytes_per_example: float = 0.0
  split_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
  shard_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
  tensor_reductions: int = 1
  fsdp_arrays: int = 1
  seconds_per_example: float | None = None
  seconds_per_step: float = 0.0
  call_seconds: float = 0.0
  tensor_bytes_per_example: float | None = None

  @property
  def timed(self) -> bool:
    """Whether the sub-model's forward + backward was timed on a device."""
    return self.seconds_per_example is not None

  def timed_seconds(self, rows: float) -> float:
    """Seconds of its forward + backward over ``rows`` rows on the device it was timed on."""
    if self.seconds_per_example is None:
      raise ValueError(f'sub-model {self.name!r} was not timed')
    return self.seconds_per_step + self.seconds_per_example * rows

  def to_json(self) -> dict:
    return {**dataclasses.asdict(self), 'split_sizes': dict(self.split_sizes),
            'shard_sizes': dict(self.shard_sizes)}

  @classmethod
  def from_json(cls, data: Mapping) -> SubmodelProfile:
    return cls(**data)
