"""Scheduled model parallelism (STRADS / SchMP): rounds that update a scheduled set of
parameter blocks, run as one SPMD program over every device of the job.

`App` is the model (its data, the update of a round, the objective); `SchmpProgram` runs an
app's rounds in the one loop (`hetjax.train.training_steps`) as a `StepProgram`, and a scheduler
— a policy value like every other (`init`, ``update(state, stats) -> (Schedule, state)``) —
decides each round's blocks: `StaticRotation` (SGD and CCD++ matrix factorisation, LDA), or
for the coordinate-descent apps (`CoordinateApp`: Lasso, L1 logistic regression, and the linear
SVM by dual coordinate descent, whose coordinates are examples) `DynamicScheduler` (SchMP's
priorities and dependency check) and the baselines `Shotgun` and `Cyclic`.
"""

from hetjax.schmp._app import App as App
from hetjax.schmp._coordinate_app import CoordinateApp as CoordinateApp
from hetjax.schmp._cyclic import Cyclic as Cyclic
from hetjax.schmp._dynamic import DynamicScheduler as DynamicScheduler
from hetjax.schmp._dynamic import Priority as Priority
from hetjax.schmp._program import AXIS as AXIS
from hetjax.schmp._program import SchmpProgram as SchmpProgram
from hetjax.schmp._program import SchmpState as SchmpState
from hetjax.schmp._registry import APPS as APPS
from hetjax.schmp._registry import make_app as make_app
from hetjax.schmp._schedule import RoundInfo as RoundInfo
from hetjax.schmp._schedule import Schedule as Schedule
from hetjax.schmp._schedule import Scheduler as Scheduler
from hetjax.schmp._shotgun import Shotgun as Shotgun
from hetjax.schmp._static import StaticRotation as StaticRotation

__all__ = [
    'APPS',
    'AXIS',
    'App',
    'CoordinateApp',
    'Cyclic',
    'DynamicScheduler',
    'Priority',
    'RoundInfo',
    'Schedule',
    'Scheduler',
    'SchmpProgram',
    'SchmpState',
    'Shotgun',
    'StaticRotation',
    'make_app',
]
