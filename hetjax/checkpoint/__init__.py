"""Orbax checkpoints of the train state, restorable onto another mesh."""

from hetjax.checkpoint._compat import check_compatible as check_compatible
from hetjax.checkpoint._manager import Checkpointer as Checkpointer

__all__ = ['Checkpointer', 'check_compatible']
