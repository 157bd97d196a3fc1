"""Logical-axis rules, meshes, and sharded model creation."""

from hetjax.sharding._batch import batch_sharding as batch_sharding
from hetjax.sharding._batch import process_rows as process_rows
from hetjax.sharding._batch import put_batch as put_batch
from hetjax.sharding._constrain import activation_rules as activation_rules
from hetjax.sharding._constrain import constrain as constrain
from hetjax.sharding._constrain import scope as scope
from hetjax.sharding._initial import Weights as Weights
from hetjax.sharding._initial import init_sharded as init_sharded
from hetjax.sharding._initial import initial_params as initial_params
from hetjax.sharding._initial import read_weights as read_weights
from hetjax.sharding._mesh import DEFAULT_AXES as DEFAULT_AXES
from hetjax.sharding._mesh import make_mesh as make_mesh
from hetjax.sharding._mesh import parse_mesh_shape as parse_mesh_shape
from hetjax.sharding._rules import LogicalRules as LogicalRules
from hetjax.sharding._rules import ShardingRules as ShardingRules
from hetjax.sharding._state import abstract_model as abstract_model
from hetjax.sharding._state import fallen_back as fallen_back
from hetjax.sharding._state import param_shardings as param_shardings
from hetjax.sharding._state import submodel_names as submodel_names
from hetjax.sharding._state import submodel_prefixes as submodel_prefixes
from hetjax.sharding._state import unmapped_names as unmapped_names

__all__ = [
    'DEFAULT_AXES',
    'LogicalRules',
    'ShardingRules',
    'Weights',
    'abstract_model',
    'activation_rules',
    'batch_sharding',
    'constrain',
    'fallen_back',
    'init_sharded',
    'initial_params',
    'make_mesh',
    'param_shardings',
    'parse_mesh_shape',
    'process_rows',
    'put_batch',
    'read_weights',
    'scope',
    'submodel_names',
    'submodel_prefixes',
    'unmapped_names',
]
