"""Step programs (SPMD, per-worker shares, local SGD, tokens), built-in strategies, and the one loop."""

from hetjax.train._accumulate import micro_rows_of as micro_rows_of
from hetjax.train._accumulate import summed_value_and_grad as summed_value_and_grad
from hetjax.train._endgame import SURE_TAKE as SURE_TAKE
from hetjax.train._endgame import takes_token as takes_token
from hetjax.train._evaluate import Evaluation as Evaluation
from hetjax.train._flops import program_flops as program_flops
from hetjax.train._local import LocalState as LocalState
from hetjax.train._local import LocalTrainer as LocalTrainer
from hetjax.train._local import outer_optimizer as outer_optimizer
from hetjax.train._loop import Hook as Hook
from hetjax.train._loop import StepInfo as StepInfo
from hetjax.train._loop import training_steps as training_steps
from hetjax.train._metrics import MetricsLogger as MetricsLogger
from hetjax.train._optimizers import Optimizer as Optimizer
from hetjax.train._optimizers import learning_rate_schedule as learning_rate_schedule
from hetjax.train._overlap import OverlapEstimate as OverlapEstimate
from hetjax.train._overlap import OverlapState as OverlapState
from hetjax.train._overlap import OverlapTrainer as OverlapTrainer
from hetjax.train._share_programs import Granularity as Granularity
from hetjax.train._state import TrainState as TrainState
from hetjax.train._strategies import Strategy as Strategy
from hetjax.train._task import HasSubmodels as HasSubmodels
from hetjax.train._task import Task as Task
from hetjax.train._tokens import TokenRules as TokenRules
from hetjax.train._tokens import TokenTrainer as TokenTrainer
from hetjax.train._trainable import fixed_state_notice as fixed_state_notice
from hetjax.train._trainable import merge_trainable as merge_trainable
from hetjax.train._trainable import split_trainable as split_trainable
from hetjax.train._trainable import trainable_value_and_grad as trainable_value_and_grad
from hetjax.train._trainer import Trainer as Trainer
from hetjax.train._worker_mesh import local_batch_degree as local_batch_degree
from hetjax.train._worker_mesh import worker_meshes as worker_meshes
from hetjax.train._workers import WorkerTrainer as WorkerTrainer

__all__ = [
    'SURE_TAKE',
    'Evaluation',
    'Granularity',
    'HasSubmodels',
    'Hook',
    'LocalState',
    'LocalTrainer',
    'MetricsLogger',
    'Optimizer',
    'OverlapEstimate',
    'OverlapState',
    'OverlapTrainer',
    'StepInfo',
    'Strategy',
    'Task',
    'TokenRules',
    'TokenTrainer',
    'TrainState',
    'Trainer',
    'WorkerTrainer',
    'fixed_state_notice',
    'learning_rate_schedule',
    'local_batch_degree',
    'merge_trainable',
    'micro_rows_of',
    'outer_optimizer',
    'program_flops',
    'split_trainable',
    'summed_value_and_grad',
    'takes_token',
    'trainable_value_and_grad',
    'training_steps',
    'worker_meshes',
]
