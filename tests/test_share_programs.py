"""Share-size programs: pieces stand in for a size still compiling, and change nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hetjax.train._share_programs import SharePrograms, decompose

X = 64  # the "global batch" every partial sum is divided by


def _partial(params, batch):
  """(Σ loss / X, Σ ∇ / X) over the rows: what a worker's gradient program returns."""
  def loss(w):
    return jnp.sum((batch['x'] @ w - batch['y']) ** 2) / X
  return jax.value_and_grad(loss)(params)


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


def _batch(rows, seed=0):
  rng = np.random.default_rng(seed)
  return {'x': jnp.asarray(rng.normal(size=(rows, 8)), jnp.float32),
          'y': jnp.asarray(rng.normal(size=(rows,)), jnp.float32)}


PARAMS = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)


@pytest.mark.parametrize('rows, sizes, expected', [
    (40, [8, 16, 32], [32, 8]),
    (56, [8, 16, 32], [32, 16, 8]),
    (24, [16], None),
    (0, [8], []),
    (48, [24, 8], [24, 24]),
])
def test_decompose(rows, sizes, expected):
  assert decompose(rows, sizes) == expected


def test_without_bucket_each_new_size_is_compiled_when_needed():
  programs = SharePrograms(jax.jit(_partial).lower)
  for rows in (16, 24, 16):
    programs(_add, PARAMS, _batch(rows))
  assert (programs.compiles, programs.background_compiles, programs.piece_steps) == (2, 0, 0)
  assert programs.compile_s > 0 and programs.last_compile_s == 0.0
  assert programs.sizes == (16, 24)


def test_a_new_size_runs_as_pieces_equal_to_the_whole_while_it_compiles():
  programs = SharePrograms(jax.jit(_partial).lower, bucket=8, max_rows=40)
  try:
    first = programs(_add, PARAMS, _batch(16))
    assert programs.compiles == 1 and programs.sizes == (16,)  # shares that never move: one
    first_s = programs.compile_s
    again = programs(_add, PARAMS, _batch(16))
    assert programs.compiles == 1 and programs.last_compile_s == 0
    np.testing.assert_allclose(again[0], first[0], rtol=1e-6)

    batch = _batch(40, seed=1)
    pieces = programs(_add, PARAMS, batch)  # the ladder, then 32 + 8 while 40 compiles
    assert programs.piece_steps == 1 and programs.compiles == 3  # 8 and 32 added to 16
    assert programs.last_compile_s > 0 and programs.last_compile_s == pytest.approx(
        programs.compile_s - first_s, abs=1e-9)
    programs.wait()
    assert programs.sizes == (8, 16, 32, 40)
    assert programs.background_compiles == 1 and programs.background_compile_s > 0
    whole = programs(_add, PARAMS, batch)
    assert programs.piece_steps == 1 and programs.last_compile_s == 0  # its own program now
    reference = _partial(PARAMS, batch)
    for got in (pieces, whole):
      np.testing.assert_allclose(got[0], reference[0], rtol=1e-6)
      np.testing.assert_allclose(got[1], reference[1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(first[0], _partial(PARAMS, _batch(16))[0], rtol=1e-6)
  finally:
    programs.close()


def test_after_close_new_sizes_compile_when_needed_and_wait_returns():
  programs = SharePrograms(jax.jit(_partial).lower, bucket=8, max_rows=64)
  programs(_add, PARAMS, _batch(16))
  programs(_add, PARAMS, _batch(24))  # queued in the background
  programs.close()
  programs.wait()  # must not hang on a cancelled compile
  compiles = programs.compiles
  out = programs(_add, PARAMS, _batch(40))
  assert programs.compiles == compiles + 1 and 40 in programs.sizes
  np.testing.assert_allclose(out[0], _partial(PARAMS, _batch(40))[0], rtol=1e-6)
