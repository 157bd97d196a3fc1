"""LB-BSP: per-worker batch shares re-sized at iteration boundaries from predicted speed."""

from hetjax.balance._gpu import LBBSPGpu as LBBSPGpu
from hetjax.balance._gpu import TimeModel as TimeModel
from hetjax.balance._gpu import fit_time_model as fit_time_model
from hetjax.balance._lbbsp import LBBSP as LBBSP
from hetjax.balance._narx import NARX as NARX
from hetjax.balance._policy import BalancePolicy as BalancePolicy
from hetjax.balance._policy import observed_speeds as observed_speeds
from hetjax.balance._predictors import AR as AR
from hetjax.balance._predictors import EWMA as EWMA
from hetjax.balance._predictors import LastValue as LastValue
from hetjax.balance._predictors import SpeedPredictor as SpeedPredictor
from hetjax.balance._registry import PolicyName as PolicyName
from hetjax.balance._registry import make_policy as make_policy
from hetjax.balance._shares import ShareRules as ShareRules
from hetjax.balance._shares import Shares as Shares
from hetjax.balance._simple import Oracle as Oracle
from hetjax.balance._simple import Proportional as Proportional
from hetjax.balance._simple import Uniform as Uniform

__all__ = [
    'AR',
    'EWMA',
    'LBBSP',
    'NARX',
    'BalancePolicy',
    'LBBSPGpu',
    'LastValue',
    'Oracle',
    'PolicyName',
    'Proportional',
    'ShareRules',
    'Shares',
    'SpeedPredictor',
    'TimeModel',
    'Uniform',
    'fit_time_model',
    'make_policy',
    'observed_speeds',
]
