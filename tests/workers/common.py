"""What the multi-worker tests and their single-process reference share."""

import optax

STEPS = 5
OPTIMIZER = optax.sgd(0.05, momentum=0.9)  # why not Adam: see tests/test_strategies.py
MODELS = {
    'mlp': ({'hidden': 64, 'width': 32}, 64),
    'wide_deep': ({'rows': 2048, 'dim': 16, 'hidden': 64, 'hidden2': 32}, 64),
}
