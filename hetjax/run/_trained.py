"""Loading a trained model back: a run directory's parameters in the user's own model."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import jax
from flax import nnx

from hetjax import ConfigError, checkpoint, sharding, train
from hetjax.run._config import Config
from hetjax.run._modes import MODES
from hetjax.run._task import make_task, optimizer_of

#: The modes whose checkpoints hold the whole model in one `TrainState` (`hetjax.run.MODES`).
WHOLE_MODEL_MODES = tuple(m.value for m, entry in MODES.items() if entry.whole_model)


def read_run_config(run_dir: str | pathlib.Path) -> Config:
  """The `Config` a run directory's ``config.json`` holds.

  Raises:
    ConfigError: no run there (no ``config.json``), or a config this version does not read.
  """
  config_path = pathlib.Path(run_dir) / 'config.json'
  if not config_path.is_file():
    raise ConfigError(f'{run_dir} holds no run (no config.json)')
  return Config.from_json(json.loads(config_path.read_text()), str(config_path))


def load_model(run_dir: str | pathlib.Path, step: int | None = None,
               devices: Sequence[jax.Device] | None = None) -> nnx.Module:
  """The model a run trained, with its parameters at ``step`` (default: the latest checkpoint),
  ready to call: ``nnx.merge`` of the task's model definition and the restored parameters.

  The run directory's ``config.json`` says which model (a shipped one or ``module:function`` of
  your own, imported from where you call this) and its arguments; the checkpoint is read onto
  ``devices`` (default: this process's devices), whatever device count or mode of the run that
  wrote it: the parameters are replicated on every one of them, so the model runs under
  ``jax.jit`` on a batch placed anywhere. The checkpoint's checksum is verified on the way.

  Example::

    model = hetjax.run.load_model('runs/mlp')
    batch = task.data.global_batch(seed=0, step=0, size=256)
    logits = model(batch['x'])

  Args:
    run_dir: a run directory of `hetjax.run.train` (``hetjax-train --workdir``).
    step: the checkpoint step; None: the latest.
    devices: where to put the parameters (default: ``jax.local_devices()``).

  Raises:
    ConfigError: no run or no checkpoint there, a mode whose checkpoints hold the model in
      pieces (pipeline stages and replicas, parameter servers, SchMP), or a checkpoint of
      another model.
  """
  run_dir = pathlib.Path(run_dir)
  config = read_run_config(run_dir)
  info_path = run_dir / 'run.json'
  mode = json.loads(info_path.read_text()).get('mode') if info_path.is_file() else None
  if mode not in WHOLE_MODEL_MODES:
    raise ConfigError(f'{run_dir} is a run of mode {mode}: load_model reads the checkpoints of '
                      f'modes {", ".join(WHOLE_MODEL_MODES)}, which hold the whole model')
  task = make_task(config, weights=False)
  optimizer = optimizer_of(config)[0]
  local = config.local.inner_steps > 0  # local SGD: the outer state and every worker's inner
  if local:
    optimizer, inner = train.outer_optimizer(config.local.outer, config.local.outer_lr,
                                             config.local.outer_momentum), optimizer
  devices = list(jax.local_devices() if devices is None else devices)
  mesh = sharding.make_mesh((len(devices), 1), devices=devices)
  trainer = train.Trainer(task, optimizer, len(devices), mesh,
                          train.Strategy.DATA_PARALLEL.rules(), config.data.seed)
  target = trainer.abstract_state()
  if local:
    workers = json.loads(info_path.read_text()).get('workers', 1)
    target = train.LocalState.target(target, inner, workers,
                                     jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
                                     overlap=config.local.overlap_steps > 0)
  ckpt = checkpoint.Checkpointer(run_dir / 'checkpoints')
  try:
    if ckpt.latest_step() is None:
      raise ConfigError(f'{run_dir} holds no checkpoint')
    state, _ = ckpt.restore(target, step)
  finally:
    ckpt.close()
  return nnx.merge(trainer.graphdef, state.params)


def checkpoint_step(run_dir: str | pathlib.Path) -> int | None:
  """The latest checkpoint's step of a whole-model run, or None (then `load_model` says why
  there is nothing to load: no checkpoint, or a mode whose checkpoints are in pieces)."""
  directory = pathlib.Path(run_dir) / 'checkpoints'
  if not directory.is_dir():
    return None
  ckpt = checkpoint.Checkpointer(directory)
  try:
    return ckpt.latest_step()
  finally:
    ckpt.close()
