"""The sections of a run's `Config`, each a frozen dataclass that checks its own fields.

A section groups the options one part of the engine reads (MaxText's and Levanter's configs are
grouped the same way): the model and its data, the optimizer, the parallel layout, share
balancing, pipelines, SchMP, parameter servers, emulated hosts and links, checkpoints, logging.
A bad value fails where it is set, in one line naming the section and the field::

  >>> BalanceConfig(bucket=-1)
  Traceback (most recent call last):
  hetjax._errors.ConfigError: balance.bucket must be >= 0 (0: automatic), got -1

A field that takes one of a set of names (a strategy, a policy, a schedule …) declares them with
`hetjax.run._choices.choice`, and a mistyped one names the closest, without importing JAX::

  >>> PipelineConfig(schedule='gpipe2')
  Traceback (most recent call last):
  hetjax._errors.ConfigError: unknown pipeline.schedule 'gpipe2'; did you mean 'gpipe'? choose
  one of: gpipe, 1f1b

`AMBIGUOUS` and `FLAT_NAMES` are derived from the sections: a bare name two of them share
(``schedule``) is never a flat name.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from hetjax._checks import at_least, fraction
from hetjax._errors import ConfigError
from hetjax.run._choices import (
  DTYPES,
  GRANULARITIES,
  LR_SCHEDULES,
  OPTIMIZERS,
  OVERLAP_ESTIMATES,
  PIPELINE_SCHEDULES,
  POLICIES,
  PS_CONSISTENCIES,
  REMATS,
  RENAMED_SYNC_NAMES,
  STRATEGIES,
  SYNC_NAMES,
  check_choices,
  choice,
  ps_protocol,
)


class Mode(enum.Enum):
  """How a step runs (``parallelism.mode``).

  ``auto`` picks one of the others by one rule, `hetjax.run.mode_of` (its words:
  ``hetjax.run._modes.AUTO_RULE``); each mode's description is its entry in `hetjax.run.MODES`.
  """

  AUTO = 'auto'
  SPMD = 'spmd'          # one jitted step over one mesh (`hetjax.train.Trainer`)
  SHARES = 'shares'      # per-worker batch shares, re-sized by a policy (LB-BSP)
  TOKENS = 'tokens'      # Fela's tokens: workers pull fixed-size pieces of the batch
  PIPELINE = 'pipeline'  # stages on device groups, GPipe / 1F1B (`hetjax.pipeline`)
  PLAN = 'plan'          # a Fela plan: a layout and device group per sub-model (`compile_plan`)
  SCHMP = 'schmp'        # scheduled model parallelism: rounds over parameter blocks
  PS = 'ps'              # a parameter server: ``launch --servers K`` (`hetjax.ps`)


#: What None means in the model's fields, said after their names in a message.
_OR_DEFAULT = " (or None: the model's default)"
#: ``model.init``'s prefix for a Hugging Face model directory.
INIT_HF = 'hf:'


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model.

  Attributes:
    name: a shipped model (`hetjax.models.NAMES`), ``'module:function'`` returning a
      `hetjax.train.Task` (called with ``args``): a model of your own; or a SchMP app
      (`hetjax.schmp.APPS`: ``lasso``, ``logreg``, ``mf``, ``lda``), trained in mode ``schmp``.
    args: keyword arguments of that model's ``make_task`` (or of the app's factory).
    dtype: the compute dtype (``'float32'``, ``'bfloat16'``), passed to ``make_task`` as
      ``dtype``; None: the model's default. Parameters and the optimizer's state stay in
      ``param_dtype``: bfloat16 compute with float32 master weights.
    param_dtype: the parameters' dtype (``make_task``'s ``param_dtype``); None: the model's
      default (float32 for the shipped ones).
    remat: rematerialisation of the model's blocks (``make_task``'s ``remat``): ``'none'``,
      ``'full'`` (recompute each block's activations in the backward pass) or ``'save_dots'``
      (keep the matmul outputs, recompute the rest); None: the model's default.
    init: where a fresh run's parameters come from: None, drawn from ``data.seed``; or
      ``'hf:PATH'``, a local Hugging Face model directory (``config.json`` and
      ``*.safetensors``) of the Llama, Qwen 2 or Mistral layout, read into model ``llama``: the
      checkpoint's ``config.json`` gives the architecture (``args`` may add ``seq_len``,
      ``data`` and the precision; an architecture argument that disagrees is refused), and
      each tensor is read onto its sharding in every mode. A resumed run restores its own
      checkpoint instead. Nothing is downloaded.
  """

  NAME = 'model'
  name: str
  args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  dtype: str | None = choice(None, DTYPES, note=_OR_DEFAULT)
  param_dtype: str | None = choice(None, DTYPES, note=_OR_DEFAULT)
  remat: str | None = choice(None, REMATS, note=_OR_DEFAULT)
  init: str | None = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ConfigError(f'model.name must be a model name or module:function, got {self.name!r}')
    if not isinstance(self.args, Mapping):
      raise ConfigError(f'model.args must be a mapping of keyword arguments, got '
                        f'{type(self.args).__name__}')
    check_choices(self)
    if self.init is not None and (not isinstance(self.init, str)
                                  or not self.init.startswith(INIT_HF)
                                  or not self.init[len(INIT_HF):].strip()):
      raise ConfigError(f'model.init must be hf:PATH (a Hugging Face model directory) or None, '
                        f'got {self.init!r}')
    for field in PRECISION_FIELDS:
      if getattr(self, field) is not None and field in self.args:
        raise ConfigError(f'model.{field} and model.args.{field} are both set: keep one')

  def task_args(self) -> dict[str, Any]:
    """``make_task``'s keyword arguments: ``args`` with ``dtype``, ``param_dtype`` and
    ``remat`` where they are set."""
    return {**self.args, **{f: getattr(self, f) for f in PRECISION_FIELDS
                            if getattr(self, f) is not None}}


#: The `ModelConfig` fields a model takes as ``make_task`` arguments.
PRECISION_FIELDS = ('dtype', 'param_dtype', 'remat')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data every step reads.

  Attributes:
    global_batch: examples per step, over all devices and workers.
    seed: parameter initialisation and data order (the batch of step s depends on the seed and
      s only).
  """

  NAME = 'data'
  global_batch: int = 256
  seed: int = 0

  def __post_init__(self):
    at_least(self.global_batch, 1, f'{self.NAME}.global_batch')


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer, its schedule and the run's length.

  Attributes:
    name: a `hetjax.train.Optimizer` name (``sgd``, ``momentum``, ``adam``, ``adamw``).
    learning_rate: the optimizer's peak step size.
    steps: total optimizer steps of the run.
    schedule: the learning rate over the steps: ``'constant'``, ``'cosine'`` or ``'linear'``
      decay from ``learning_rate`` to ``final_fraction`` of it at ``steps``, after ``warmup``
      steps rising linearly from 0 (`hetjax.train.learning_rate_schedule`).
    warmup: linear warm-up steps (any schedule); a run of fewer steps only warms up (e.g.
      ``--steps=1`` of a config with a long warm-up).
    final_fraction: the decay's last learning rate as a fraction of ``learning_rate``.
    decay_steps: the step the decay ends at; 0: ``steps``. A run stopped early and resumed with
      more ``steps`` keeps its schedule only with ``decay_steps`` fixed (else each launch
      decays over its own ``steps``).
    weight_decay: adamw's decoupled weight decay; sgd, momentum and adam add ``weight_decay ·
      params`` to the gradient (L2, as PyTorch's ``weight_decay``); None: the optimizer's
      default (adamw's 1e-4, none for the others).
    clip_norm: clip the gradient to this global norm before the update (0: no clipping).
    accumulate: gradient accumulation: micro-batches per optimizer step. Each step's rows are
      computed in ``accumulate`` passes whose gradients are summed before the one update (the
      same update as one pass, in less memory); ``state.step`` counts optimizer steps. Under
      per-worker shares each worker cuts its share into micro-batches of at most a uniform
      share / ``accumulate`` rows, so a worker with a larger share runs more of them; a
      pipeline runs ``pipeline.micro_batches`` × ``accumulate`` micro-batches a step.
  """

  NAME = 'optimizer'
  name: str = choice('adam', OPTIMIZERS)
  learning_rate: float = 1e-3
  steps: int = 100
  schedule: str = choice('constant', LR_SCHEDULES)
  warmup: int = 0
  final_fraction: float = 0.0
  decay_steps: int = 0
  weight_decay: float | None = None
  clip_norm: float = 0.0
  accumulate: int = 1

  def __post_init__(self):
    check_choices(self)
    at_least(self.steps, 1, f'{self.NAME}.steps')
    if self.learning_rate <= 0:
      raise ConfigError(f'optimizer.learning_rate must be > 0, got {self.learning_rate}')
    at_least(self.warmup, 0, f'{self.NAME}.warmup')
    at_least(self.decay_steps, 0, f'{self.NAME}.decay_steps', note=' (0: optimizer.steps)')
    if not 0 <= self.final_fraction <= 1:
      raise ConfigError(f'optimizer.final_fraction must be in [0, 1], got {self.final_fraction}')
    if self.weight_decay is not None and self.weight_decay < 0:
      raise ConfigError(f'optimizer.weight_decay must be >= 0, got {self.weight_decay}')
    if self.clip_norm < 0:
      raise ConfigError(f'optimizer.clip_norm must be >= 0 (0: no clipping), got '
                        f'{self.clip_norm}')
    at_least(self.accumulate, 1, f'{self.NAME}.accumulate')


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Periodic evaluation on the task's held-out split (`hetjax.train.Task.eval_data`).

  Attributes:
    every: steps between evaluations (also one at the end); 0: only at the end.
    batches: held-out batches each evaluation averages over (the same batches every time).
    batch: rows of each held-out batch; 0: ``data.global_batch``.
    enabled: False: no evaluation (a task without ``eval_data`` has none either).
    sample: a language model's greedy continuation of this many tokens of the start of the
      first held-out example, printed by the chief at each evaluation (every ``every`` steps
      and at the end; `hetjax.run.generate`), in modes that hold the model whole on a process;
      0: none.
  """

  NAME = 'eval'
  every: int = 0
  batches: int = 4
  batch: int = 0
  enabled: bool = True
  sample: int = 0

  def __post_init__(self):
    at_least(self.every, 0, f'{self.NAME}.every', note=' (0: only at the end)')
    at_least(self.batches, 1, f'{self.NAME}.batches')
    at_least(self.batch, 0, f'{self.NAME}.batch', note=' (0: data.global_batch)')
    at_least(self.sample, 0, f'{self.NAME}.sample', note=' (0: no samples)')


@dataclasses.dataclass(frozen=True)
class ParallelismConfig:
  """How a step runs and on which devices.

  Attributes:
    mode: a `Mode` value: how a step runs.
    strategy: a `hetjax.train.Strategy` name (spmd, and inside each worker).
    mesh: mesh shape over ``('data', 'model')``, e.g. ``'4x2'``; per worker in the
      multi-worker modes.
    plan: a plan JSON (``hetjax-plan --json``, `hetjax.configs.PLANS`) replacing strategy and
      mesh (mode plan): a layout and a group of workers per sub-model, compiled and
      memory-checked first; one SPMD step when every sub-model runs on all devices of one
      process, else pipeline stages on the groups (``pipeline.micro_batches``,
      ``pipeline.schedule``).
    overlap: mode shares: the all-reduce scheduler (`hetjax.train.OverlapTrainer`): each step's
      all-reduce runs under the next step's gradient; False: the exact synchronous step.
    bucket_bytes: with ``overlap``, the largest gradient bucket each all-reduce carries (0: one
      fused buffer).
    overlap_scale: with ``overlap``, α in (0, 1]: each worker estimates the next parameters
      from α × its own gradient (`OverlapTrainer`'s ``estimate_scale``; below 1 helps at large
      learning rates).
    overlap_estimate: with ``overlap``, what that estimate starts from: ``own`` (this worker's
      gradient, no message) or ``int8`` (every worker's gradient, all-gathered first in 8 bits:
      a short blocking exchange for an estimate within rounding of the exact parameters).
    compilation_cache: keep compiled programs across runs (~/.cache/hetjax/jax).
    rules: logical-axis rules on top of the strategy's table (MaxText's ``logical_axis_rules``):
      ``{logical name: mesh axis, tuple of mesh axes, or None (replicated)}``, e.g.
      ``{'kv': 'model', 'experts': None}``. A name given here is resolved by this rule first,
      for parameters and for compute; every other name keeps the strategy's rule, and a name
      no rule maps is replicated.
  """

  NAME = 'parallelism'
  mode: str = choice('auto', tuple(m.value for m in Mode))
  strategy: str = choice('hybrid', STRATEGIES)
  mesh: str = '4x2'
  plan: str | None = None
  overlap: bool = False
  bucket_bytes: int = 0
  overlap_scale: float = 1.0
  overlap_estimate: str = choice('own', OVERLAP_ESTIMATES)
  compilation_cache: bool = True
  rules: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    check_choices(self)
    object.__setattr__(self, 'rules', rules_of(self.rules, f'{self.NAME}.rules'))
    at_least(self.bucket_bytes, 0, f'{self.NAME}.bucket_bytes', note=' (0: one fused buffer)')
    fraction(self.overlap_scale, f'{self.NAME}.overlap_scale')


def rules_of(value: Any, what: str) -> dict[str, str | tuple[str, ...] | None]:
  """``{logical name: mesh axis, tuple of mesh axes, or None}`` checked (`ParallelismConfig.rules`):
  a mapping (or a sequence of ``(name, axes)`` pairs, as JSON keeps a tuple) of non-empty names
  onto None, a mesh axis name or a sequence of them; a one-line `ConfigError` otherwise."""
  if isinstance(value, (list, tuple)) and all(
      isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
    value = dict(value)
  if not isinstance(value, Mapping):
    raise ConfigError(f"{what} must map logical names onto mesh axes, e.g. {{'kv': 'model'}}, "
                      f'got {type(value).__name__}')
  out: dict[str, str | tuple[str, ...] | None] = {}
  for name, axes in value.items():
    if not isinstance(name, str) or not name:
      raise ConfigError(f'{what}: a logical name must be a non-empty string, got {name!r}')
    if isinstance(axes, (list, tuple)) and len(axes) == 1:
      axes = axes[0]
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
    ok = axes is None or (isinstance(axes, str) and axes) or (
        isinstance(axes, tuple) and all(isinstance(a, str) and a for a in axes)
        and len(set(axes)) == len(axes))
    if not ok:
      raise ConfigError(f'{what}[{name!r}] must be a mesh axis name, a tuple of distinct mesh '
                        f'axis names, or None (replicated), got {axes!r}')
    out[name] = axes or None
  return out


@dataclasses.dataclass(frozen=True)
class BalanceConfig:
  """Per-worker shares of the batch (modes shares and tokens).

  Attributes:
    policy: the share policy: uniform, proportional, lbbsp[-last|-ewma|-ar|-narx|-regime],
      lbbsp-gpu, oracle.
    shares: fixed per-worker shares instead of a policy, e.g. ``(192, 64)``.
    bucket: shares are multiples of it; 0 picks a divisor of the global batch near 1/16 of a
      uniform share (granularity ``compile``) or near 1/4 of one (``micro`` and ``auto``,
      whose micro-batch it is).
    granularity: how a worker computes a share size it has no program of
      (`hetjax.train.Granularity`): ``compile`` gives each new size its own program (compiled
      in the background while pieces stand in); ``micro`` never compiles one (shares are whole
      micro-batches of ``bucket`` rows, run as gradient accumulation over the first size's
      program and one micro-batch's); ``auto`` is ``micro`` where the first program compiled
      in more than 5 of its calls, else ``compile``.
    memory_caps: most rows each worker can hold per step (bucket multiples), or None.
    token_rows: rows per token (mode tokens); 0 picks X / (4 × workers) rounded to a divisor.
    endgame: mode tokens: a slow worker leaves the last tokens to faster ones.
    prefetch: mode tokens, with the end game: a worker it keeps pulls its next token while the
      current one computes.
  """

  NAME = 'balance'
  policy: str = choice('uniform', POLICIES)
  shares: tuple[int, ...] | None = None
  bucket: int = 0
  granularity: str = choice('auto', GRANULARITIES)
  memory_caps: tuple[int, ...] | None = None
  token_rows: int = 0
  endgame: bool = True
  prefetch: bool = True

  def __post_init__(self):
    check_choices(self)
    at_least(self.bucket, 0, f'{self.NAME}.bucket', note=' (0: automatic)')
    at_least(self.token_rows, 0, f'{self.NAME}.token_rows', note=' (0: automatic)')


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Pipeline stages (mode pipeline, and plans that train as stages) and their replicas.

  Attributes:
    stages: pipeline stages (mode pipeline).
    micro_batches: micro-batches per step.
    schedule: ``'1f1b'`` or ``'gpipe'``.
    sync: mode pipeline under several workers (one replica each): the sync policy that groups
      the replicas, ``'sdpipe'``, ``'all-reduce'``, ``'random-pairs'`` or
      ``'periodic-average'`` (`hetjax.replicas.SyncPolicy`; everyone every 10 steps). Local SGD
      over the replicas (`LocalConfig`) takes ``'periodic-average'``: everyone every
      ``local.inner_steps`` steps, the mean making an outer step.
    sync_overlap: replicas average one step late, overlapped with the next step's compute
      (`hetjax.replicas.ReplicaDriver`'s ``overlap``); False syncs before the next step.
  """

  NAME = 'pipeline'
  stages: int = 2
  micro_batches: int = 2
  schedule: str = choice('1f1b', PIPELINE_SCHEDULES)
  sync: str = choice('sdpipe', SYNC_NAMES, renamed=RENAMED_SYNC_NAMES)
  sync_overlap: bool = False

  def __post_init__(self):
    check_choices(self)
    at_least(self.stages, 1, f'{self.NAME}.stages')
    at_least(self.micro_batches, 1, f'{self.NAME}.micro_batches')


@dataclasses.dataclass(frozen=True)
class LocalConfig:
  """Local SGD (DiLoCo) under mode shares, and over mode pipeline's replicas under several
  workers: workers train alone between outer steps (`hetjax.train.LocalTrainer`; a replica's
  `hetjax.replicas.ReplicaDriver` with ``outer``).

  Attributes:
    inner_steps: inner steps a round (H): each worker takes this many optimizer steps on its
      share of each step's batch, exchanging nothing, then the round's pseudo-gradients are
      averaged (weighted by the rows each worker trained on) and the outer optimizer applies
      them. 0: off (every step synchronous). The run's steps, its checkpoints and a resume fall
      on its multiples. The share policy (``balance.policy``) sizes the rows once a round.
      Pipeline replicas each train their whole batch a step and take it with
      ``pipeline.sync=periodic-average`` (every H steps; no ``sync_overlap``, no ``cutoff``):
      each stage's mean over the replicas makes the outer step from the stage's parameters at
      the round's start, and the outer state goes into each replica's checkpoints.
    outer: the outer optimizer, ``'nesterov'`` (SGD with Nesterov momentum, DiLoCo's) or
      ``'sgd'``.
    outer_lr: the outer learning rate (DiLoCo's 0.7; ``sgd`` at 1.0 takes the average).
    outer_momentum: Nesterov's momentum.
    cutoff: a worker starts no inner step that would end past ``cutoff`` × the round's budget
      (the last clean round's median busy time a step × inner_steps; a round with a compile is
      not clean) and joins the exchange with the rows it has (0: never cut; else >= 1).
    exchange: the outer exchange's precision: ``'float32'`` (an all-reduce) or ``'int8'`` (8
      bits, a scale a block of 256, all-gathered: a quarter of the bytes; data parallel inside
      each worker).
    overlap_steps: streaming: a round's exchange runs on a background thread while the next
      round's first ``overlap_steps`` inner steps run from the workers' own parameters; it
      lands then, each worker keeping the steps it took since (θ_new + θ − θ_sent). 0: the
      exchange blocks. Below inner_steps; data parallel inside each worker.
    fragments: the exchange in about this many pieces of the parameters, synced one after the
      other (each its own collective, paced by the links).
  """

  NAME = 'local'
  inner_steps: int = 0
  outer: str = choice('nesterov', ('nesterov', 'sgd'))
  outer_lr: float = 0.7
  outer_momentum: float = 0.9
  cutoff: float = 0.0
  exchange: str = choice('float32', ('float32', 'int8'))
  overlap_steps: int = 0
  fragments: int = 1

  def __post_init__(self):
    check_choices(self)
    at_least(self.inner_steps, 0, f'{self.NAME}.inner_steps', note=' (0: off)')
    if not self.outer_lr > 0:
      raise ConfigError(f'{self.NAME}.outer_lr must be > 0, got {self.outer_lr}')
    if not 0 <= self.outer_momentum < 1:
      raise ConfigError(f'{self.NAME}.outer_momentum must be in [0, 1), got '
                        f'{self.outer_momentum}')
    if not (self.cutoff == 0 or self.cutoff >= 1):
      raise ConfigError(f'{self.NAME}.cutoff must be 0 (never cut) or >= 1, got {self.cutoff}')
    at_least(self.overlap_steps, 0, f'{self.NAME}.overlap_steps', note=' (0: a blocking exchange)')
    at_least(self.fragments, 1, f'{self.NAME}.fragments')
    if self.inner_steps and self.overlap_steps >= self.inner_steps:
      raise ConfigError(f'{self.NAME}.overlap_steps ({self.overlap_steps}) must be below '
                        f'{self.NAME}.inner_steps ({self.inner_steps}): an exchange lands inside '
                        'the next round')


def check_rounds(config) -> None:
  """Local SGD's rounds hold the run: its steps and checkpoints fall on multiples of
  ``local.inner_steps`` (a resume starts a round), else one line naming the three."""
  h, every = config.local.inner_steps, config.checkpoint.every
  if h and (config.optimizer.steps % h or (every and every % h)):
    raise ConfigError(f'local SGD ends and checkpoints at a round\'s end: optimizer.steps '
                      f'({config.optimizer.steps}) and checkpoint.every ({every}) must be '
                      f'multiples of local.inner_steps ({h})')


@dataclasses.dataclass(frozen=True)
class SchmpConfig:
  """Scheduled model parallelism (mode schmp).

  Attributes:
    scheduler: the app's scheduler, ``'schmp'`` (dynamic for Lasso and logistic regression, a
      static rotation for MF and LDA) or a baseline's name (``'shotgun'``, ``'cyclic'``,
      ``'unscheduled'`` …, as the app lists them).
    schedule_size: parameter blocks a round updates (None: the app's default for the device
      count).
    staleness: rounds old the information each round's schedule comes from (0: exact, no
      overlap of scheduling with the devices' work).
    objective_every: rounds between objective evaluations.
  """

  NAME = 'schmp'
  scheduler: str = 'schmp'
  schedule_size: int | None = None
  staleness: int = 1
  objective_every: int = 1

  def __post_init__(self):
    if self.schedule_size is not None:  # None: the app's default
      at_least(self.schedule_size, 1, f'{self.NAME}.schedule_size',
               note=" (or None: the app's default)")
    at_least(self.staleness, 0, f'{self.NAME}.staleness', note=' (0: exact)')
    at_least(self.objective_every, 1, f'{self.NAME}.objective_every')


@dataclasses.dataclass(frozen=True)
class ParameterServerConfig:
  """Parameter servers (mode ps, ``launch --servers K``).

  Attributes:
    protocol: the servers' protocol (`hetjax.ps.parse_ps`), e.g. ``'bsp'``,
      ``'asp,eager,lr=staleness'`` or ``'ssp:2'``.
  """

  NAME = 'ps'
  protocol: str = choice('asp', PS_CONSISTENCIES, parse=ps_protocol)

  def __post_init__(self):
    check_choices(self)


@dataclasses.dataclass(frozen=True)
class EmulationConfig:
  """Hosts of known speed and emulated links.

  Attributes:
    slowdown: the emulated hosts' slowdown trace (`hetjax.emulation.parse_trace`), e.g.
      ``'static:1,1,1,3'``; None: the launcher's ``--slowdown``, else none.
    network: emulated links (`hetjax.emulation.parse_links`), e.g. ``'link:1:100'``: the
      shares mode's all-reduce and the parameter server's pushes and pulls take that long;
      None: the launcher's ``--network``, else none.
    host_row_s: seconds per row of an undisturbed emulated host; 0 calibrates it at start.
    host_fixed_s: with ``host_row_s``, seconds of an undisturbed host's step whatever its rows
      (modes shares and tokens). A calibrated run's ``run.json`` records both
      (``host_row_s``, ``host_fixed_s``): given again, they emulate the same hosts, so that two
      runs (two policies, say) are compared on one cluster rather than on two calibrations.
    hosts: a run directory whose hosts to emulate again (``--hosts=runs/first``): its
      ``run.json``'s ``host_row_s`` and ``host_fixed_s``, read at start, so that a second run
      (another policy, say) runs on the first one's cluster; None: ``host_row_s`` or a
      calibration.
  """

  NAME = 'emulation'
  slowdown: str | None = None
  network: str | None = None
  host_row_s: float = 0.0
  host_fixed_s: float = 0.0
  hosts: str | None = None

  def __post_init__(self):
    if self.hosts is not None and not (isinstance(self.hosts, str) and self.hosts.strip()):
      raise ConfigError(f'emulation.hosts must be a run directory whose hosts to reuse (or '
                        f'None), got {self.hosts!r}')
    at_least(self.host_row_s, 0, f'{self.NAME}.host_row_s', note=' (0: calibrated)')
    at_least(self.host_fixed_s, 0, f'{self.NAME}.host_fixed_s')
    if self.host_fixed_s and not self.host_row_s:
      raise ConfigError('emulation.host_fixed_s needs emulation.host_row_s (the two pin a host; '
                        'without them both the host is calibrated)')


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Checkpoints.

  Attributes:
    every: steps between checkpoints (a checkpoint is also written at the end).
    asynchronous: write checkpoints in the background (orbax's asynchronous save), overlapped
      with the next step, which then waits for the save to commit; False: a save completes
      before the next step. Either way a failure loses at most ``every`` steps.
  """

  NAME = 'checkpoint'
  every: int = 50
  asynchronous: bool = True

  def __post_init__(self):
    at_least(self.every, 1, f'{self.NAME}.every')


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  """Progress lines, metrics and TensorBoard.

  Attributes:
    every: steps between progress lines (and metric flushes).
    tensorboard: also write TensorBoard event files under ``WORKDIR/tensorboard`` (loss,
      evaluation, learning rate, tokens/s, MFU, per-worker step time and share):
      ``tensorboard --logdir runs``.
    mfu: record MFU (model FLOPs utilisation) beside tokens/s: the step's FLOPs are XLA's
      count of the task's step lowered (not compiled) on one device for a few rows, and the
      peak is measured once by a matmul unless ``peak_flops`` declares it.
    peak_flops: the peak FLOP/s of one device that MFU divides by; 0: measured once at the
      start by a matmul in the compute dtype (`hetjax.runtime.measure_peak_flops`).
  """

  NAME = 'logging'
  every: int = 10
  tensorboard: bool = True
  mfu: bool = True
  peak_flops: float = 0.0

  def __post_init__(self):
    at_least(self.every, 1, f'{self.NAME}.every')
    if self.peak_flops < 0:
      raise ConfigError(f'logging.peak_flops must be >= 0 (0: measured), got {self.peak_flops}')


#: Every section of a `Config`: its attribute name → its class.
SECTIONS = {s.NAME: s for s in (
    ModelConfig, DataConfig, OptimizerConfig, ParallelismConfig, BalanceConfig, PipelineConfig,
    SchmpConfig, ParameterServerConfig, EmulationConfig, CheckpointConfig, LoggingConfig,
    EvalConfig, LocalConfig)}

#: The flat form of the options before they had sections, as older run directories'
#: ``config.json`` holds them (`Config.from_json`): each name → its dotted key. ``schedule`` was
#: the pipeline's then: the optimizer had none.
FLAT_FORM = {
    'model': 'model.name', 'model_args': 'model.args',
    'global_batch': 'data.global_batch', 'seed': 'data.seed',
    'optimizer': 'optimizer.name', 'learning_rate': 'optimizer.learning_rate',
    'steps': 'optimizer.steps',
    **{f: f'parallelism.{f}' for f in ('mode', 'strategy', 'mesh', 'plan', 'overlap',
                                       'bucket_bytes', 'overlap_scale', 'overlap_estimate',
                                       'compilation_cache', 'rules')},
    **{f: f'balance.{f}' for f in ('policy', 'shares', 'bucket', 'granularity', 'memory_caps',
                                   'token_rows', 'endgame', 'prefetch')},
    **{f: f'pipeline.{f}' for f in ('stages', 'micro_batches', 'schedule', 'sync',
                                    'sync_overlap')},
    **{f: f'schmp.{f}' for f in ('scheduler', 'schedule_size', 'staleness',
                                 'objective_every')},
    'ps': 'ps.protocol',
    **{f: f'emulation.{f}' for f in ('slowdown', 'network', 'host_row_s', 'host_fixed_s',
                                     'hosts')},
    'checkpoint_every': 'checkpoint.every', 'checkpoint_async': 'checkpoint.asynchronous',
    'log_every': 'logging.every',
}


def _meanings() -> dict[str, tuple[str, ...]]:
  """Each bare name (a field's, or one of the flat form) → every dotted key it could mean."""
  keys = {name: {key} for name, key in FLAT_FORM.items()}
  for name, section in SECTIONS.items():
    for field in dataclasses.fields(section):
      keys.setdefault(field.name, set()).add(f'{name}.{field.name}')
  return {name: tuple(sorted(k)) for name, k in keys.items()}


#: A bare name that could mean two or more fields → their dotted keys, e.g. ``'schedule'``:
#: ``('optimizer.schedule', 'pipeline.schedule')``. `hetjax.run.override` refuses it. Derived
#: from the sections: a field added later that shares a name is refused too, never silently
#: routed to one of them.
AMBIGUOUS = {name: keys for name, keys in _meanings().items() if len(keys) > 1}

#: The flat names ``--set`` takes (``--set checkpoint_every=5``, ``--set policy=lbbsp``): the flat
#: form less every name that is `AMBIGUOUS` (``schedule``: give ``optimizer.schedule`` or
#: ``pipeline.schedule``).
FLAT_NAMES = {name: key for name, key in FLAT_FORM.items() if name not in AMBIGUOUS}
