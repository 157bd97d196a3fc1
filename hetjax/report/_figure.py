"""The one way a report makes a figure: `matplotlib.figure.Figure` directly, not pyplot, so
plotting needs no display and no global state; matplotlib is imported here, when a figure is
made, not with hetjax (a noticeable part of every worker's start-up otherwise)."""

from __future__ import annotations

import logging


def figure(**kwargs):
  """A `matplotlib.figure.Figure` of ``kwargs``. matplotlib's INFO lines (the font cache it
  builds on a fresh machine) stay off the console an absl main logs to."""
  chatter = logging.getLogger('matplotlib')
  chatter.setLevel(max(chatter.level, logging.WARNING))
  from matplotlib.figure import Figure

  return Figure(**kwargs)
