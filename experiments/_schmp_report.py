"""bench_schmp's table and goal lines, from its rows (no flags here: tests import it)."""

from __future__ import annotations

from experiments import _schmp_bench


def _fmt(value, spec='') -> str:
  return '—' if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
  head = (f'{"app":<7}{"design":<15}{"scheduler":<19}{"slots":>5}{"P":>3}  {"shares":<9}'
          f'{"rounds":>7}{"time s":>8}{"final":>13}{"reference":>13}{"div":>5}')
  lines = [head, '-' * len(head)]
  for r in rows:
    lines.append(f'{r["app"]:<7}{r["design"]:<15}{r["scheduler"]:<19}{r["schedule_size"]:>5}'
                 f'{r["workers"]:>3}  {r.get("shares", "—"):<9}'
                 f'{_fmt(r["rounds_to_target"]):>7}{_fmt(r["time_to_target_s"], ".2f"):>8}'
                 f'{_fmt(r["final_objective"], ".6g"):>13}'
                 f'{_fmt(r["reference_objective"], ".6g"):>13}{"yes" if r["diverged"] else "":>5}')
  return '\n'.join(lines)


def goals(rows: list[dict]) -> list[str]:
  """One line per goal and worker count: met or not, with the numbers."""
  lines = []
  virtual = [r for r in rows if r['source'] == _schmp_bench.SOURCE]

  def pick(app, design, scheduler, p, size=None):
    return next((r for r in virtual if (r['app'], r['design'], r['scheduler'], r['workers']) ==
                 (app, design, scheduler, p) and (size is None or r['schedule_size'] == size)),
                None)

  for app, design in sorted({(r['app'], r['design']) for r in virtual
                             if r['app'] in ('lasso', 'logreg', 'svm')}):
    for p in sorted({r['workers'] for r in virtual}):
      s, g = pick(app, design, 'schmp', p), pick(app, design, 'shotgun', p, size=p)
      if not s or not g:
        continue
      if g['diverged']:
        verdict = 'met' if s['rounds_to_target'] else 'NOT met'
        text = f'Shotgun diverged; SchMP converged: {verdict}'
      elif s['rounds_to_target'] is None:
        text = 'SchMP did not reach the target: NOT met'
      elif g['rounds_to_target'] is None:
        bound = g['rounds_run'] / s['rounds_to_target']
        text = f'Shotgun not there after {g["rounds_run"]} rounds: ≥ {bound:.1f}x fewer, met'
      else:
        ratio = g['rounds_to_target'] / s['rounds_to_target']
        text = f'{ratio:.2f}x fewer rounds: {"met" if ratio >= 2 else "NOT met"}'
      gap = (None if s['final_objective'] is None else
             s['final_objective'] / s['reference_objective'] - 1)
      lines.append(f'{app} {design} P={p}: {text}; SchMP vs scikit-learn {_fmt(gap, ".1e")}')
  for design in sorted({r['design'] for r in virtual if r['app'] == 'cdmf'}):
    for p in sorted({r['workers'] for r in virtual if r['app'] == 'cdmf'}):
      c, g = pick('cdmf', design, 'schmp', p), pick('mf', design, 'schmp', p)
      if not c or not g:
        continue
      ct, gt = c['time_to_target_s'], g['time_to_target_s']
      faster = ct is not None and (gt is None or ct <= gt)
      lines.append(f'cdmf {design} P={p}: CD-MF vs SGD-MF to target {_fmt(ct, ".2f")} s vs '
                   f'{_fmt(gt, ".2f")} s ({"CD-MF" if faster else "SGD-MF"} first), ends '
                   f'{_fmt(c["final_objective"], ".5g")} vs {_fmt(g["final_objective"], ".5g")}; '
                   'no goal (the issue asks for CD-MF beside SGD-MF)')
  for app, design in sorted({(r['app'], r['design']) for r in virtual
                             if r['app'] in ('lda', 'mf')}):
    for p in sorted({r['workers'] for r in virtual if r['app'] == app}):
      s, b = pick(app, design, 'schmp', p), pick(app, design, 'unscheduled', p)
      if not s or not b:
        continue
      st, bt = s['time_to_target_s'], b['time_to_target_s']
      if p == 1:  # one block, one device: the rotation and the baseline are one computation
        lines.append(f'{app} {design} P=1: the same computation ({_fmt(st, ".2f")} s vs '
                     f'{_fmt(bt, ".2f")} s): no goal')
        continue
      faster = st is not None and (bt is None or st <= bt)
      no_worse = (s['final_objective'] or float('inf')) <= (b['final_objective'] or float('inf'))
      line = (f'{app} {design} P={p}: to target {_fmt(st, ".2f")} s vs {_fmt(bt, ".2f")} s '
              f'({"met" if faster else "NOT met"}), ends {s["final_objective"]:.5g} vs '
              f'{b["final_objective"]:.5g} ({"no worse" if no_worse else "worse"})')
      for name in _schmp_bench.LDA_ROUNDS if app == 'lda' else ():
        r = pick(app, design, name, p)
        if r:
          rt = r['time_to_target_s']
          ratio = '' if st is None or rt is None else f', {rt / st:.2f}x SchMP\'s'
          line += f'; {name} {_fmt(rt, ".2f")} s{ratio} (ends {r["final_objective"]:.5g})'
      if 'sweeps_to_schmp_final' in s:
        others = [(n, pick(app, design, n, p)) for n in ('unscheduled', *_schmp_bench.LDA_ROUNDS)]
        line += (f'; sweeps to SchMP\'s final {s["final_objective"]:.5g}: SchMP '
                 f'{s["sweeps_to_schmp_final"]}, ' + ', '.join(
                     f'{n} {_fmt(r["sweeps_to_schmp_final"])}' for n, r in others if r))
      lines.append(line)
  return lines
