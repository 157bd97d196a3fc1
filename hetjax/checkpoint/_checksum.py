"""A checksum of a pytree of arrays that does not depend on how the arrays are sharded.

Orbax does not verify what it reads: flipped bytes in an uncompressed data chunk restore
without an error and with other values. So a checkpoint's record carries a checksum per leaf,
written at save and compared after restore, and it has to come out the same whichever mesh the
state was saved from or restored onto, and in every process of a multi-process job.

Per leaf, the values are bitcast to unsigned 32-bit words (16- and 8-bit types widened after a
bitcast to their unsigned type, 64-bit types split into two words, bool as 0/1; complex as its
two floats, PRNG keys as their key data, 4-bit types widened exactly first), each word is
multiplied by an odd weight from its flat position, ``(i * 2654435761 + 1) | 1``, and the
products are summed, all modulo 2**32. Wrapping addition is associative and commutative, so
the sum is the same whatever the sharding and the reduction order; because every weight is odd
(invertible modulo 2**32), changing any single word changes the sum. The sum is computed with
`jax.jit` on the arrays where they are, a collective on global arrays, so every process of a
job gets the same replicated value; a leaf this process holds whole on CPU devices (of a 1-,
2- or 4-byte type or bool; a numpy value, once on the default device, is one on a CPU host) is
summed by numpy instead, to the same value: one program over every leaf of a model takes XLA
seconds to compile (a 6-block gpt has 231 leaves), longer than the sums on the host.

Example::

  >>> import jax.numpy as jnp
  >>> checksums({'w': jnp.ones(3, jnp.float32)})
  {'w': {'sum': 880803840, 'shape': [3], 'dtype': 'float32'}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_GOLDEN = 2654435761  # 2**32 / golden ratio: spreads consecutive positions over the words
_MASK = 2**32 - 1


def checksums(tree: Any) -> dict[str, dict[str, Any]]:
  """The checksum, shape and dtype of every leaf of ``tree``, keyed by its path.

  Leaves are jax arrays (any sharding, global ones included), numpy arrays or scalars (taken
  as `jnp.asarray` makes them, so a Python int is int32 unless 64-bit types are on); the
  path is ``jax.tree_util.keystr(path, simple=True, separator='/')``, e.g. ``'params/w'``.
  In a job of several processes every process must call this with the same tree (it runs one
  computation on the global arrays).

  Returns:
    ``{path: {'sum': int, 'shape': [int, ...], 'dtype': str}}``, plain JSON.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  paths = [jax.tree_util.keystr(path, simple=True, separator='/') for path, _ in flat]
  leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for _, x in flat]
  sums: list[Any] = [None] * len(leaves)
  # One computation per set of devices: jit refuses arrays committed to different ones.
  groups: dict[Any, list[int]] = {}
  for i, x in enumerate(leaves):
    if _on_host(x):
      sums[i] = _host_sum(np.asarray(x))
    else:
      groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
  for indices in groups.values():
    for i, s in zip(indices, _sums([leaves[i] for i in indices]), strict=True):
      sums[i] = s
  return {path: {'sum': s if isinstance(s, int) else int(_scalar(s)), 'shape': list(x.shape),
                 'dtype': str(x.dtype)}
          for path, x, s in zip(paths, leaves, sums, strict=True)}


def first_difference(saved: Mapping[str, Any], restored: Mapping[str, Any]) -> str | None:
  """Why two `checksums` records differ, in a few words naming the leaf, or None if equal.

  Example::

    >>> first_difference({'w': {'sum': 1, 'shape': [3], 'dtype': 'float32'}},
    ...                  {'w': {'sum': 2, 'shape': [3], 'dtype': 'float32'}})
    "leaf 'w' checksum differs"
  """
  for path in sorted(set(saved) | set(restored)):
    if path not in restored:
      return f"leaf '{path}' is saved but not in the restored state"
    if path not in saved:
      return f"leaf '{path}' is restored but has no saved checksum"
    for field in ('shape', 'dtype', 'sum'):
      if saved[path].get(field) != restored[path][field]:
        what = 'checksum' if field == 'sum' else \
            f'{field} ({saved[path].get(field)} saved, {restored[path][field]} restored)'
        return f"leaf '{path}' {what} differs"
  return None


def _words(x: jax.Array) -> jax.Array:
  """``x``'s values as uint32 words: the exact bits, one word per element (two for 64 bits)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([x.real, x.imag], axis=-1)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if jax.dtypes.itemsize_bits(x.dtype) < 8:  # int4, float4, …: widened exactly
    x = x.astype(jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int32)
  size = jnp.dtype(x.dtype).itemsize
  if size in (4, 8):  # 8 bytes: a trailing axis of 2 words
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  if size in (1, 2):
    return jax.lax.bitcast_convert_type(x, jnp.uint16 if size == 2 else jnp.uint8).astype(
        jnp.uint32)
  raise TypeError(f'no checksum for arrays of dtype {x.dtype}')


def _flat_index(shape: Sequence[int]) -> jax.Array:
  """Each element's row-major position modulo 2**32, built from per-axis iotas (elementwise
  with whatever sharding the words have, no reshape of a sharded array)."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    index = index + iota * jnp.uint32(stride & _MASK)
    stride *= shape[axis]
  return index


@jax.jit
def _sums(leaves: list[jax.Array]) -> list[jax.Array]:
  out = []
  for x in leaves:
    words = _words(x)
    weight = (_flat_index(words.shape) * jnp.uint32(_GOLDEN) + jnp.uint32(1)) | jnp.uint32(1)
    out.append(jnp.sum(words * weight, dtype=jnp.uint32))
  return out


#: Elements summed at a time on the host (bounds the temporaries: 16 MiB each).
_HOST_CHUNK = 1 << 22


def _on_host(x: jax.Array) -> bool:
  """Whether `_host_sum` takes ``x``: whole in this process, on CPU devices only, of a type
  whose words it forms as `_words` does."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return False
  typed = x.dtype == jnp.bool_ or jax.dtypes.itemsize_bits(x.dtype) in (8, 16, 32)
  return (typed and x.is_fully_addressable and x.size < 2**32
          and all(d.platform == 'cpu' for d in x.sharding.device_set))


def _host_sum(values: np.ndarray) -> int:
  """`_sums` of one leaf held in host memory, by numpy: the same words, weights and wrapping
  sum."""
  if values.dtype == np.bool_:
    words = values.astype(np.uint32).reshape(-1)
  else:
    unsigned = {4: np.uint32, 2: np.uint16, 1: np.uint8}[values.dtype.itemsize]
    words = np.ascontiguousarray(values).view(unsigned).reshape(-1)
  total = np.uint32(0)
  for start in range(0, words.size, _HOST_CHUNK):
    chunk = words[start:start + _HOST_CHUNK].astype(np.uint32)
    weight = (np.arange(start, start + chunk.size, dtype=np.uint32) * np.uint32(_GOLDEN)
              + np.uint32(1)) | np.uint32(1)
    total = np.add(total, np.sum(chunk * weight, dtype=np.uint32), dtype=np.uint32)
  return int(total)


def _scalar(x: jax.Array) -> np.ndarray:
  """The value of a replicated scalar, read from this process's own copy (a global array of a
  multi-process job is not fully addressable, but each process holds the whole scalar)."""
  if not x.is_fully_addressable and not x.is_fully_replicated:
    raise AssertionError('checksum came out sharded, not replicated')
  return np.asarray(x.addressable_data(0))
