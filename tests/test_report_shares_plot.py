"""shares.png shows every worker, also those whose lines lie on each other (issue 44: the demo's
three fast workers had equal shares, and only the last one drawn could be seen)."""

import json

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

from hetjax.report import load_telemetry, plot_shares
from hetjax.report._plots import shares_figure


def _equal_shares_run(run_dir, steps=80):
  """The demo's case: 4 workers, worker 3 three times slower; workers 0-2 share alike."""
  run_dir.mkdir()
  rows = [{'step': s, 'worker': w, 'share': 256 if w == 3 else 597, 'slowdown': 3.0 if w == 3
           else 1.0, 'data_s': 0.0, 'compute_s': 0.1, 'dilation_s': 0.0, 'comm_s': 0.0,
           'wait_s': 0.0, 'step_s': 0.1} for s in range(1, steps + 1) for w in range(4)]
  (run_dir / 'telemetry.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return load_telemetry(run_dir)


def _pixels(fig, colour) -> int:
  """How many pixels of the rendered figure are ``colour`` (within antialiasing's reach)."""
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  image = np.asarray(canvas.buffer_rgba())[..., :3] / 255.0
  return int((np.abs(image - np.array(to_rgb(colour))).max(axis=-1) < 0.1).sum())


def test_every_worker_of_equal_shares_has_a_line_of_its_own_style(tmp_path):
  t = _equal_shares_run(tmp_path / 'run')
  fig = shares_figure(t)
  lines = fig.axes[0].get_lines()
  assert [line.get_label() for line in lines] == [
      'worker 0 (x1)', 'worker 1 (x1)', 'worker 2 (x1)', 'worker 3 (x3)']
  styles = {(line.get_linestyle(), line.get_marker(), line.get_linewidth()) for line in lines}
  assert len(styles) == 4
  widths = [line.get_linewidth() for line in lines]
  assert widths == sorted(widths, reverse=True)  # the widest first: later lines lie inside
  marked = [set(np.asarray(line.get_xdata())[_marked(line)]) for line in lines[:3]]
  assert marked[0] and not (marked[0] & marked[1] or marked[0] & marked[2] or
                            marked[1] & marked[2])  # each worker's markers on its own steps


def test_every_worker_can_be_seen_in_the_rendered_plot(tmp_path):
  t = _equal_shares_run(tmp_path / 'run')
  fig = shares_figure(t)
  fig.axes[0].get_legend().set_visible(False)  # the legend shows every colour anyway
  seen = {line.get_label(): _pixels(fig, line.get_color()) for line in fig.axes[0].get_lines()}
  assert all(count > 50 for count in seen.values()), seen
  assert plot_shares(t, tmp_path / 'shares.png').stat().st_size > 0


def _marked(line) -> np.ndarray:
  """The indices of ``line``'s points that carry a marker (``markevery=(start, every)``)."""
  start, every = line.get_markevery()
  return np.arange(start, len(line.get_xdata()), every)
