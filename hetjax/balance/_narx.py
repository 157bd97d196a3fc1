"""NARX: LB-BSP's recurrent speed predictor, a tiny Elman RNN trained online in JAX.

LB-BSP predicts each worker's next speed from its past speeds plus exogenous inputs (host load)
with a NARX recurrent network. Here the network reads, per worker, the last ``window`` steps of
(log speed − last log speed, log(1 + load)) and predicts the next log-speed change. Predicting
the change relative to the last value, with a zero-initialised head, makes the untrained model
exactly the last-value predictor, and makes one set of parameters fit workers of any base speed,
so the parameters are shared (vmapped) across workers. After every step the model takes a few
Adam steps (Huber loss, nearly L1: see ``huber``) on every complete window in a fixed-size
buffer; shapes never change, so the train and predict functions compile once per worker count.

Example::

  narx = NARX(window=16)
  for stats in history:
    narx.update(speeds_of(stats), load_of(stats))
  next_speeds = narx.predict()  # last value until window + 2 points have been seen
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

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

  name = 'narx'

  def __init__(self, window: int = 16, hidden: int = 8, examples: int = 64, batch: int = 4096,
               train_steps: int = 5, learning_rate: float = 3e-2, huber: float = 0.1,
               seed: int = 0):
    if min(window, hidden, examples, batch, train_steps) < 1 or not min(learning_rate, huber) > 0:
      raise ConfigError(f'NARX needs positive sizes, learning rate and huber; got '
                        f'window={window}, hidden={hidden}, examples={examples}, batch={batch}, '
                        f'train_steps={train_steps}, learning_rate={learning_rate}, huber={huber}')
    self.window, self.examples, self.batch = window, examples, batch
    self._opt, self._train = _trainer(float(learning_rate), int(train_steps), float(huber))
    k_x, k_h = jax.random.split(jax.random.PRNGKey(seed))
    self._params = {
        'w_x': jax.random.normal(k_x, (2, hidden)) / np.sqrt(2.0),
        'w_h': jax.random.normal(k_h, (hidden, hidden)) / np.sqrt(hidden),
        'b': jnp.zeros(hidden), 'w_o': jnp.zeros(hidden), 'b_o': jnp.zeros(()),
    }
    self._opt_state = self._opt.init(self._params)
    self._log_v: np.ndarray | None = None  # float[window + examples, workers], newest last
    self._load: np.ndarray | None = None
    self._seen = 0

  def _windows(self, end: np.ndarray, cols: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Inputs [len(end), workers, window, 2] for the windows ending just before each index."""
    idx = end[:, None] + np.arange(-self.window, 0)[None, :]  # [k, window]
    log_v, load = self._log_v[:, cols], self._load[:, cols]
    rel = log_v[idx] - log_v[end - 1][:, None]  # [k, window, n]
    feats = np.stack([rel, load[idx]], axis=-1)  # [k, window, n, 2]
    return feats.transpose(0, 2, 1, 3).astype(np.float32)

  def update(self, speeds: np.ndarray, load: np.ndarray | None) -> None:
    v = np.asarray(speeds, dtype=np.float64)
    n = v.shape[0]
    if self._log_v is not None and v.shape != self._log_v.shape[1:]:
      raise ConfigError(f'{v.shape[0]} speeds; this NARX predicts {self._log_v.shape[1]} workers')
    lv = np.log(np.maximum(v, 1e-300))
    ld = np.zeros(n) if load is None else np.log1p(np.nan_to_num(
        np.maximum(np.asarray(load, dtype=np.float64), 0.0), nan=0.0, posinf=1e6))
    size = self.window + self.examples
    if self._log_v is None:
      self._log_v, self._load = np.repeat(lv[None], size, 0), np.repeat(ld[None], size, 0)
    self._log_v = np.concatenate([self._log_v[1:], lv[None]])
    self._load = np.concatenate([self._load[1:], ld[None]])
    self._seen += 1
    if self._seen <= self.window:
      return
    targets = np.arange(self.window, size)  # buffer index of each training target
    mask = (targets - self.window >= size - self._seen).astype(np.float32)  # inputs all real
    m = min(n, max(1, self.batch // self.examples))  # workers trained on, rotating
    cols = (self._seen * m + np.arange(m)) % n
    x = self._windows(targets, cols).reshape(-1, self.window, 2)
    log_v = self._log_v[:, cols]
    y = (log_v[targets] - log_v[targets - 1]).astype(np.float32).reshape(-1)
    self._params, self._opt_state = self._train(
        self._params, self._opt_state, x, y, np.repeat(mask, m))

  def predict(self) -> np.ndarray:
    if self._log_v is None:
      raise ConfigError('predict() before any update()')
    last = np.exp(self._log_v[-1])
    if self._seen < self.window + 2:
      return last
    x = self._windows(np.array([self._log_v.shape[0]]))[0]
    change = np.asarray(_predict_all(self._params, x), dtype=np.float64)
    recent = np.exp(self._log_v[-self.window:])
    return clip_to_recent(last * np.exp(change), recent)
