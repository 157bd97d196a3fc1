"""`CheckpointerProtocol`: what a run needs from a checkpointer, whatever state it holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from hetjax.train import Hook


@runtime_checkable
class CheckpointerProtocol(Protocol):
  """The checkpointer of a run: saves by a loop hook, restores verified, keeps the policy state.

  Every state a run trains has one (`Checkpointer`: an SPMD `TrainState`;
  `hetjax.pipeline.StageCheckpointer`: a pipeline's stages on their processes;
  `hetjax.replicas.ReplicaCheckpointer`: one pipeline replica on its process;
  `hetjax.ps.ServerCheckpointer`: one parameter server's shard), and the runner uses exactly
  these members, the same way for all of them. A checkpoint is identified by its step (a
  server's: its version); its record (``meta``) is the JSON the run saved with it plus
  ``'step'``, ``'checksums'`` (`hetjax.checkpoint._checksum`, verified on every restore) and,
  if a policy ran, ``'policy'``.

  Example (the runner's resume, for any mode)::

    saved = ckpt.read_meta(step)                 # check_compatible(saved, meta, ckpt.directory)
    state, saved = ckpt.restore(program.abstract_state(), step)
    policy_state = ckpt.policy_state(saved, policy.init())
    for info in training_steps(program, state, steps, [ckpt.hook(meta, every=50)], policy,
                               policy_state):
      ...
    ckpt.close()
  """

  directory: str
  """Where the checkpoints are (the path as given, for messages)."""

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step (not yet verified), or None."""
    ...

  def all_steps(self) -> list[int]:
    """The complete checkpoints' steps, oldest first."""
    ...

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """Checkpoint ``step``'s record (default: the latest complete one), without its arrays.

    Raises:
      ConfigError: no such checkpoint, or its record does not read back (one line).
    """
    ...

  def restore(self, abstract_state: Any, step: int | None = None
              ) -> tuple[Any, dict[str, Any]]:
    """Checkpoint ``step`` (default: the latest good one) on ``abstract_state``'s layout, and
    its record; the state's step is the checkpoint's.

    Every restore verifies the checksums. Asked for by step, a checkpoint that does not read
    back or fails verification is a one-line `ConfigError` naming it; by default, a bad latest
    one is skipped for the one before it with one warning line naming it, where the
    checkpointer can (where its processes must restore the same step, they agree on it; where
    they cannot, it is a `ConfigError` too). A checkpoint whose record lists other leaves or
    shapes than ``abstract_state`` (the model changed since) is a `ConfigError` naming them,
    never skipped: the older ones hold the same.
    """
    ...

  def policy_state(self, meta: Mapping[str, Any], template: Any) -> Any:
    """The policy state in record ``meta``, in the structure of ``template`` (the policy's
    ``init()``), or None if the checkpoint holds none."""
    ...

  def hook(self, meta: Mapping[str, Any], every: int) -> Hook:
    """A loop hook that saves the state, ``meta`` and the policy state every ``every`` steps
    and after the last one."""
    ...

  def close(self) -> None:
    """Waits for the saves under way and releases the checkpointer."""
    ...
