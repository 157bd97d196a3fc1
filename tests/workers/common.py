"""What the multi-worker tests and their single-process reference share."""

import optax

STEPS = 5
#: Steps of the LB-BSP runs: its first move waits for three clean steps, a confirming decision
#: and every worker's program for its new share (compiled in the background).
LBBSP_STEPS = 12
OPTIMIZER = optax.sgd(0.05, momentum=0.9)  # why not Adam: see tests/test_strategies.py
MODELS = {
    'mlp': ({'hidden': 64, 'width': 32}, 64),
    'wide_deep': ({'rows': 2048, 'dim': 16, 'hidden': 64, 'hidden2': 32}, 64),
}

# tests/workers/train_overlap.py: steps and shares of its runs, the fusion threshold of its
# bucketed run, and its timed runs (steps, compute a step on the known-speed hosts, links).
OVERLAP_STEPS, OVERLAP_SHARES, OVERLAP_BUCKET_BYTES = 30, (40, 24), 4096
OVERLAP_TIMED, OVERLAP_HOST_S, OVERLAP_LINKS = 8, 0.04, 'link:20:inf'
