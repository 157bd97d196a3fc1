"""The communication options of a config: its emulated links and the all-reduce scheduler.

``network`` (or the launcher's ``--network``) emulates each worker's link; it reaches the
shares mode's all-reduce (`hetjax.train.WorkerTrainer`'s ``links``) and the parameter server's
pushes and pulls (mode ps). In mode shares LB-BSP and the oracle then balance each worker's
compute plus its exchange (`hetjax.emulation.Links.exchange_s`): the same for every worker
under a ring all-reduce, its own push and pull under ``exchange=server``. ``overlap`` (with
``bucket_bytes``) runs the shares mode with the all-reduce scheduler
(`hetjax.train.OverlapTrainer`). Any other mode given one of them is
refused with one line (`hetjax.run.MODES`), never silently ignored.
"""

from __future__ import annotations

from hetjax import ConfigError, emulation, runtime
from hetjax.run._config import Config


def links_of(config: Config, ctx: runtime.WorkerContext, workers: int
             ) -> emulation.Links | None:
  """The config's links (else the launcher's) for ``workers`` workers; None without either.
  Links through a server under ``overlap`` are refused here, before anything is built: the
  all-reduce scheduler overlaps ring all-reduces, of which the server exchange has none."""
  spec = config.emulation.network or ctx.network
  if spec is None:
    return None
  links = emulation.parse_links(spec, workers)
  if config.parallelism.overlap and links.exchange is emulation.Exchange.SERVER:
    raise ConfigError(f'the all-reduce scheduler overlaps ring all-reduces; links '
                      f'{links.describe()} exchange through a server: drop exchange= or overlap')
  return links


def check(config: Config) -> None:
  """Refuses ``bucket_bytes`` without ``overlap`` (which modes take them: `hetjax.run.MODES`)."""
  if config.parallelism.bucket_bytes and not config.parallelism.overlap:
    raise ConfigError('bucket_bytes sizes the all-reduce scheduler\'s buckets: set overlap=True '
                      'too (the synchronous step sends one fused buffer)')
