"""Checkpoints of every kind of state, one protocol, verified on every restore.

`CheckpointerProtocol` is what a run uses. Every checkpoint is an orbax step directory with
the arrays (``state``) and one JSON record (``meta``: the run's meta, the step, a checksum per
leaf, the policy state); every restore checks the checksums and skips a bad latest checkpoint
where it can, but not one of another model (`_fit`: the record lists other parameters or
shapes, and so do the run's older checkpoints), which is one error naming them.
`Checkpointer` writes an SPMD `TrainState` in orbax's array format; `ArraysCheckpointer`
writes states that live on some processes only (a pipeline replica, a parameter server, a
pipeline's stages) as host arrays. `draining_event_loops` is for a reader
of orbax checkpoints of its own: a read that fails leaves no read running behind it.
"""

from hetjax.checkpoint._arrays import ArraysCheckpointer as ArraysCheckpointer
from hetjax.checkpoint._compat import check_compatible as check_compatible
from hetjax.checkpoint._drain import draining_event_loops as draining_event_loops
from hetjax.checkpoint._manager import Checkpointer as Checkpointer
from hetjax.checkpoint._protocol import CheckpointerProtocol as CheckpointerProtocol
from hetjax.checkpoint._steps import StepCheckpointer as StepCheckpointer

__all__ = ['ArraysCheckpointer', 'Checkpointer', 'CheckpointerProtocol', 'StepCheckpointer',
           'check_compatible', 'draining_event_loops']
