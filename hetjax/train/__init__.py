"""Step programs (SPMD, per-worker shares, tokens), built-in strategies, and the one loop."""

from hetjax.core import EmulatedHost as EmulatedHost
from hetjax.train._accumulate import micro_rows_of as micro_rows_of
from hetjax.train._accumulate import summed_value_and_grad as summed_value_and_grad
from hetjax.train._endgame import SURE_TAKE as SURE_TAKE
from hetjax.train._endgame import may_leave as may_leave
from hetjax.train._endgame import takes_token as takes_token
from hetjax.train._evaluate import Evaluation as Evaluation
from hetjax.train._flops import compiled_flops as compiled_flops
from hetjax.train._flops import flops_ratio as flops_ratio
from hetjax.train._flops import matmul_equations as matmul_equations
from hetjax.train._flops import matmul_flops as matmul_flops
from hetjax.train._flops import program_flops as program_flops
from hetjax.train._flops import step_flops as step_flops
from hetjax.train._loop import Hook as Hook
from hetjax.train._loop import StepInfo as StepInfo
from hetjax.train._loop import training_steps as training_steps
from hetjax.train._matmul_time import MatmulTime as MatmulTime
from hetjax.train._matmul_time import TimedMatmul as TimedMatmul
from hetjax.train._matmul_time import time_matmuls as time_matmuls
from hetjax.train._metrics import MetricsLogger as MetricsLogger
from hetjax.train._optimizers import Optimizer as Optimizer
from hetjax.train._optimizers import learning_rate_schedule as learning_rate_schedule
from hetjax.train._overlap import QUANT_BLOCK as QUANT_BLOCK
from hetjax.train._overlap import OverlapEstimate as OverlapEstimate
from hetjax.train._overlap import OverlapState as OverlapState
from hetjax.train._overlap import OverlapTrainer as OverlapTrainer
from hetjax.train._overlap import quantize_int8 as quantize_int8
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
    'QUANT_BLOCK',
    'SURE_TAKE',
    'EmulatedHost',
    'Evaluation',
    'Granularity',
    'HasSubmodels',
    'Hook',
    'MatmulTime',
    'MetricsLogger',
    'Optimizer',
    'OverlapEstimate',
    'OverlapState',
    'OverlapTrainer',
    'StepInfo',
    'Strategy',
    'Task',
    'TimedMatmul',
    'TokenRules',
    'TokenTrainer',
    'TrainState',
    'Trainer',
    'WorkerTrainer',
    'compiled_flops',
    'fixed_state_notice',
    'flops_ratio',
    'learning_rate_schedule',
    'local_batch_degree',
    'matmul_equations',
    'matmul_flops',
    'may_leave',
    'merge_trainable',
    'micro_rows_of',
    'program_flops',
    'quantize_int8',
    'split_trainable',
    'step_flops',
    'summed_value_and_grad',
    'takes_token',
    'time_matmuls',
    'trainable_value_and_grad',
    'training_steps',
    'worker_meshes',
]
