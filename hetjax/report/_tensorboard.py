"""TensorBoard event files from a run's records, written as the run goes.

`TensorBoardWriter.scalars` has the signature of a `hetjax.train.MetricsLogger` sink, so the
logger's records (loss, evaluation, learning rate, tokens/s, MFU, each worker's share and busy
time) reach TensorBoard as they reach ``metrics.jsonl``, from the same fetch, without a sync
of their own::

  tb = TensorBoardWriter('runs/lm/tensorboard')
  logger = MetricsLogger('runs/lm/metrics.jsonl', 256, 1000, sinks=[tb.scalars])
  ...
  logger.close(); tb.close()       # then: tensorboard --logdir runs

``tensorboardX`` writes the files (no TensorFlow, no PyTorch); it is imported when a writer is
made, so a run without TensorBoard never loads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from hetjax._errors import ConfigError


class TensorBoardWriter:
  """Scalars by step into the event files of ``logdir`` (made if missing).

  Example::

    tb = TensorBoardWriter('runs/mlp/tensorboard')
    tb.scalars(10, {'loss': 0.52, 'samples_per_s': 1024.0, 'share/worker_1': 96})
    tb.close()

  Raises:
    ConfigError: ``tensorboardX`` is not installed.
  """

  def __init__(self, logdir: str | os.PathLike, flush_secs: float = 30.0):
    try:
      from tensorboardX import SummaryWriter
    except ImportError:
      raise ConfigError('TensorBoard event files need tensorboardX: pip install tensorboardX'
                        ) from None
    self.logdir = os.fspath(logdir)
    self._writer = SummaryWriter(self.logdir, flush_secs=flush_secs)

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """Adds each ``name: value`` at ``step``; values that are not finite numbers are left out
    (TensorBoard draws them as gaps anyway). Names with ``/`` group in TensorBoard's panels:
    ``share/worker_0`` and ``share/worker_1`` share one."""
    if self._writer is None:
      raise ValueError(f'TensorBoardWriter({self.logdir!r}) is closed')
    for name, value in values.items():
      value = float(value)
      if math.isfinite(value):
        self._writer.add_scalar(name, value, int(step))

  def flush(self) -> None:
    """Writes what is buffered to the event file."""
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the event file; a second call does nothing."""
    if self._writer is not None:
      self._writer.close()
      self._writer = None
