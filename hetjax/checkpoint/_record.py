"""A checkpoint's record: the run's meta, the step, the checksums and the policy state, as JSON.

Every checkpointer writes the same record beside its arrays, so a resume reads any of them
alike::

  {'task': {...}, 'data': {...}, ...,              # what the run passed as meta
   'step': 12,                                      # the state's step (a server's version)
   'checksums': {'params/w': {'sum': …, 'shape': [8], 'dtype': 'float32'}, ...},
   'policy': {...}}                                 # the policy's state, if one ran
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetjax.checkpoint._checksum import first_difference
from hetjax.core import decode_state, encode_state


def make_record(meta: Mapping[str, Any], step: int, sums: Mapping[str, Any],
                policy_state: Any = None) -> dict[str, Any]:
  """``meta`` with the step, the state's `checksums` and ``policy_state``
  (`hetjax.core.encode_state`) added."""
  record = {**meta, 'step': int(step), 'checksums': dict(sums)}
  if policy_state is not None:
    record['policy'] = encode_state(policy_state)
  return record


def policy_state(meta: Mapping[str, Any], template: Any) -> Any:
  """The policy state saved in ``meta``, in the structure of ``template`` (the policy's
  ``init()``), or None if the checkpoint holds none.

  Raises:
    ConfigError: a saved state that does not fit the template (another policy saved it).
  """
  saved = meta.get('policy')
  return None if saved is None else decode_state(template, saved)


def verify(saved: Mapping[str, Any] | None, restored: Mapping[str, Any]) -> str | None:
  """Why the restored state's `checksums` are not the saved ones (``'failed verification
  (leaf 'params/w' checksum differs)'``), or None if they are. A record without checksums
  (``saved`` None: written before checkpoints had them) is not checked."""
  if saved is None:
    return None
  difference = first_difference(saved, restored)
  return None if difference is None else f'failed verification ({difference})'
