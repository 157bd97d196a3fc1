"""Pipeline parallelism: a model's chain of sub-models cut into stages that pass micro-batches on.

`split_stages` cuts the chain into contiguous stages of the least bottleneck; `gpipe` and
`one_f_one_b` build the order in which each stage runs its forward and backward passes, as data
(`Schedule` of `Action`s) that `Schedule.validate` checks and `simulate` times. A model that
implements `HasChain` (its `Link`s in forward order and a ``chain_loss``) can be trained by
`PipelineTrainer`, which runs such a schedule in this process, one device group per stage, with
the same gradients as the unpipelined model.
"""

from hetjax.pipeline._chain import HasChain as HasChain
from hetjax.pipeline._chain import Link as Link
from hetjax.pipeline._executor import PipelineState as PipelineState
from hetjax.pipeline._executor import PipelineTrainer as PipelineTrainer
from hetjax.pipeline._executor import StagePrograms as StagePrograms
from hetjax.pipeline._executor import dispatch_order as dispatch_order
from hetjax.pipeline._replicas import GroupAverager as GroupAverager
from hetjax.pipeline._replicas import consensus_distance as consensus_distance
from hetjax.pipeline._schedule import Action as Action
from hetjax.pipeline._schedule import Schedule as Schedule
from hetjax.pipeline._schedule import SimResult as SimResult
from hetjax.pipeline._schedule import gpipe as gpipe
from hetjax.pipeline._schedule import one_f_one_b as one_f_one_b
from hetjax.pipeline._schedule import simulate as simulate
from hetjax.pipeline._split import split_stages as split_stages

__all__ = [
    'Action',
    'GroupAverager',
    'HasChain',
    'Link',
    'PipelineState',
    'PipelineTrainer',
    'Schedule',
    'SimResult',
    'StagePrograms',
    'consensus_distance',
    'dispatch_order',
    'gpipe',
    'one_f_one_b',
    'simulate',
    'split_stages',
]
