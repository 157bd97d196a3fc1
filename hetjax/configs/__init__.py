"""The shipped configs, one module per model (``get_config() -> hetjax.run.Config``), and
hand-written plans in the planner's format (`PLANS`: pure data-parallel, pure model-parallel and
a uniform hybrid, for 8 devices)."""

import pathlib

#: The directory of the shipped plan JSONs (``--plan=hybrid`` names one of them).
PLANS = pathlib.Path(__file__).with_name('plans')

__all__ = ['PLANS']
