"""hetjax: JAX training for clusters that are not uniform."""

# The errors first: the packages below import them as ``from hetjax import ConfigError``.
from hetjax._errors import ConfigError as ConfigError
from hetjax._errors import ShardingError as ShardingError

# isort: split
from hetjax import balance as balance
from hetjax import checkpoint as checkpoint
from hetjax import core as core
from hetjax import data as data
from hetjax import emulation as emulation
from hetjax import models as models
from hetjax import pipeline as pipeline
from hetjax import planner as planner
from hetjax import ps as ps
from hetjax import report as report
from hetjax import run as run
from hetjax import runtime as runtime
from hetjax import schmp as schmp
from hetjax import sharding as sharding
from hetjax import simulation as simulation
from hetjax import sync as sync
from hetjax import train as train

__version__ = '0.1.0'

__all__ = [
    'ConfigError',
    'ShardingError',
    'balance',
    'checkpoint',
    'core',
    'data',
    'emulation',
    'models',
    'pipeline',
    'planner',
    'ps',
    'report',
    'run',
    'runtime',
    'schmp',
    'sharding',
    'simulation',
    'sync',
    'train',
]
