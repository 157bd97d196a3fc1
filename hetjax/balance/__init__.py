"""LB-BSP: per-worker batch shares re-sized at iteration boundaries from predicted speed.

Policies and predictors are values in the Optax way: the object holds settings, ``init()``
gives a state and ``update(state, …)`` returns the decision and the next state.
"""

from hetjax.balance._gpu import GpuState as GpuState
from hetjax.balance._gpu import LBBSPGpu as LBBSPGpu
from hetjax.balance._gpu import TimeModel as TimeModel
from hetjax.balance._gpu import finish_time_shares as finish_time_shares
from hetjax.balance._gpu import fit_time_model as fit_time_model
from hetjax.balance._known_costs import KnownCosts as KnownCosts
from hetjax.balance._lbbsp import LBBSP as LBBSP
from hetjax.balance._lbbsp import LBBSPState as LBBSPState
from hetjax.balance._narx import NARX as NARX
from hetjax.balance._narx import NARXState as NARXState
from hetjax.balance._policy import BalancePolicy as BalancePolicy
from hetjax.balance._policy import observed_speeds as observed_speeds
from hetjax.balance._predictors import AR as AR
from hetjax.balance._predictors import EWMA as EWMA
from hetjax.balance._predictors import ARState as ARState
from hetjax.balance._predictors import EWMAState as EWMAState
from hetjax.balance._predictors import LastValue as LastValue
from hetjax.balance._predictors import LastValueState as LastValueState
from hetjax.balance._predictors import ShiftDetector as ShiftDetector
from hetjax.balance._predictors import ShiftState as ShiftState
from hetjax.balance._predictors import SpeedPredictor as SpeedPredictor
from hetjax.balance._regime import Regime as Regime
from hetjax.balance._regime import RegimeState as RegimeState
from hetjax.balance._regime import expected_makespan as expected_makespan
from hetjax.balance._registry import PolicyName as PolicyName
from hetjax.balance._registry import describe_policy as describe_policy
from hetjax.balance._registry import make_policy as make_policy
from hetjax.balance._rounds import RoundPolicy as RoundPolicy
from hetjax.balance._simple import Fixed as Fixed
from hetjax.balance._simple import Oracle as Oracle
from hetjax.balance._simple import Proportional as Proportional
from hetjax.balance._simple import ProportionalState as ProportionalState
from hetjax.balance._simple import SharesState as SharesState
from hetjax.balance._simple import Uniform as Uniform

__all__ = [
    'AR',
    'EWMA',
    'LBBSP',
    'NARX',
    'ARState',
    'BalancePolicy',
    'EWMAState',
    'Fixed',
    'GpuState',
    'KnownCosts',
    'LBBSPGpu',
    'LBBSPState',
    'LastValue',
    'LastValueState',
    'NARXState',
    'Oracle',
    'PolicyName',
    'Proportional',
    'ProportionalState',
    'Regime',
    'RegimeState',
    'RoundPolicy',
    'SharesState',
    'ShiftDetector',
    'ShiftState',
    'SpeedPredictor',
    'TimeModel',
    'Uniform',
    'describe_policy',
    'expected_makespan',
    'finish_time_shares',
    'fit_time_model',
    'make_policy',
    'observed_speeds',
]
