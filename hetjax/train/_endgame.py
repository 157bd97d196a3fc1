"""Fela's end game for tokens: whether a worker takes one of the last tokens or leaves it to
faster ones. The one rule of the real token step (`TokenTrainer`) and of the virtual clock
(`hetjax.simulation.simulate_tokens`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The others, each assumed half-way through a token, cannot finish a remaining token sooner
#: than 1.5 × the fastest one's token time: below that a worker always takes the token.
SURE_TAKE = 1.5


def may_leave(own_s: float, others_s: Sequence[float]) -> bool:
  """Whether a worker with tokens of ``own_s`` seconds could ever leave tokens to the others
  (per-token seconds ``others_s``): only then must it read how many are left."""
  return len(others_s) > 0 and own_s >= SURE_TAKE * min(others_s)


def takes_token(own_s: float, others_s: Sequence[float], remaining: int) -> bool:
  """Whether a worker should take one of ``remaining`` tokens rather than leave them.

  It takes the token iff it would finish it (``own_s`` from now) before the others could
  finish all ``remaining`` ones: each other worker is assumed half-way through a token, so
  worker j completes tokens at 1.5·sⱼ, 2.5·sⱼ, … from now, and the remaining tokens go to
  whoever completes one first. The others are done at the ``remaining``-th smallest of those
  times, so the worker takes the token iff fewer than ``remaining`` of them come before
  ``own_s``: Σⱼ max(0, ⌊own_s / sⱼ − ½⌋) < remaining — O(workers), no schedule to build.

  Example::

    >>> takes_token(3.0, [1.0, 1.0, 1.0], remaining=6)   # the others are done at 2.5
    False
    >>> takes_token(3.0, [1.0, 1.0, 1.0], remaining=9)   # at 3.5
    True
  """
  if remaining <= 0:
    return False
  others = np.asarray(others_s, dtype=np.float64)
  before = np.maximum(np.floor(own_s / others - 0.5), 0.0).sum() if others.size else 0.0
  return bool(before < remaining)
