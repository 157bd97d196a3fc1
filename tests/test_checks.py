"""The shared checks of single values (`hetjax._checks`): what passes, what fails, what it says."""

import math

import numpy as np
import pytest

from hetjax import ConfigError
from hetjax._checks import (
  at_least,
  between,
  integer,
  number,
  positive_int,
  positive_number,
  positive_seconds,
)


def test_integers_pass_as_ints_numpy_ones_included():
  assert positive_int(3, 'x') == 3
  assert type(positive_int(np.int64(3), 'x')) is int
  assert integer(0, 'x') == 0
  assert integer(-2, 'x', minimum=-5) == -2
  assert between(1024, 1, 1024, 'workers') == 1024


@pytest.mark.parametrize(('call', 'message'), [
    (lambda: positive_int(True, 'stages'), 'stages must be an integer >= 1, got True'),
    (lambda: positive_int(0, 'stages'), 'stages must be an integer >= 1, got 0'),
    (lambda: positive_int(2.0, 'stages'), 'stages must be an integer >= 1, got 2.0'),
    (lambda: positive_int('2', 'stages'), "stages must be an integer >= 1, got '2'"),
    (lambda: integer(-1, 'step'), 'step must be an integer >= 0, got -1'),
    (lambda: integer(False, 'step'), 'step must be an integer >= 0, got False'),
    (lambda: integer(-1, 'staleness', note=' (0: exact)'),
     r'staleness must be an integer >= 0 \(0: exact\), got -1'),
    (lambda: between(0, 1, 1024, 'workers'), 'workers must be between 1 and 1024, got 0'),
    (lambda: between(True, 0, 3, 'worker'), 'worker must be between 0 and 3, got True'),
    (lambda: between(4, 0, 3, 'worker'), 'worker must be between 0 and 3, got 4'),
])
def test_bad_integers_say_what_and_the_bound(call, message):
  with pytest.raises(ConfigError, match=f'^{message}$'):
    call()


def test_numbers_pass_as_floats():
  assert number(0, 'sync_s') == 0.0 and type(number(0, 'sync_s')) is float
  assert number(np.float32(1.5), 'margin', minimum=1) == 1.5
  assert positive_number(2, 'speed') == 2.0
  assert positive_seconds(0.25, 'timeout') == 0.25


@pytest.mark.parametrize('bad', [0, -1.0, math.nan, math.inf, -math.inf, True, '1', None])
def test_positive_numbers_refuse_zero_negatives_nan_inf_bools_and_strings(bad):
  with pytest.raises(ConfigError, match=f'^speed must be a positive finite number, got {bad!r}$'):
    positive_number(bad, 'speed')
  with pytest.raises(ConfigError, match=f'^timeout must be a positive number of seconds, got '
                                        f'{bad!r}$'):
    positive_seconds(bad, 'timeout')


@pytest.mark.parametrize('bad', [-0.5, math.nan, math.inf, True])
def test_numbers_refuse_values_below_the_minimum_nan_inf_and_bools(bad):
  with pytest.raises(ConfigError, match=f'^sync_s must be a finite number >= 0, got {bad!r}$'):
    number(bad, 'sync_s')
  with pytest.raises(ConfigError, match=r'^margin must be a finite number >= 1\.5, got 1$'):
    number(1, 'margin', minimum=1.5)


def test_at_least_returns_the_value_unchanged_or_names_the_bound_and_note():
  assert at_least(0, 0, 'balance.bucket') == 0
  assert at_least(2.5, 1, 'x') == 2.5
  with pytest.raises(ConfigError, match=r'^balance.bucket must be >= 0 \(0: automatic\), got -1$'):
    at_least(-1, 0, 'balance.bucket', note=' (0: automatic)')
  for bad in (math.nan, True, '3', None):
    with pytest.raises(ConfigError, match=f'^data.global_batch must be >= 1, got {bad!r}$'):
      at_least(bad, 1, 'data.global_batch')


def test_messages_are_one_line():
  with pytest.raises(ConfigError) as info:
    positive_int('a\nb', 'x')
  assert '\n' not in str(info.value)
