"""gpu_check's SchMP part (`experiments._gpu_schmp`): its table from hand-made rows (its quick
run's rows are checked in ``test_gpu_check.py``)."""

from experiments import _gpu_schmp


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
