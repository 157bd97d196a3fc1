"""The persistent compilation cache: a new process reuses programs compiled by earlier ones."""

from __future__ import annotations

import os
import pathlib

import jax

ENV_CACHE_DIR = 'HETJAX_COMPILATION_CACHE'


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> pathlib.Path:
  """Turns on JAX's persistent compilation cache (every program, however quick to compile).

  LB-BSP recompiles a worker's step for each new share size; within a process the executables
  are kept in memory, and this cache lets a restarted or relaunched worker skip the compile
  altogether. The directory defaults to ``$HETJAX_COMPILATION_CACHE`` or
  ``~/.cache/hetjax/jax``.

  Returns:
    the cache directory.
  """
  path = pathlib.Path(directory or os.environ.get(ENV_CACHE_DIR)
                      or pathlib.Path.home() / '.cache' / 'hetjax' / 'jax')
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update('jax_compilation_cache_dir', str(path))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  return path
