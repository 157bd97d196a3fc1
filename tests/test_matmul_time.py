"""A program's matmuls timed alone (`time_matmuls`): each distinct equation once, counted as
often as the program runs it, integer operands refused, a real step's matmuls all timed."""

import jax
import jax.numpy as jnp
import optax

from hetjax import models
from hetjax.bench import matmul_equations, matmul_flops, time_matmuls
from hetjax.sharding import make_mesh
from hetjax.train import Strategy, Trainer


def test_identical_matmuls_are_timed_once_and_counted_each_time():
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))

  def program(a, b):
    scanned, _ = jax.lax.scan(lambda c, _: (c + a @ b, None), a @ b, length=3)
    return scanned, a.T @ a  # a second, distinct matmul

  jaxpr = jax.jit(program).trace(a, b).jaxpr
  timed = time_matmuls(jaxpr, rounds=2, calls=2)
  dot, square = timed.matmuls  # in the order the program first runs them
  assert (dot.count, square.count) == (1 + 3, 1)
  assert dot.shapes == ((64, 32), (32, 16)) and dot.dtypes == ('float32', 'float32')
  assert dot.flops == 2 * 64 * 16 * 32 and dot.seconds > 0 and dot.error is None
  assert timed.flops == matmul_flops(jaxpr)
  assert timed.seconds == sum(m.seconds * m.count for m in timed.matmuls) > 0
  assert timed.untimed == ()


def test_an_integer_operand_is_not_timed():
  i = jnp.ones((8, 8), jnp.int32)
  timed = time_matmuls(jax.jit(lambda i: i @ i).trace(i).jaxpr, rounds=1, calls=1)
  (only,) = timed.matmuls
  assert only.seconds is None and 'integer operand' in only.error
  assert timed.seconds == timed.flops == 0 and timed.untimed == (only,)


def test_a_bfloat16_steps_matmuls_are_all_timed():
  task = models.make_task('gpt', vocab_size=256, d_model=32, heads=2, layers=2, mlp=64,
                          seq_len=32, dtype='bfloat16', param_dtype='float32')
  trainer = Trainer(task, optax.adamw(1e-3), 4, make_mesh((1, 1), devices=jax.devices()[:1]),
                    Strategy.DATA_PARALLEL.rules())
  jaxpr = trainer.trace_step().jaxpr
  timed = time_matmuls(jaxpr, rounds=1, calls=2)
  assert timed.untimed == () and timed.flops == matmul_flops(jaxpr)
  runs = sum(n for _, n in matmul_equations(jaxpr))
  assert sum(m.count for m in timed.matmuls) == runs > len(timed.matmuls)  # duplicates merged
  assert {m.dtypes[1] for m in timed.matmuls} == {'bfloat16'}  # weights cast to the compute dtype
