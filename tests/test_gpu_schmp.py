"""gpu_check's SchMP part (`experiments._gpu_schmp`) at its quick size on the CPU: two rows, the
default device's and the CPU's, which here are one device, so the two seeded runs must reach
the same objective exactly."""

import math

import jax

from experiments import _gpu_schmp

KEYS = {'part', 'device', 'platform', 'role', 'features', 'rows', 'schedule_size', 'rounds',
        'rounds_run', 'timed_rounds', 'rounds_per_s', 'objective', 'objective_rel_diff',
        'speedup_vs_cpu', 'same_device', 'wall_s', 'note', 'measured'}


def test_quick_run_on_cpu_times_rounds_and_agrees():
  rows = _gpu_schmp.run(quick=True)
  size = _gpu_schmp.size(quick=True)
  assert [r['role'] for r in rows] == ['device', 'cpu']
  for row in rows:
    assert row.keys() >= KEYS
    assert row['part'] == 'schmp'
    assert (row['features'], row['rows']) == (size.features, size.rows)
    assert row['rounds_per_s'] > 0 and all(m > 0 for m in row['measured'])
    assert row['rounds'] <= row['rounds_run']
    assert math.isfinite(row['objective']) and row['objective'] > 0
  device, cpu = rows
  assert device['rounds'] == cpu['rounds']
  assert cpu['speedup_vs_cpu'] == 1.0
  # jax.devices()[0] is the CPU here (the suite's 8 virtual CPU devices): one device, one
  # seeded schedule, so the same rounds give the same β
  assert jax.devices()[0].platform == 'cpu'
  assert device['same_device'] and cpu['same_device'] and device['device'] == cpu['device']
  assert 'same device' in device['note']
  assert device['objective'] == cpu['objective'] and device['objective_rel_diff'] == 0.0


def test_markdown_has_a_heading_and_a_row_per_device():
  rows = [{'device': 'gpu:0 (NVIDIA H100)', 'features': 100_000, 'rows': 4096,
           'rounds_per_s': 120.0, 'speedup_vs_cpu': 300.0, 'objective': 1234.5, 'rounds': 5,
           'objective_rel_diff': 1e-7, 'note': ''},
          {'device': 'cpu:0 (cpu)', 'features': 100_000, 'rows': 4096, 'rounds_per_s': 0.4,
           'speedup_vs_cpu': 1.0, 'objective': 1234.5, 'rounds': 5, 'objective_rel_diff': 0.0,
           'note': ''}]
  lines = _gpu_schmp.markdown(rows)
  assert lines[0] == '### SchMP Lasso on the device'
  table = [line for line in lines if line.startswith('|')]
  assert len(table) == 2 + len(rows)
  assert '| gpu:0 (NVIDIA H100) | 100,000 | 4,096 | 120 | 300.00× |' in table[2]
