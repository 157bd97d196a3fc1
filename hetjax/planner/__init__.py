"""Fela's planner: a layout per sub-model from measured costs, as a `Plan` the trainer runs."""

from hetjax.planner._check import CompiledPlan as CompiledPlan
from hetjax.planner._check import compile_plan as compile_plan
from hetjax.planner._layout import Layout as Layout
from hetjax.planner._layout import mesh_factors as mesh_factors
from hetjax.planner._layout import tensor_degrees as tensor_degrees
from hetjax.planner._plan import Plan as Plan
from hetjax.planner._plan import SubmodelPlan as SubmodelPlan
from hetjax.planner._profile_types import SubmodelProfile as SubmodelProfile

__all__ = [
    'CompiledPlan',
    'Layout',
    'Plan',
    'SubmodelPlan',
    'SubmodelProfile',
    'compile_plan',
    'mesh_factors',
    'tensor_degrees',
]
