"""``hetjax-train`` (``experiments/train.py``): trains a config — shipped, a file of yours, or
``module:function`` — in any mode.

  python experiments/train.py --config=wide_deep --strategy=hybrid --mesh=4x2 \\
      --jax_num_cpu_devices=8 --steps=100 --workdir=runs/wd

Every option of a run is a field of `hetjax.run.Config` (in sections), set with
``--set section.field=value`` or its flat name
(``--set mode=tokens``, ``--set policy=lbbsp``, ``--set slowdown=static:1,1,1,3``; a name two
sections share is refused: ``--set schedule=cosine`` names ``optimizer.schedule`` and
``pipeline.schedule``); the flags below are shorthands for the common ones. ``mode`` picks the step program
(``--mode``'s help lists every mode and ``auto``'s rule, from `hetjax.run.MODES`). All of
them run in one loop with the same checkpoints, metrics and telemetry.

  python -m hetjax.launch --workers 4 --servers 1 --network link:1:10 -- python \\
      experiments/train.py --config=mlp --set ps=asp,eager,lr=staleness --workdir=runs/ps

Under ``python -m hetjax.launch --workers N …`` (or SLURM, Open MPI, Kubernetes, Cloud TPU) it
runs one worker of a multi-worker job (``--mesh`` is each worker's mesh in modes shares and
tokens, the whole job's in mode spmd, which ``auto`` picks for a homogeneous job whose mesh
covers every device) and worker 0 writes
``telemetry.jsonl`` (per-step, per-worker timings) beside the metrics:

  python -m hetjax.launch --workers 4 --slowdown static:1,1,1,3 -- \\
      python experiments/train.py --config=mlp --mesh=1x1 --policy=lbbsp --workdir=runs/bsp

Pipeline replicas (each worker one replica of the whole pipeline, worker 0 also runs the group
scheduler; each replica checkpoints its own parameters under ``checkpoints/replica-W``):

  python -m hetjax.launch --workers 2 --timeout 300 -- python experiments/train.py \\
      --config=mlp --set mode=pipeline --set sync=sdpipe --slowdown persistent:1:3

A slowdown makes every worker a host of known speed: its step padded by sleep to rows × a
calibrated per-row cost × its slowdown. A network (``--network``, or the launcher's) emulates
each worker's link; with ``exchange=server`` each worker pushes and pulls the gradient through
its own link, and LB-BSP and the oracle balance compute plus that transfer, so a worker on a
slow link gets fewer rows (`hetjax.emulation.parse_links`, `hetjax.balance.LBBSP`):

  python -m hetjax.launch --workers 4 -- python experiments/train.py --config=mlp --mesh=1x1 \\
      --policy=lbbsp --network=link:1:1000,1000,1000,20:exchange=server --workdir=runs/links

``--resume`` continues the run in ``--workdir`` from its last checkpoint, the policy's state
(shares, predictor history; a sync policy's windows, epoch and group numbers) included;
replicas resume from the latest step every one of them saved.

Under ``launch --max-restarts N`` a restarted run resumes on its own (no ``--resume`` to add;
``--overwrite`` is ignored after the first launch): the rows of steps lost with the failed
launch leave ``metrics.jsonl`` and ``telemetry.jsonl``, ``restarts.jsonl`` gets one row per
restart (cause, step resumed from, steps lost) and ``summary.json`` counts them. On fewer
workers (``--min-workers``) the parameters and optimizer state restore onto the new layout with
the same global batch, and the shares start over from the survivors' measured speeds. Every
worker reports its progress to a stall watchdog (`hetjax.runtime.ProgressWatchdog`).

Bad input (unknown config, model, strategy or field; a mesh that does not match the devices; a
batch that does not divide; a checkpoint of another model) prints one line and exits with 2.
"""

from __future__ import annotations

import pathlib

from absl import flags

from hetjax import ConfigError, run
from hetjax.cli._main import program_name, run_main

_CONFIG = flags.DEFINE_string(
    'config', None, f'a config name ({", ".join(run.config_names())}), a file.py defining '
    'get_config(), or module:function returning a Config')
_SET = flags.DEFINE_multi_string(
    'set', [], 'override a config field: section.field=value or its flat name, e.g. '
    'optimizer.learning_rate=0.01, model.args.hidden=64, parallelism.rules.kv=model, '
    'checkpoint_every=5 (repeatable; a name two sections share, e.g. schedule, needs its '
    'section)')
_STEPS = flags.DEFINE_integer('steps', None, 'total steps (default: the config\'s)')
_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory (default: runs/CONFIG)')
_RESUME = flags.DEFINE_bool('resume', False, 'continue from the latest checkpoint in --workdir')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'delete an existing run in --workdir first')
# Shorthands for config fields (each is the same as --set FIELD=VALUE).
_SHORTHANDS = {
    'mode': flags.DEFINE_string('mode', None, f'how a step runs: {run.describe_modes()}'),
    'strategy': flags.DEFINE_string('strategy', None, 'parallel strategy (default: the config\'s)'),
    'mesh': flags.DEFINE_string('mesh', None, 'mesh shape data x model, e.g. 4x2'),
    'plan': flags.DEFINE_string('plan', None, 'a plan JSON (experiments/plan.py --json)'),
    'policy': flags.DEFINE_string(
        'policy', None, 'share policy: uniform (BSP), proportional, '
        'lbbsp[-last|-ewma|-ar|-narx|-regime], lbbsp-gpu, oracle'),
    'shares': flags.DEFINE_list('shares', None, 'fixed per-worker batch shares'),
    'bucket': flags.DEFINE_integer('bucket', None, 'shares are multiples of this (0: automatic)'),
    'memory_caps': flags.DEFINE_list('memory_caps', None, 'most rows each worker can hold'),
    'slowdown': flags.DEFINE_string('slowdown', None, 'emulated slowdown trace, e.g. static:1,3'),
    'hosts': flags.DEFINE_string(
        'hosts', None, 'a run directory whose emulated hosts to reuse (its run.json\'s '
        'host_row_s and host_fixed_s): compare two runs on one cluster'),
    'network': flags.DEFINE_string(
        'network', None, 'emulated links (modes shares and ps), e.g. link:1:100, or one per '
        'worker: link:1:1000,1000,1000,50:exchange=server'),
    'token_rows': flags.DEFINE_integer('token_rows', None, 'rows per token (tokens mode)'),
    'sync': flags.DEFINE_string('sync', None, 'pipeline replicas\' sync policy: sdpipe, '
                                'all-reduce, random-pairs or periodic-average'),
    'compilation_cache': flags.DEFINE_bool(
        'compilation_cache', None, 'keep compiled programs across runs (~/.cache/hetjax/jax)'),
}


def _config() -> run.Config:
  if not _CONFIG.value:
    raise ConfigError(f'--config is required: one of {", ".join(run.config_names())}, a file.py, '
                      'or module:function')
  config = run.override(run.load_config(_CONFIG.value), _SET.value)
  cli = {k: f.value for k, f in _SHORTHANDS.items()} | {'steps': _STEPS.value}
  assignments = []
  for key, value in cli.items():
    if value is None:
      continue
    if isinstance(value, list):  # a flag list: a tuple of integers
      value = ','.join(value)
      assignments.append(f'{key}=({value},)')
    else:
      assignments.append(f'{key}={value}')
  return run.override(config, assignments)


def train_from_flags() -> dict | None:
  """Runs the config the flags name (`hetjax.run.train`); worker 0's summary, else None."""
  config = _config()
  workdir = _WORKDIR.value or f'runs/{pathlib.Path(_CONFIG.value).stem}'
  return run.train(config, workdir, resume=_RESUME.value, overwrite=_OVERWRITE.value)


def main() -> None:
  """The ``hetjax-train`` console entry."""
  run_main(program_name('train.py'), train_from_flags)
