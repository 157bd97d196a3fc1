"""hetjax: JAX training for clusters that are not uniform."""

from hetjax import balance as balance
from hetjax import data as data
from hetjax import runtime as runtime
from hetjax import sharding as sharding
from hetjax import train as train
from hetjax._errors import ConfigError as ConfigError
from hetjax._errors import ShardingError as ShardingError

__version__ = '0.1.0'

__all__ = ['ConfigError', 'ShardingError', 'balance', 'data', 'runtime', 'sharding', 'train']
