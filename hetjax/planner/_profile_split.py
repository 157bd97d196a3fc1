"""`profile_split`: a pipeline's stages cut on the planner's measured costs.

The pipeline cuts a chain by any costs (`hetjax.pipeline.split_stages`); where those costs come
from the planner's profile, the function lives here, so the arrow points down: the planner uses
the pipeline, the pipeline never imports the planner.
"""

from __future__ import annotations

from flax import nnx

from hetjax._errors import ConfigError
from hetjax.pipeline import check_chain, split_stages
from hetjax.planner._profile import profile_submodels


def profile_split(task, stages: int, batch_size: int = 32, seed: int = 0
                  ) -> tuple[tuple[int, int], ...]:
  """`split_stages` of ``task``'s chain on the planner's measured costs: each link's forward +
  backward FLOPs per example (`hetjax.planner.profile_submodels`), for `PipelineTrainer`'s
  ``stages``.

  Example::

    ranges = planner.profile_split(models.make_task('transformer', layers=4), 2)
    trainer = pipeline.PipelineTrainer(task, optax.sgd(0.1), 64, stages=ranges)

  Raises:
    ConfigError: a model without a chain, or a link the planner's profile does not name (the
      chain's links must be the model's sub-models).
  """
  with nnx.use_eager_sharding(False):
    links, _ = check_chain(nnx.eval_shape(lambda: task.make_model(nnx.Rngs(seed))))
  flops = {p.name: p.flops_per_example for p in profile_submodels(task, batch_size, seed)}
  missing = [link.name for link in links if link.name not in flops]
  if missing:
    raise ConfigError(f'links {missing} are not sub-models the planner profiled '
                      f'({sorted(flops)}); split by hand with split_stages')
  return split_stages([flops[link.name] for link in links], stages)
