"""Train state, the jitted SPMD step, built-in strategies, and the loop of steps."""

from hetjax.train._loop import Hook as Hook
from hetjax.train._loop import StepInfo as StepInfo
from hetjax.train._loop import training_steps as training_steps
from hetjax.train._metrics import MetricsLogger as MetricsLogger
from hetjax.train._optimizers import Optimizer as Optimizer
from hetjax.train._state import TrainState as TrainState
from hetjax.train._strategies import Strategy as Strategy
from hetjax.train._task import HasSubmodels as HasSubmodels
from hetjax.train._task import Task as Task
from hetjax.train._tokens import TokenRules as TokenRules
from hetjax.train._tokens import token_steps as token_steps
from hetjax.train._trainer import Trainer as Trainer
from hetjax.train._worker_loop import measure_speed as measure_speed
from hetjax.train._worker_loop import worker_steps as worker_steps
from hetjax.train._workers import WorkerTrainer as WorkerTrainer
from hetjax.train._workers import local_batch_degree as local_batch_degree
from hetjax.train._workers import worker_meshes as worker_meshes

__all__ = [
    'HasSubmodels',
    'Hook',
    'MetricsLogger',
    'Optimizer',
    'StepInfo',
    'Strategy',
    'Task',
    'TokenRules',
    'TrainState',
    'Trainer',
    'WorkerTrainer',
    'local_batch_degree',
    'measure_speed',
    'token_steps',
    'training_steps',
    'worker_meshes',
    'worker_steps',
]
