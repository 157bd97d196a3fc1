"""`StepDirectories`: what the pipeline's own checkpointers share — a directory per complete
step (``DIRECTORY/STEP``, renamed into place when complete) and `hetjax.checkpoint.Checkpointer`'s
interface around it: the steps, the policy state from a step's record, the loop hook. The
subclasses write and read the arrays (`ReplicaCheckpointer`: one replica's state on this process;
`StageCheckpointer`: a pipeline's stages across processes); saves are synchronous.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hetjax._errors import ConfigError
from hetjax.core import decode_state
from hetjax.train import Hook, StepInfo


class StepDirectories:
  """Steps as directories under ``directory``, each with its ``meta.json``; subclasses add
  ``save`` and ``restore``."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int):
    self.directory = os.fspath(directory)
    self.max_to_keep = max_to_keep
    os.makedirs(self.directory, exist_ok=True)

  def all_steps(self) -> list[int]:
    return sorted(int(d) for d in os.listdir(self.directory) if d.isdecimal())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, state: Any, meta: Mapping[str, Any], policy_state: Any = None) -> None:
    raise NotImplementedError

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """Step ``step``'s record (default: the latest complete one)."""
    with open(os.path.join(self.directory, str(self._require(step)), 'meta.json')) as f:
      return json.load(f)

  @staticmethod
  def policy_state(meta: Mapping[str, Any], template: Any) -> Any:
    """The policy state saved with a checkpoint, in ``template``'s structure, or None (as
    `hetjax.checkpoint.Checkpointer.policy_state`; orbax is not imported here)."""
    saved = meta.get('policy')
    return None if saved is None else decode_state(template, saved)

  def hook(self, meta: Mapping[str, Any], every: int) -> Hook:
    """Saves every ``every`` steps and after the last one, the policy's state included."""
    def save(info: StepInfo) -> None:
      if info.step not in self.all_steps():
        self.save(info.state, meta, info.policy_state)

    return Hook(save, every=every, at_end=True)

  def wait(self) -> None:
    pass  # saves are synchronous

  def close(self) -> None:
    pass

  def _require(self, step: int | None) -> int:
    step = self.latest_step() if step is None else step
    if step is None or step not in self.all_steps():
      raise ConfigError(f'no complete checkpoint{"" if step is None else f" at step {step}"} '
                        f'in {self.directory}')
    return step
