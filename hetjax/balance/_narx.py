"""NARX: LB-BSP's recurrent speed predictor, a tiny Elman RNN trained online in JAX.

LB-BSP predicts each worker's next speed from its past speeds plus exogenous inputs (host load)
with a NARX recurrent network. Here the network reads, per worker, the last ``window`` steps of
(log speed − last log speed, log(1 + load)) and predicts the next log-speed change. Predicting
the change relative to the last value, with a zero-initialised head, makes the untrained model
exactly the last-value predictor, and makes one set of parameters fit workers of any base speed,
so the parameters are shared (vmapped) across workers. After every step the model takes a few
Adam steps (Huber loss, nearly L1: see ``huber``) on every complete window in a fixed-size
buffer; shapes never change, so the train and predict functions compile once per worker count.

The network's parameters, Adam's state and the history buffers are the predictor's state (a
pytree of numpy arrays of fixed shapes, `NARXState`), so a resumed run continues training the
same network on the same history.

Example::

  narx = NARX(window=16)
  state = narx.init(workers)
  for stats in history:
    state = narx.update(state, speeds_of(stats), load_of(stats))
  next_speeds = narx.predict(state)  # last value until window + 2 points have been seen
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hetjax._checks import positive_int
from hetjax._errors import ConfigError
from hetjax.balance._predictors import clip_to_recent


def _rnn(params: dict, seq: jax.Array) -> jax.Array:
  """One worker's window [window, 2] → predicted next log-speed change (a scalar)."""

  def cell(h, x):
    return jnp.tanh(x @ params['w_x'] + h @ params['w_h'] + params['b']), None

  h, _ = jax.lax.scan(cell, jnp.zeros(params['b'].shape, seq.dtype), seq)
  return h @ params['w_o'] + params['b_o']


_predict_all = jax.jit(jax.vmap(_rnn, in_axes=(None, 0)))


@functools.cache
def _trainer(learning_rate: float, train_steps: int, huber: float):
  """(optimizer, jitted train) for one setting; cached so every NARX shares the compilation."""
  opt = optax.adam(learning_rate)

  def loss(params, x, y, mask):
    err = jax.vmap(_rnn, in_axes=(None, 0))(params, x) - y
    return jnp.sum(mask * optax.huber_loss(err, delta=huber)) / jnp.maximum(jnp.sum(mask), 1.0)

  @jax.jit
  def train(params, opt_state, x, y, mask):
    def body(carry, _):
      params, opt_state = carry
      grads = jax.grad(loss)(params, x, y, mask)
      updates, opt_state = opt.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), None

    (params, opt_state), _ = jax.lax.scan(body, (params, opt_state), None, length=train_steps)
    return params, opt_state

  return opt, train


def _host(tree: Any) -> Any:
  """Every leaf of ``tree`` as a numpy array: a state holds host values only."""
  return jax.tree.map(np.asarray, tree)


def _windows(log_v: np.ndarray, load: np.ndarray, end: np.ndarray, window: int) -> np.ndarray:
  """Inputs [len(end), workers, window, 2] for the windows ending just before each index."""
  idx = end[:, None] + np.arange(-window, 0)[None, :]  # [k, window]
  rel = log_v[idx] - log_v[end - 1][:, None]  # [k, window, n]
  feats = np.stack([rel, load[idx]], axis=-1)  # [k, window, n, 2]
  return feats.transpose(0, 2, 1, 3).astype(np.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NARXState:
  """`NARX`'s state: the network, its optimizer and the history it trains on.

  Attributes:
    params: the RNN's weights ('w_x', 'w_h', 'b', 'w_o', 'b_o'), float32 numpy arrays.
    opt_state: Adam's state for ``params`` (numpy leaves).
    log_v: log speeds of the last window + examples steps, float64[window + examples, workers],
      newest last (before that many steps, the first one repeated).
    load: log(1 + load) of the same steps, same shape.
    seen: steps seen.
  """

  params: dict[str, np.ndarray]
  opt_state: Any
  log_v: np.ndarray
  load: np.ndarray
  seen: int


@dataclasses.dataclass(frozen=True)
class NARX:
  """Online NARX predictor (Elman RNN, hidden 8, shared across workers), deterministic.

  Args:
    window: steps of history the RNN reads.
    hidden: RNN width.
    examples: training targets kept (the buffer holds window + examples steps).
    batch: most windows per Adam step; beyond it each step trains on a rotating subset of
      workers (same shapes every step), so training cost does not grow with the cluster.
    train_steps: Adam steps after each update.
    learning_rate: Adam step size.
    huber: Huber loss threshold on the log-speed error. Near-L1 training fits the conditional
      median: a worker that is slow now and stays slow with p = 0.9 is predicted slow, where a
      squared loss would hedge toward the other state and hand it a share it cannot finish (on
      the Markov benchmark a squared loss made steps ~8% slower than last value; Huber 0.1
      matches it, and still learns regular patterns).
    seed: PRNG seed of the initial weights (the head starts at zero either way).
  """

  window: int = 16
  hidden: int = 8
  examples: int = 64
  batch: int = 4096
  train_steps: int = 5
  learning_rate: float = 3e-2
  huber: float = 0.1
  seed: int = 0
  name: str = dataclasses.field(default='narx', init=False)

  def __post_init__(self):
    sizes = (self.window, self.hidden, self.examples, self.batch, self.train_steps)
    if min(sizes) < 1 or not min(self.learning_rate, self.huber) > 0:
      raise ConfigError(f'NARX needs positive sizes, learning rate and huber; got '
                        f'window={self.window}, hidden={self.hidden}, examples={self.examples}, '
                        f'batch={self.batch}, train_steps={self.train_steps}, '
                        f'learning_rate={self.learning_rate}, huber={self.huber}')

  def _trainer(self):
    return _trainer(float(self.learning_rate), int(self.train_steps), float(self.huber))

  def init(self, workers: int) -> NARXState:
    n, hidden = positive_int(workers, 'predictor workers'), self.hidden
    k_x, k_h = jax.random.split(jax.random.PRNGKey(self.seed))
    params = _host({
        'w_x': jax.random.normal(k_x, (2, hidden)) / np.sqrt(2.0),
        'w_h': jax.random.normal(k_h, (hidden, hidden)) / np.sqrt(hidden),
        'b': jnp.zeros(hidden), 'w_o': jnp.zeros(hidden), 'b_o': jnp.zeros(()),
    })
    opt, _ = self._trainer()
    size = self.window + self.examples
    return NARXState(params, _host(opt.init(params)), np.zeros((size, n)), np.zeros((size, n)), 0)

  def update(self, state: NARXState, speeds: np.ndarray, load: np.ndarray | None) -> NARXState:
    v = np.asarray(speeds, dtype=np.float64)
    size, n = state.log_v.shape
    if v.shape != (n,):
      raise ConfigError(f'{v.shape[0] if v.ndim else v.size} speeds; this NARX predicts {n} '
                        f'workers')
    lv = np.log(np.maximum(v, 1e-300))
    ld = np.zeros(n) if load is None else np.log1p(np.nan_to_num(
        np.maximum(np.asarray(load, dtype=np.float64), 0.0), nan=0.0, posinf=1e6))
    log_v, load_buf = state.log_v, state.load
    if not state.seen:
      log_v, load_buf = np.repeat(lv[None], size, 0), np.repeat(ld[None], size, 0)
    log_v = np.concatenate([log_v[1:], lv[None]])
    load_buf = np.concatenate([load_buf[1:], ld[None]])
    seen = state.seen + 1
    params, opt_state = state.params, state.opt_state
    if seen > self.window:
      targets = np.arange(self.window, size)  # buffer index of each training target
      mask = (targets - self.window >= size - seen).astype(np.float32)  # inputs all real
      m = min(n, max(1, self.batch // self.examples))  # workers trained on, rotating
      cols = (seen * m + np.arange(m)) % n
      log_c = log_v[:, cols]
      x = _windows(log_c, load_buf[:, cols], targets, self.window).reshape(-1, self.window, 2)
      y = (log_c[targets] - log_c[targets - 1]).astype(np.float32).reshape(-1)
      _, train = self._trainer()
      params, opt_state = _host(train(params, opt_state, x, y, np.repeat(mask, m)))
    return NARXState(params, opt_state, log_v, load_buf, seen)

  def predict(self, state: NARXState) -> np.ndarray:
    if not state.seen:
      raise ConfigError('predict() before any update()')
    last = np.exp(state.log_v[-1])
    if state.seen < self.window + 2:
      return last
    x = _windows(state.log_v, state.load, np.array([state.log_v.shape[0]]), self.window)[0]
    change = np.asarray(_predict_all(state.params, x), dtype=np.float64)
    recent = np.exp(state.log_v[-self.window:])
    return clip_to_recent(last * np.exp(change), recent)
