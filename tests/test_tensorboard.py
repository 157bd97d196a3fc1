"""TensorBoardWriter: event files that hold the scalars by tag and step, read back here with
the TFRecord framing and tensorboardX's own Event protobuf (no TensorBoard installed); and the
MetricsLogger sink that feeds it every record."""

import io
import struct
import sys

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax.core import StepStats
from hetjax.report import TensorBoardWriter
from hetjax.train import MetricsLogger, StepInfo


def _masked_crc(data: bytes) -> int:
  from tensorboardX.crc32c import crc32c

  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """``{tag: [(step, value), …]}`` of every event file in ``logdir``: TFRecords of ``uint64
  length, uint32 masked crc32c(length), data, uint32 masked crc32c(data)``, each an Event."""
  from tensorboardX.proto.event_pb2 import Event

  out: dict[str, list[tuple[int, float]]] = {}
  files = sorted(logdir.glob('events.out.tfevents.*'))
  assert files, f'no event file in {logdir}'
  for path in files:
    data, at = path.read_bytes(), 0
    while at < len(data):
      header = data[at:at + 8]
      (length,) = struct.unpack('<Q', header)
      assert struct.unpack('<I', data[at + 8:at + 12])[0] == _masked_crc(header)
      body = data[at + 12:at + 12 + length]
      assert struct.unpack('<I', data[at + 12 + length:at + 16 + length])[0] == _masked_crc(body)
      at += 16 + length
      event = Event.FromString(body)
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


def test_scalars_are_written_by_tag_and_step(tmp_path):
  tb = TensorBoardWriter(tmp_path / 'tb')
  tb.scalars(1, {'loss': 2.5, 'share/worker_0': 96, 'mfu': np.float32(0.25)})
  tb.scalars(2, {'loss': 1.5, 'share/worker_0': 160, 'eval_loss': float('nan')})
  tb.close()
  tb.close()  # a second close does nothing
  assert read_scalars(tmp_path / 'tb') == {'loss': [(1, 2.5), (2, 1.5)],
                                           'share/worker_0': [(1, 96.0), (2, 160.0)],
                                           'mfu': [(1, 0.25)]}  # NaN left out
  with pytest.raises(ValueError, match='is closed'):
    tb.scalars(3, {'loss': 1.0})


def test_the_logger_sends_every_record_to_the_writer(tmp_path):
  """Each step's loss, and per worker its share and busy time; the progress step's rates."""
  tb = TensorBoardWriter(tmp_path / 'tb')
  logger = MetricsLogger(tmp_path / 'metrics.jsonl', 96, total_steps=4, every=2,
                         stream=io.StringIO(), sinks=[tb.scalars], tokens_per_example=10,
                         extra=lambda info: {'lr': 0.1 * info.step})
  hook = logger.hook()
  for step in range(1, 5):
    stats = StepStats(step - 1, (64, 32), (0.5, 0.25 * step), loss=np.float32(1.0 / step))
    hook.fn(StepInfo(step, None, stats, time=float(step)))
  logger.close()
  tb.close()
  scalars = read_scalars(tmp_path / 'tb')
  assert [s for s, _ in scalars['loss']] == [1, 2, 3, 4]
  assert [s for s, _ in scalars['lr']] == [1, 2, 3, 4]
  assert [v for _, v in scalars['lr']] == pytest.approx([0.1, 0.2, 0.3, 0.4])  # float32
  assert scalars['share/worker_1'] == [(s, 32.0) for s in range(1, 5)]
  assert scalars['busy_s/worker_1'] == [(s, 0.25 * s) for s in range(1, 5)]
  assert [s for s, _ in scalars['samples_per_s']] == [2, 4]  # the progress lines' steps
  assert [s for s, _ in scalars['tokens_per_s']] == [2, 4]
  assert 'time_s' not in scalars and 'step' not in scalars


def test_without_tensorboardx_it_is_one_config_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorboardX', None)  # import raises ImportError
  with pytest.raises(ConfigError, match=r'^TensorBoard event files need tensorboardX: pip '
                     r'install tensorboardX$'):
    TensorBoardWriter(tmp_path / 'tb')
