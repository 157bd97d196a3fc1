"""``hetjax-plan`` (``experiments/plan.py``): plans a config's model on a cluster and prints the
plan as a table, without training.

  hetjax-plan --config=wide_deep                       # this machine, measured
  hetjax-plan --config=transformer --cluster=cluster.json --json=plan.json
  hetjax-plan --config=wide_deep --plan=experiments/plans/hybrid.json  # cost one
  hetjax-plan --config=wide_deep --worker_devices=2,2,2,2 \
      --slowdown=static:1,1,3,3                    # this machine as 4 workers, two 3x slow

The cluster is the devices this process sees, measured (`hetjax.planner.measure_cluster`; on
a CPU-only machine one, unless ``--jax_num_cpu_devices=N`` gives N or ``--worker_devices`` adds
up to N), or a JSON file of workers with their device count, per-device speed (FLOP/s) and
memory (bytes) plus α and β::

  {"workers": [{"devices": 4, "speed": 2e12, "memory": 16e9},
               {"devices": 4, "speed": 1e12, "memory": 16e9}],
   "alpha_s": 2e-5, "beta_gbit_s": 10}

``--worker_devices`` splits the measured devices into workers (a one-process measurement
standing for a job of several), ``--slowdown`` (a static trace, one factor per worker, as
`python -m hetjax.launch --slowdown` emulates) divides each worker's speed by its factor: the
cluster the planner sees is then the emulated one. Each sub-model may run on all workers or on
the k fastest (k dividing the worker count), and the plan printed says, per sub-model, what
every other group would have cost (`hetjax.planner.explain`). A model that lists no
``submodels()`` is planned whole, as one part named ``model`` (`hetjax.planner.WHOLE_MODEL`):
its best layout and group, which the output says in one line.

Sub-model costs come from XLA's analyses of each sub-model compiled alone (``--profile=timed``,
the default on a GPU or TPU: their compute from each one's forward + backward timed on this
job's first device, scaled to each worker's speed; FLOP and byte counts miss a GPU's kernel
launches and memory traffic that does not overlap compute: a GPU step priced from them can be
several times off, where timed it is close); with
``--cost=compiled`` (the default) FSDP options are priced from each sub-model's FSDP step
compiled on this job's devices and its optimizer update timed there
(`hetjax.planner.CompiledCost`: its measurements describe this machine, not a ``--cluster``
file's). Bad input (unknown config, malformed cluster file, a plan naming a missing sub-model
or whose degrees do not multiply to the device count) prints one line and exits with 2; a
device count that does not match names the flag that sets it.
"""

from __future__ import annotations

import jax
from absl import flags

from hetjax import ConfigError, configs, planner, run
from hetjax.cli._main import program_name, run_main
from hetjax.emulation import StaticTrace, parse_trace
from hetjax.sharding import submodel_names

_CONFIG = flags.DEFINE_string('config', None, f'config name: one of {run.config_names()}')
_SET = flags.DEFINE_multi_string('set', [], 'override a config field: key=value (repeatable)')
_CLUSTER = flags.DEFINE_string('cluster', None, 'cluster JSON file (default: measure this job)')
_PLAN = flags.DEFINE_string('plan', None, 'cost this hand-written plan instead of searching')
_BATCH = flags.DEFINE_integer('batch', None, 'global batch (default: the config\'s)')
_MEMORY_CAP = flags.DEFINE_float('memory_cap', None, 'bytes per device (default: the cluster\'s)')
_TIE = flags.DEFINE_float('tie_tolerance', planner.TIE_TOLERANCE,
                          'plans predicted within this fraction of the fastest are ties: the one '
                          'moving the fewest bytes wins (0: the fastest plan)')
_JSON = flags.DEFINE_string('json', None, 'write the plan here')
_WORKER_DEVICES = flags.DEFINE_list('worker_devices', None,
                                    'split the measured devices into workers of these counts')
_SLOWDOWN = flags.DEFINE_string('slowdown', None,
                                'static:F0,F1,…: worker i\'s devices are Fi times slower')
_MICRO = flags.DEFINE_integer('micro_batches', 1, 'micro-batches per step when the plan trains '
                              'as stages (a group must split their rows evenly)')
_PROFILE = flags.DEFINE_enum('profile', 'auto', ['auto', 'analysed', 'timed'],
                             'analysed: each sub-model\'s compute priced from XLA\'s FLOP and '
                             'byte counts (a roofline); timed: its forward + backward timed on '
                             'this job\'s first device (hetjax.planner.profile_submodels); '
                             'auto: timed on a GPU or TPU, analysed on a CPU')
_COST = flags.DEFINE_enum('cost', 'compiled', ['compiled', 'analytic'],
                          'compiled: FSDP options priced from each sub-model\'s compiled step and '
                          'its update timed on this job\'s devices (hetjax.planner.CompiledCost); '
                          'analytic: every option from the formulas (AnalyticCost)')


def _table(plan: planner.Plan, profiles, batch: int) -> str:
  by_name = {p.name: p for p in profiles}
  head = (f'{"sub-model":<12}{"params":>11}{"GFLOP/step":>11}  {"layout":<14}{"dp×tp":>7}'
          f'  {"group":<9}{"pred ms":>9}{"comm MB":>9}{"mem MB":>9}')
  lines = [head, '-' * len(head)]
  for s in plan.submodels:
    p = by_name[s.name]
    group = 'all' if not s.group or len(s.group) == plan.workers else ','.join(map(str, s.group))
    devices = plan.group_devices(s)
    lines.append(
        f'{s.name:<12}{p.params:>11,}{p.flops_per_example * batch / 1e9:>11.3f}  '
        f'{s.layout.name(devices):<14}{f"{devices // s.layout.tensor}×{s.layout.tensor}":>7}'
        f'  {group:<9}{1e3 * s.predicted_s:>9.3f}{s.comm_bytes / 1e6:>9.2f}'
        f'{s.memory_bytes / 1e6:>9.1f}')
  lines.append(f'predicted step: {1e3 * plan.predicted_step_s:.3f} ms ({plan.name})')
  return '\n'.join(lines)


def _worker_counts() -> list[int] | None:
  """``--worker_devices`` as positive integers (None when not given)."""
  if not _WORKER_DEVICES.value:
    return None
  text = ','.join(_WORKER_DEVICES.value)
  try:
    counts = [int(c) for c in _WORKER_DEVICES.value]
  except ValueError:
    raise ConfigError(f'--worker_devices {text} is not integers, e.g. 2,2,2,2') from None
  if any(c < 1 for c in counts):
    raise ConfigError(f'--worker_devices {text}: every worker needs at least one device')
  return counts


def _cpu_count_given() -> bool:
  """Whether the user set the CPU device count (``--jax_num_cpu_devices`` or the environment's
  ``JAX_NUM_CPU_DEVICES``); JAX's default is -1, one device."""
  return jax.config.jax_num_cpu_devices > 0


def _see_devices(counts: list[int] | None) -> None:
  """Before JAX starts: as many CPU devices as ``--worker_devices`` adds up to, unless the user
  set the count or gave a cluster file. The planner plans the devices this process sees (one
  CPU device by default), never a count it assumed."""
  if counts and not _cpu_count_given() and not _CLUSTER.value:
    jax.config.update('jax_num_cpu_devices', sum(counts))


def _how_many(devices: int) -> str:
  """The flags that make this planner see ``devices`` devices (for an error or a notice)."""
  if _CLUSTER.value:
    return f'a --cluster file of {devices} devices'
  if jax.default_backend() != 'cpu':
    return (f'a machine of {devices} devices, or a --cluster file of {devices} '
            '(--worker_devices only splits the devices this process sees)')
  if _WORKER_DEVICES.value and not _cpu_count_given():
    return f'--worker_devices counts adding up to {devices}'
  return f'--jax_num_cpu_devices={devices}' + (
      f' with --worker_devices counts adding up to {devices}' if _WORKER_DEVICES.value else '')


def _seen(cluster: planner.ClusterSpec) -> str:
  """What the planner's devices are: ``the cluster file c.json's 8 devices``, ``the 1 cpu
  device(s) this process sees``."""
  if _CLUSTER.value:
    return f'the cluster file {_CLUSTER.value}\'s {cluster.devices} devices'
  return f'the {cluster.devices} {jax.default_backend()} device(s) this process sees'


def _emulated(cluster: planner.ClusterSpec, counts: list[int] | None) -> planner.ClusterSpec:
  """``cluster`` split into ``--worker_devices`` workers and slowed by ``--slowdown``.

  Raises:
    ConfigError: counts that do not add up to the cluster's devices, naming the flag that
      makes them agree.
  """
  if counts:
    if sum(counts) != cluster.devices:
      fix = (f'--jax_num_cpu_devices={sum(counts)}, or ' if not _CLUSTER.value
             and jax.default_backend() == 'cpu' else '')
      raise ConfigError(f'--worker_devices {",".join(map(str, counts))} adds up to {sum(counts)} '
                        f'devices, not {_seen(cluster)}: give {fix}counts adding up to '
                        f'{cluster.devices}')
    cluster = cluster.regroup(counts)
  if _SLOWDOWN.value:
    trace = parse_trace(_SLOWDOWN.value, len(cluster.workers))
    if not isinstance(trace, StaticTrace):
      raise ConfigError(f'--slowdown {_SLOWDOWN.value!r}: the planner takes a static trace '
                        '(static:F0,F1,…), one factor per worker')
    cluster = cluster.with_slowdowns([trace.factor(w, 0) for w in range(len(cluster.workers))])
  return cluster


def plan_from_flags() -> planner.Plan:
  """Plans (or costs) the model the flags name and prints the table; the plan."""
  counts = _worker_counts()
  _see_devices(counts)  # before anything starts JAX
  if not _CONFIG.value:
    raise ConfigError(f'--config is required: one of {", ".join(run.config_names())}')
  config = run.override(run.load_config(_CONFIG.value), _SET.value)
  task = run.make_task(config, weights=False)  # the architecture only
  batch = _BATCH.value or config.data.global_batch
  if batch < 1:
    raise ConfigError(f'--batch {batch} must be positive')
  cluster = (planner.ClusterSpec.load(_CLUSTER.value) if _CLUSTER.value
             else planner.measure_cluster())
  cluster = _emulated(cluster, counts)
  names = submodel_names(task.make_model)  # none: the whole model is one part
  timed = _PROFILE.value == 'timed' or (_PROFILE.value == 'auto'
                                         and jax.default_backend() != 'cpu')
  profiles = planner.profile_submodels(task, timed=timed)
  cap = _MEMORY_CAP.value
  cost = planner.CompiledCost(task) if _COST.value == 'compiled' else planner.AnalyticCost()
  if _PLAN.value:
    plan = planner.Plan.load(_PLAN.value, names)
    if plan.devices != cluster.devices:
      raise ConfigError(f'--plan {_PLAN.value} is for {plan.devices} devices, not '
                        f'{_seen(cluster)}: use {_how_many(plan.devices)}')
    plan = planner.evaluate(plan, profiles, cluster, batch, cost)
  else:
    plan = planner.search(profiles, cluster, batch, cost, memory_cap=cap,
                          tie_tolerance=_TIE.value, micro_batches=_MICRO.value)
  print(f'{config.model.name} on {cluster.devices} devices over {len(cluster.workers)} worker(s), '
        f'global batch {batch}, α {cluster.alpha_s * 1e6:.1f} µs, '
        f'β {cluster.beta_bytes_per_s * 8 / 1e9:.2f} Gbit/s')
  defaulted = not (_CLUSTER.value or _WORKER_DEVICES.value or _cpu_count_given())
  if defaulted and jax.default_backend() == 'cpu':  # JAX's one CPU device: say how to get more
    print(f'planned on {_seen(cluster)}: --jax_num_cpu_devices=8 (or '
          '--worker_devices=2,2,2,2) plans on 8 virtual CPU devices')
  if not names:
    print(f'model {config.model.name!r} lists no submodels(), so it is planned whole, as one part '
          f'{planner.WHOLE_MODEL!r} (a submodels() method returning {{name: nnx.Module}} in '
          'forward order lets the planner place each part)')
  print(_table(plan, profiles, batch))
  if timed:
    print(f'sub-models timed on {jax.devices()[0].device_kind}: a program call costs '
          f'{1e6 * profiles[0].call_seconds:.0f} µs, paid once a step (taken off every '
          'sub-model\'s time but the first\'s)')
  if isinstance(cost, planner.CompiledCost):
    print('FSDP options priced (compiled: from the sub-model\'s compiled step and timed update; '
          'fallback: the formulas):')
    for pricing in cost.pricings:
      if pricing.source is not planner.PricedBy.ANALYTIC:
        print(f'  {pricing.describe()}')
  if len(cluster.workers) > 1:
    print(planner.local_sgd_advice(cluster, sum(p.param_bytes for p in profiles),
                                   batch * sum(p.flops_per_example for p in profiles)).describe())
    print('why each sub-model went where it did (the rest of the plan as it is):')
    for line in planner.explain(plan, profiles, cluster, batch, cost, memory_cap=cap):
      print(f'  {line}')
  if not _PLAN.value:
    for path in sorted(configs.PLANS.glob('*.json')):
      try:
        baseline = planner.evaluate(planner.Plan.load(path, names), profiles, cluster, batch,
                                    cost)
      except ConfigError as e:  # e.g. a baseline for another device count
        print(f'  baseline {path.stem}: not applicable ({e})')
        continue
      print(f'  baseline {baseline.name}: predicted {1e3 * baseline.predicted_step_s:.3f} ms')
  if _JSON.value:
    plan.save(_JSON.value)
  return plan


def main() -> None:
  """The ``hetjax-plan`` console entry."""
  run_main(program_name('plan.py'), plan_from_flags)
