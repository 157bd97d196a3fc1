"""XLA's FLOP count of a step: read across JAX's return types, per device on a partitioned
program (so `step_flops` multiplies by the devices), and near the analytic 6·N·tokens."""

import jax
import jax.numpy as jnp
import optax
import pytest

from hetjax import ConfigError, models
from hetjax.bench import compiled_flops, flops_ratio, matmul_flops, step_flops
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer, program_flops
from tests.conftest import require_devices

TINY = {'d_model': 32, 'heads': 4, 'layers': 2, 'mlp': 64, 'seq_len': 16}
BATCH = 16


class _Analysis:
  """A compiled program's stand-in whose ``cost_analysis`` returns ``value`` (or raises it)."""

  def __init__(self, value):
    self.value = value

  def cost_analysis(self):
    if isinstance(self.value, Exception):
      raise self.value
    return self.value


def test_compiled_flops_of_a_matmul_is_2n_cubed():
  compiled = jax.jit(lambda a: a @ a).lower(jnp.ones((64, 64))).compile()
  assert compiled_flops(compiled) == 2 * 64 ** 3


@pytest.mark.parametrize('analysis, flops', [
    ({'flops': 5.0}, 5.0),            # jax >= 0.4.30: a dict
    ([{'flops': 7.0}], 7.0),          # before: a list, one dict per program
    ([], 0.0), (None, 0.0), ({}, 0.0), ({'flops': -1.0}, 0.0),  # no analysis
    (NotImplementedError('no cost analysis on this backend'), 0.0),
])
def test_compiled_flops_reads_every_form(analysis, flops):
  assert compiled_flops(_Analysis(analysis)) == flops


def _trainer(devices):
  task = models.make_task('transformer', **TINY)
  return Trainer(task, optax.sgd(0.1), BATCH, make_mesh((len(devices), 1), devices=devices),
                 Strategy.DATA_PARALLEL.rules())


def test_step_flops_is_the_whole_step_and_near_6n_tokens():
  one = step_flops(_trainer(require_devices(1)))
  four = _trainer(require_devices(4))
  compiled = four.compile_step()
  four.compile_step = lambda: compiled  # compiled once
  per_device = compiled_flops(compiled)
  # XLA counts one device's part of a partitioned program: a quarter of the step on 4 devices
  # (jax 0.10.2, XLA:CPU); step_flops multiplies it back. Each device also runs the update of
  # every replicated parameter (and sums the gradients): measured 1.4 % of this tiny step
  # (1.1079e7 per device vs 1.0927e7), 0.1 % at d_model 64.
  assert 4 * per_device > one
  assert per_device == pytest.approx(one / 4, rel=0.02)
  assert step_flops(four) == 4 * per_device
  # Analytic: N = layers·(4·d² + 2·d·mlp) + d·256 parameters in matmuls (the embedding tables
  # are gathers), over B·(seq_len − 1) tokens; attention adds 12·layers·T²·d per sequence.
  d, layers, mlp, t = TINY['d_model'], TINY['layers'], TINY['mlp'], TINY['seq_len'] - 1
  n = layers * (4 * d * d + 2 * d * mlp) + d * 256
  six_n = 6 * n * BATCH * t
  attention = 12 * layers * t * t * d * BATCH
  # Measured at jax 0.10.2: 4.371e7 FLOPs, 1.235 × 6N·tokens, 1.146 × (6N·tokens + attention);
  # the rest is elementwise work (softmax, norms, GELU, the loss, SGD), which narrows to 1.02 at
  # d_model 256 (hetjax/train/_flops.py). The bounds leave a few per cent for XLA's versions.
  assert 1.15 < flops_ratio(one, six_n) < 1.30
  assert 1.05 < flops_ratio(one, six_n + attention) < 1.20


def test_step_flops_counts_a_trainer_only():
  with pytest.raises(ConfigError, match='step_flops counts the step of a Trainer'):
    step_flops(object())


@pytest.mark.parametrize('xla, analytic', [(0.0, 1.0), (1.0, -1.0), (float('nan'), 1.0)])
def test_flops_ratio_wants_positive_counts(xla, analytic):
  with pytest.raises(ConfigError, match='must be a positive number'):
    flops_ratio(xla, analytic)


def test_matmul_flops_counts_dots_in_nested_jaxprs():
  a, b = jnp.ones((8, 16)), jnp.ones((16, 4))
  assert matmul_flops(jax.jit(lambda a, b: a @ b).trace(a, b).jaxpr) == 2 * 8 * 4 * 16
  # Batched einsum: 2 · (batch 3 · 8 · 4 outputs) · 16.
  x, w = jnp.ones((3, 8, 16)), jnp.ones((3, 16, 4))
  assert matmul_flops(jax.make_jaxpr(lambda x, w: jnp.einsum('bik,bkj->bij', x, w))(x, w)) == (
      2 * 3 * 8 * 4 * 16)

  def nested(a, b):  # a jit inside, a scan of 5 steps, a remat, a cond with a costlier branch
    inner = jax.jit(lambda a, b: a @ b)(a, b)
    scanned, _ = jax.lax.scan(lambda c, _: (c + a @ b, None), inner, length=5)
    kept = jax.checkpoint(lambda a: a @ b)(a)
    chosen = jax.lax.cond(a[0, 0] > 0, lambda: (a @ b) @ b.T @ b, lambda: a @ b)
    return scanned + kept + chosen

  one = 2 * 8 * 4 * 16
  costly = one + 2 * 8 * 16 * 4 + one  # (a·b)·bᵀ·b
  assert matmul_flops(jax.jit(nested).trace(a, b).jaxpr) == one + 5 * one + one + costly
  # Forward and backward of a dense layer: three matmuls.
  grad = jax.jit(jax.grad(lambda a, b: (a @ b).sum(), argnums=(0, 1))).trace(a, b)
  assert matmul_flops(grad.jaxpr) == 3 * one


def test_program_flops_is_xlas_count_where_it_sees_the_matmuls():
  """On a CPU XLA counts the matmuls and the elementwise work: its count is kept. A count
  below the matmuls' (a GPU's) is replaced by theirs."""
  trainer = _trainer(require_devices(1))
  traced = trainer.trace_step()
  assert program_flops(traced) == compiled_flops(trainer.lower_step())
  assert compiled_flops(trainer.lower_step()) > matmul_flops(traced.jaxpr) > 0

  class Blind:  # a traced program whose XLA analysis misses the matmuls, as a GPU's does
    jaxpr = traced.jaxpr

    def lower(self):
      return _Analysis({'flops': 1.0})

  assert program_flops(Blind()) == matmul_flops(traced.jaxpr)


def test_matmul_flops_counts_cudnn_attention_as_its_two_matmuls():
  """cuDNN's attention is one custom primitive (only a GPU can trace it): counted as the score
  and value matmuls of XLA's attention, forward 4·B·N·T·S·H and backward twice that, whichever
  layout. A stand-in jaxpr holds the equations as JAX writes them."""
  from types import SimpleNamespace as NS

  def eqn(name, query, key, layout):
    aval = lambda shape: NS(aval=NS(shape=shape))  # noqa: E731
    return NS(primitive=NS(name=name), invars=[aval(query), aval(key), aval(key)],
              outvars=[aval(query)], params={'layout': layout})

  b, t, s, n, h = 2, 16, 24, 4, 8
  forward = 4 * b * n * t * s * h
  jaxpr = NS(eqns=[eqn('dot_product_attention_fwd_wrapper', (b, t, n, h), (b, s, n, h), 0),
                   eqn('dot_product_attention_bwd_wrapper', (b, n, t, h), (b, n, s, h), 1)])
  assert matmul_flops(jaxpr) == forward + 2 * forward
  # The same as XLA's attention's dot_generals: q·kᵀ and p·v.
  q, k = jnp.ones((b, t, n, h)), jnp.ones((b, s, n, h))
  xla = jax.make_jaxpr(lambda q, k: jnp.einsum('bnts,bsnh->btnh', jnp.einsum(
      'btnh,bsnh->bnts', q, k), k))(q, k)
  assert matmul_flops(xla) == forward
