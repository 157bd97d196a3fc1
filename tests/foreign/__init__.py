"""Models written the way other projects write them, for tests/test_foreign_models.py.

They stand for users' code and are kept out of `hetjax.models`: each module is one model as
Flax's examples and documentation write it (an NNX transformer on `nnx.MultiHeadAttention`
whose rank-3 kernels carry two logical names, a classifier whose `nnx.Dropout` keeps its own
random stream, a Linen module brought in through `flax.nnx.bridge`, a model with unannotated
and bias-free parameters), with the two functions hetjax takes from a user:
``make_task(**args) -> hetjax.train.Task`` and ``get_config() -> hetjax.run.Config``
(``--config=tests.foreign.NAME:get_config``, ``model.name='tests.foreign.NAME:make_task'``).
``_worker.py`` is the launched workers' program, not a model.
"""

#: The modules of this package, one model each.
NAMES = ('nnx_transformer', 'dropout_mlp', 'linen_bridge', 'plain_params')
