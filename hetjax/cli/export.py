"""``hetjax-export`` (``experiments/export.py``): writes a trained ``llama`` run's parameters as a
Hugging Face model directory that ``transformers`` loads (`hetjax.run.save_hf`).

  hetjax-export --workdir=runs/finetune --out=exports/finetune          # the latest checkpoint
  hetjax-export --workdir=runs/finetune --out=exports/s200 --step=200 --max_shard_mb=2000

Writes ``config.json``, the weights in safetensors shards (``model.safetensors``, or several with
``model.safetensors.index.json``) and the tokenizer's files where the run's ``model.init``
directory or token dataset has them. No run, no checkpoint, a run of another model or a non-empty
``--out`` without ``--overwrite`` prints one line and exits 2.
"""

from __future__ import annotations

import pathlib

from absl import flags

from hetjax import ConfigError, run
from hetjax.cli._main import program_name, run_main

_WORKDIR = flags.DEFINE_string('workdir', None, 'run directory to export (required)')
_OUT = flags.DEFINE_string('out', None, 'the Hugging Face model directory to write (required)')
_STEP = flags.DEFINE_integer('step', None, 'checkpoint step (default: the latest)')
_MAX_SHARD_MB = flags.DEFINE_float('max_shard_mb', 5000, 'largest safetensors shard, in MB '
                                   '(10^6 bytes)')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'replace a non-empty --out')


def export_from_flags() -> pathlib.Path:
  if not _WORKDIR.value:
    raise ConfigError('--workdir is required: the run directory to export')
  if not _OUT.value:
    raise ConfigError('--out is required: the Hugging Face model directory to write')
  if _MAX_SHARD_MB.value <= 0:
    raise ConfigError(f'--max_shard_mb must be positive, got {_MAX_SHARD_MB.value}')
  out = run.save_hf(pathlib.Path(_WORKDIR.value).expanduser(), _OUT.value, step=_STEP.value,
                    max_shard_bytes=max(1, int(_MAX_SHARD_MB.value * 1e6)),
                    overwrite=_OVERWRITE.value)
  files = sorted(p.name for p in out.iterdir())
  print(f'wrote {out}: {", ".join(files)}')
  return out


def main() -> None:
  """The ``hetjax-export`` console entry."""
  run_main(program_name('export.py'), export_from_flags)
