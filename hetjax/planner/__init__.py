"""Fela's planner: a layout per sub-model from measured costs, as a `Plan` the trainer runs.

A model without ``submodels()`` is planned whole, as one part named `WHOLE_MODEL`."""

from hetjax.planner._check import CompiledPlan as CompiledPlan
from hetjax.planner._check import compile_plan as compile_plan
from hetjax.planner._cluster import ClusterSpec as ClusterSpec
from hetjax.planner._cluster import WorkerSpec as WorkerSpec
from hetjax.planner._compiled_cost import CompiledCost as CompiledCost
from hetjax.planner._compiled_cost import PricedBy as PricedBy
from hetjax.planner._compiled_cost import Pricing as Pricing
from hetjax.planner._cost import AnalyticCost as AnalyticCost
from hetjax.planner._cost import Cost as Cost
from hetjax.planner._cost import CostModel as CostModel
from hetjax.planner._cost import feasible as feasible
from hetjax.planner._explain import Alternative as Alternative
from hetjax.planner._explain import alternatives as alternatives
from hetjax.planner._explain import explain as explain
from hetjax.planner._hlo import CollectiveBytes as CollectiveBytes
from hetjax.planner._layout import Layout as Layout
from hetjax.planner._local_advice import LocalAdvice as LocalAdvice
from hetjax.planner._local_advice import local_sgd_advice as local_sgd_advice
from hetjax.planner._measure import measure_cluster as measure_cluster
from hetjax.planner._plan import Plan as Plan
from hetjax.planner._plan import SubmodelPlan as SubmodelPlan
from hetjax.planner._profile import profile_submodels as profile_submodels
from hetjax.planner._profile_split import profile_split as profile_split
from hetjax.planner._profile_types import SubmodelProfile as SubmodelProfile
from hetjax.planner._search import TIE_TOLERANCE as TIE_TOLERANCE
from hetjax.planner._search import evaluate as evaluate
from hetjax.planner._search import search as search
from hetjax.planner._stages import plan_stages as plan_stages
from hetjax.planner._stages import worker_devices as worker_devices
from hetjax.planner._whole import WHOLE_MODEL as WHOLE_MODEL

__all__ = [
    'TIE_TOLERANCE',
    'WHOLE_MODEL',
    'Alternative',
    'AnalyticCost',
    'ClusterSpec',
    'CollectiveBytes',
    'CompiledCost',
    'CompiledPlan',
    'Cost',
    'CostModel',
    'Layout',
    'LocalAdvice',
    'Plan',
    'PricedBy',
    'Pricing',
    'SubmodelPlan',
    'SubmodelProfile',
    'WorkerSpec',
    'alternatives',
    'compile_plan',
    'evaluate',
    'explain',
    'feasible',
    'local_sgd_advice',
    'measure_cluster',
    'plan_stages',
    'profile_split',
    'profile_submodels',
    'search',
    'worker_devices',
]
