r"""The GPU check: one command that measures what only an accelerator shows, writing one JSON and
one markdown table (issue 27).

Made for the project's lent GPU machines (one H100 or H200, 16 cores, no network, 15 minutes in
all): it downloads nothing (``make gpu-check`` installs hetjax itself offline, ``--no-deps -e .``),
finishes in under 8 minutes on one H100 with compiles, and keeps every part's result if a later
part fails. It starts no new part, and stops a part that yields rows between two, once
``--budget_s`` (420 s) have passed; what did not run is listed as such. Parts (``--parts``,
all by default, in this order), each timed, each row written as soon as it is measured:

* ``device``: the device, JAX's version, bfloat16 and float32 matmul FLOP/s measured
  (`hetjax.runtime.measure_peak_flops`, 8192², 16 products in one program on an accelerator),
  float32 both at JAX's default precision (TF32 on an NVIDIA GPU) and at ``'highest'``.
* ``tests``: the exactness tests that fit one device (``pytest -m gpu``), on the device, with
  float32 matmuls pinned to full precision (``JAX_DEFAULT_MATMUL_PRECISION=highest``: a GPU
  computes float32 matmuls in TF32 by default, 10 mantissa bits, and the tests' float32
  tolerances assume 23), in 4 processes where pytest-xdist is installed; ``--quick`` only
  collects them.
* ``planner``: `experiments/_gpu_planner.py`: the planner's profile of the gpt and wide & deep
  sub-models on the device, its plan for one device, predicted against measured step time.
* ``schmp``: `experiments/_gpu_schmp.py`: SchMP Lasso at 10⁵ features, rounds per second on the
  device against the CPU.
* ``curve``: `experiments/_gpu_curve.py`: LB-BSP's GPU curve, step time against batch for two
  models, the fitted ``max(c, a + b·x)`` and its error, the shares beside a half-speed GPU.
* ``lm``: `experiments/_gpu_lm.py`: GPT-2 small (124M, sequence 1024, bfloat16 over float32)
  in hetjax's Trainer and a plain JAX + optax loop, interleaved, with and without remat, with
  cuDNN's and XLA's attention;
  tokens/s and MFU; where the step's time goes (its matmuls timed alone at their shapes, and
  the rest); the largest batch that fits against the planner's memory estimate. Last:
  its GPT-2 small compiles make it the longest part, and it yields its rows as it measures
  them, so the budget can stop it between two.

Goals on an H100 or H200 (each part prints its verdicts): hetjax's step ≤ 1.03× the plain
loop's; MFU of the 124M model in bfloat16 ≥ 40%; the fitted curve within 10% of the measured
times; the planner's prediction within 25% of the measured step; every exactness test green.

``--platform=cpu --quick`` runs the same code on tiny sizes on a CPU (the test suite does, so the
check cannot rot before a GPU is lent). What needs several GPUs (multi-device strategies,
launched workers, pipelines) is not in it: one lent GPU cannot show it.

Example::

  make gpu-check                                   # = the command below, on the GPU machine
  python -m experiments.gpu_check --platform=gpu --out=runs/gpu_check
  .venv/bin/python -m experiments.gpu_check --platform=cpu --quick --out=/tmp/gpu_check
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import math
import os
import pathlib
import platform as host_platform
import subprocess
import sys
import time
import traceback

if __package__ in (None, ''):  # run by path: its siblings import as the experiments package
  sys.exit(f'run it from the checkout as: python -m experiments.{pathlib.Path(__file__).stem}')

import jax
from absl import flags

from experiments import _harness
from hetjax import ConfigError
from hetjax.runtime import enable_compilation_cache, measure_peak_flops

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The lm part last: the longest (compiles of GPT-2 small), and the one that yields its rows as it
# goes, so the budget can stop it between rows; the exactness tests early, in a subprocess.
PARTS = ('device', 'tests', 'planner', 'schmp', 'curve', 'lm')
#: Seconds the check may start new work for (`--budget_s`): the goal is 8 minutes in all, and
#: the row running at the deadline still finishes.
BUDGET_S = 420.0
#: The part modules (``run(quick) -> rows``, ``markdown(rows) -> lines``).
MODULES = {'lm': 'experiments._gpu_lm', 'curve': 'experiments._gpu_curve',
           'planner': 'experiments._gpu_planner', 'schmp': 'experiments._gpu_schmp'}
#: ``--platform`` → JAX's platforms: an accelerator's check keeps the CPU backend too (SchMP
#: compares against it).
PLATFORMS = {'gpu': 'cuda,cpu', 'tpu': 'tpu,cpu', 'cpu': 'cpu', 'auto': None}
TESTS_TIMEOUT_S = 240
TEST_WORKERS = 4

_OUT = flags.DEFINE_string('out', 'runs/gpu_check', 'writes gpu_check.json and gpu_check.md here')
_PLATFORM = flags.DEFINE_enum('platform', 'auto', list(PLATFORMS),
                              'the device to check (auto: JAX\'s default backend)')
_QUICK = flags.DEFINE_bool('quick', False, 'tiny sizes: for a CPU, to check the code runs')
_PARTS = flags.DEFINE_list('parts', list(PARTS), f'the parts to run, of {list(PARTS)}')
_BUDGET = flags.DEFINE_float('budget_s', BUDGET_S,
                             'no part starts, and a part that yields rows (lm) stops between '
                             'them, once this many seconds have passed; what did not run is '
                             'listed as not run')


def _device_part(quick: bool) -> list[dict]:
  device = jax.devices()[0]
  size = 256 if quick else None
  rows = [{'part': 'device', 'device': str(device), 'device_kind': device.device_kind,
           'platform': device.platform, 'devices': jax.device_count(),
           'jax': jax.__version__, 'python': host_platform.python_version(),
           'measured': ['bfloat16_flops_per_s', 'float32_flops_per_s',
                        'float32_highest_flops_per_s']}]
  for dtype in ('bfloat16', 'float32'):
    rows[0][f'{dtype}_flops_per_s'] = measure_peak_flops(dtype, device, size=size)
  # JAX's default precision multiplies float32 in TF32 on an NVIDIA GPU (what float32 models
  # run at unless pinned); 'highest' is float32 proper, what the exactness tests pin.
  with jax.default_matmul_precision('highest'):
    rows[0]['float32_highest_flops_per_s'] = measure_peak_flops('float32', device, size=size)
  return rows


def _device_markdown(rows: list[dict]) -> list[str]:
  r = rows[0]
  return ['### The device', '',
          f'{r["device_kind"]} ({r["platform"]}, {r["devices"]} device(s)), JAX {r["jax"]}, '
          f'Python {r["python"]}; matmul (measured): bfloat16 '
          f'{r["bfloat16_flops_per_s"] / 1e12:.2f} TFLOP/s, float32 '
          f'{r["float32_flops_per_s"] / 1e12:.2f} TFLOP/s at JAX\'s default precision (TF32 '
          f'on an NVIDIA GPU), float32 {r["float32_highest_flops_per_s"] / 1e12:.2f} TFLOP/s at '
          "'highest'"]


def _gpu_test_files() -> list[str]:
  """The test files that mark a test ``gpu`` (collecting only them, not the whole suite, to
  filter by the mark: 10 s less on a CPU)."""
  return sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'tests').glob('test_*.py')
                if 'mark.gpu' in p.read_text())


def _tests_part(quick: bool) -> list[dict]:
  """``pytest -m gpu`` on this machine's default device (quick: collected only)."""
  # This process still holds the memory its parts' steps grew into: the child allocates what it
  # needs as it goes instead of reserving most of the device up front.
  path = os.pathsep.join(p for p in (str(ROOT), os.environ.get('PYTHONPATH')) if p)
  env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION='highest', PYTHONPATH=path,
             XLA_PYTHON_CLIENT_PREALLOCATE='false')
  platforms = PLATFORMS[_PLATFORM.value]
  if platforms:
    env['JAX_PLATFORMS'] = platforms
  # Several test processes share the device where pytest-xdist is installed (an H200's image
  # has it): 106 s in one process there, most of it compiling small programs on the host.
  # pytest-benchmark (installed there too) refuses to run beside xdist: off.
  workers = (['-n', str(TEST_WORKERS), '-p', 'no:benchmark']
             if not quick and importlib.util.find_spec('xdist') else [])
  command = [sys.executable, '-m', 'pytest', '-m', 'gpu', '-q', '-p', 'no:cacheprovider',
             '-p', 'no:randomly', *workers, *(['--collect-only'] if quick else []),
             *_gpu_test_files()]
  start = time.perf_counter()
  try:
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=TESTS_TIMEOUT_S)
    tail, code = result.stdout.strip().splitlines()[-1:] or [''], result.returncode
  except subprocess.TimeoutExpired:
    tail, code = [f'timed out after {TESTS_TIMEOUT_S} s'], None
  return [{'part': 'tests', 'command': ' '.join(command[1:]), 'collected_only': quick,
           'returncode': code, 'summary': tail[0], 'seconds': time.perf_counter() - start,
           'measured': ['returncode', 'summary']}]


def _tests_markdown(rows: list[dict]) -> list[str]:
  r = rows[0]
  ok = r['returncode'] == 0
  what = 'collected' if r['collected_only'] else 'ran'
  return ['### Exactness tests on the device (`pytest -m gpu`)', '',
          f'{what}: {r["summary"]} (exit {r["returncode"]}, {r["seconds"]:.0f} s)', '',
          f'goal: every exactness test green: {"met" if ok else "not met"}'
          + (' (collected only: --quick)' if r['collected_only'] else '')]


def _part(name: str):
  """``(run, markdown)`` of part ``name``."""
  if name == 'device':
    return _device_part, _device_markdown
  if name == 'tests':
    return _tests_part, _tests_markdown
  module = importlib.import_module(MODULES[name])
  return module.run, module.markdown


def _select_platform() -> None:
  platforms = PLATFORMS[_PLATFORM.value]
  if platforms:
    jax.config.update('jax_platforms', platforms)
  try:
    backend = jax.default_backend()
  except RuntimeError as e:
    raise ConfigError(f'--platform={_PLATFORM.value}: no such device here '
                      f'({str(e).splitlines()[0]})') from None
  wanted = {'gpu': 'gpu', 'tpu': 'tpu', 'cpu': 'cpu'}.get(_PLATFORM.value)
  if wanted and backend != wanted:
    raise ConfigError(f'--platform={_PLATFORM.value}: JAX\'s default backend is {backend}')


def main() -> None:
  parts = list(_PARTS.value)
  unknown = [p for p in parts if p not in PARTS]
  if unknown or not parts:
    raise ConfigError(f'--parts: unknown {unknown or "(none given)"}; choose from {list(PARTS)}')
  if not _BUDGET.value > 0:
    raise ConfigError(f'--budget_s must be positive, got {_BUDGET.value:g}')
  out = pathlib.Path(_OUT.value)
  if out.exists() and not out.is_dir():
    raise ConfigError(f'--out {out} is a file, not a directory')
  _select_platform()
  out.mkdir(parents=True, exist_ok=True)
  quick = _QUICK.value
  report = {'started': datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds'),
            'platform': jax.default_backend(), 'quick': quick, 'parts': {}}
  lines = [f'## GPU check ({report["started"]}, {jax.devices()[0].device_kind}'
           f'{", --quick" if quick else ""})', '']
  with _harness.compilation_cache() as cache:
    # The parts compile each step ahead of time (its FLOPs, memory, compile seconds) and then
    # run it under `jax.jit`: an empty persistent cache turns the second compile into a load.
    enable_compilation_cache(cache)
    failed = _run_parts(parts, quick, out, report, lines, _BUDGET.value)
  if failed:
    raise RuntimeError(f'part(s) failed: {", ".join(failed)} (see {out / "gpu_check.json"})')


def _write(out: pathlib.Path, report: dict, lines: list[str]) -> None:
  (out / 'gpu_check.json').write_text(json.dumps(report, indent=2, default=str) + '\n')
  (out / 'gpu_check.md').write_text('\n'.join(lines) + '\n')


def _progress(row: dict) -> str:
  """A few words on one row, for the console while a part runs."""
  words = [str(row[k]) for k in ('kind', 'model', 'attention', 'remat', 'side') if k in row]
  if 'step_s' in row and isinstance(row['step_s'], float):
    words.append(f'{1e3 * row["step_s"]:.1f} ms/step')
  if isinstance(row.get('mfu_datasheet'), float):
    words.append(f'MFU {row["mfu_datasheet"]:.1%} of the datasheet')
  return ' '.join(words) or 'a row'


def _run_parts(parts: list[str], quick: bool, out: pathlib.Path, report: dict,
               lines: list[str], budget_s: float = math.inf) -> list[str]:
  """Runs ``parts`` in order, writing the JSON and markdown after each (and after each row of
  a part that yields them); none starts after ``budget_s`` seconds, and a part that yields rows
  stops between them then. The failed parts."""
  failed = []
  start = time.perf_counter()
  deadline = start + budget_s
  for name in parts:
    began = time.perf_counter()
    if began > deadline:
      entry = {'rows': [], 'not_run': f'the budget of {budget_s:g} s was spent', 'seconds': 0.0}
      report['parts'][name] = entry
      section = [f'### {name}', '', f'not run: {entry["not_run"]} (--budget_s)']
      lines += [*section, '']
      print('\n'.join(section), flush=True)
      continue
    rows: list[dict] = []
    cut = False
    try:
      run, markdown = _part(name)
      # A part may yield its rows as it measures them (the lm part does: a row, or a list of
      # rows measured together): each is written at once, so a part that is killed keeps what
      # it measured, and the budget stops it between two.
      produced = run(quick)
      for item in produced:
        for row in item if isinstance(item, list) else [item]:
          rows.append(row)
          print(f'({name}: {_progress(row)} after {time.perf_counter() - began:.0f} s)',
                flush=True)
        report['parts'][name] = {'rows': rows, 'partial': True,
                                 'seconds': time.perf_counter() - began}
        _write(out, report, lines)
        if time.perf_counter() > deadline and hasattr(produced, 'close'):
          produced.close()  # what it had left to measure is not run
          cut = True
          break
      entry = {'rows': rows, 'seconds': time.perf_counter() - began}
      section = markdown(rows)
      if cut:
        entry['cut'] = f'stopped after {len(rows)} row(s): the budget of {budget_s:g} s was spent'
        section += ['', f'{entry["cut"]} (--budget_s); the rest of the part did not run']
    except Exception as e:
      entry = {'rows': rows,
               'error': f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}',
               'traceback': traceback.format_exc(), 'seconds': time.perf_counter() - began}
      section = [f'### {name}', '', f'failed: {entry["error"]}']
      failed.append(name)
    report['parts'][name] = entry
    lines += [*section, '', f'({name}: {entry["seconds"]:.0f} s)', '']
    print('\n'.join(section), flush=True)
    print(f'({name}: {entry["seconds"]:.0f} s)\n', flush=True)
    # Written after every part: a later part that hangs or is killed keeps these.
    _write(out, report, lines)
  report['seconds'] = time.perf_counter() - start
  _write(out, report, lines)
  print(f'gpu check: {report["seconds"]:.0f} s; {out / "gpu_check.json"}, {out / "gpu_check.md"}')
  return failed


if __name__ == '__main__':
  _harness.run_main('gpu_check.py', main)
