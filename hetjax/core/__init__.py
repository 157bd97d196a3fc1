"""The types every layer shares: step stats, policies as values, the step-program shape and the
pace of the emulated host and links it runs at, the α–β link model.

Both clocks (real runs and the virtual clock, `hetjax.simulation.simulate_shares`) import these, and
nothing here imports anything else of hetjax but its errors.
"""

from hetjax._links import Collective as Collective
from hetjax._links import LinkCost as LinkCost
from hetjax._links import ring_bytes as ring_bytes
from hetjax._links import ring_fraction as ring_fraction
from hetjax._links import ring_steps as ring_steps
from hetjax.core._pace import Pace as Pace
from hetjax.core._pace import host_load as host_load
from hetjax.core._policy import Policy as Policy
from hetjax.core._program import Batch as Batch
from hetjax.core._program import HasModel as HasModel
from hetjax.core._program import StepProgram as StepProgram
from hetjax.core._program import Work as Work
from hetjax.core._shares import ShareRules as ShareRules
from hetjax.core._shares import Shares as Shares
from hetjax.core._state_codec import decode_state as decode_state
from hetjax.core._state_codec import encode_state as encode_state
from hetjax.core._stats import StepStats as StepStats
from hetjax.core._stats import WorkerTiming as WorkerTiming

__all__ = [
    'Batch',
    'Collective',
    'HasModel',
    'LinkCost',
    'Pace',
    'Policy',
    'ShareRules',
    'Shares',
    'StepProgram',
    'StepStats',
    'Work',
    'WorkerTiming',
    'decode_state',
    'encode_state',
    'host_load',
    'ring_bytes',
    'ring_fraction',
    'ring_steps',
]
