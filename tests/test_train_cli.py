"""experiments/train.py end to end: every config, bad input, resume, and a kill during a save."""

import json
import math
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from hetjax import data as hdata
from hetjax import run
from hetjax.checkpoint import Checkpointer
from hetjax.replicas import ReplicaCheckpointer, ReplicaPolicy, SyncPolicy
from tests.conftest import default_xla_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 300


def _cmd(*args):
  return [sys.executable, str(ROOT / 'experiments' / 'train.py'), '--jax_num_cpu_devices=8', *args]


def train(*args, env=None):
  return subprocess.run(_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                        env=env)


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows]


def train_forked(scratch, *commands):
  """Each of ``commands`` (argument lists for train.py) in order, each in a child forked from one
  import of JAX and train.py (`tests/workers/cli_cases.py`: the real entry point, argv, absl
  parsing and exit code, a fresh JAX backend per child); a `subprocess.CompletedProcess` each."""
  cases = [[*_cmd(*args)[2:]] for args in commands]
  (scratch / 'cases.json').write_text(json.dumps(cases))
  subprocess.run([sys.executable, str(ROOT / 'tests' / 'workers' / 'cli_cases.py'),
                  str(scratch / 'cases.json'), str(scratch / 'results.json')],
                 cwd=ROOT, check=True, timeout=TIMEOUT)
  return [subprocess.CompletedProcess(args, r['returncode'], r['stdout'], r['stderr'])
          for args, r in zip(cases, json.loads((scratch / 'results.json').read_text()),
                             strict=True)]


#: A GPU config's one CPU step: GPT-2 small's structure (tied embeddings, bfloat16 over float32
#: weights, save_dots remat, its 50304-token vocabulary and schedule) at a CPU's size, on a byte
#: dataset of experiments/prepare_text.py (`_byte_dataset`) and all 8 devices.
GPT2_SMALL_ON_CPU = ['--mesh=8x1', '--set', 'model.args.layers=1', '--set',
                     'model.args.d_model=64', '--set', 'model.args.heads=2', '--set',
                     'model.args.mlp=128', '--set', 'model.args.seq_len=32']


#: The 1B Llama config's one CPU step: its structure (grouped-query attention, Llama 3.1's rope
#: scaling, tied embeddings over its 128256-token vocabulary, bfloat16 over float32, save_dots)
#: at a CPU's size.
LLAMA_1B_ON_CPU = ['--mesh=8x1', '--set', 'model.args.layers=1', '--set',
                   'model.args.d_model=64', '--set', 'model.args.heads=4', '--set',
                   'model.args.kv_heads=2', '--set', 'model.args.mlp=128', '--set',
                   'model.args.seq_len=32']


@pytest.fixture(scope='module')
def one_step_runs(tmp_path_factory):
  """``{config: (workdir, result)}``: every config's one-step run, forked (`train_forked`)."""
  scratch = tmp_path_factory.mktemp('one-step')
  names = run.config_names()
  data = scratch / 'bytes'
  hdata.prepare_text(ROOT / 'hetjax' / 'run', data, max_bytes=200_000)
  # The gpt config's 6 blocks at 2: its hybrid 4x2 step and its sharded init compile in a third
  # of the time (27 s of the fixture's CPU), and a block more or less is not what is checked.
  extra = {'gpt2_small': [*GPT2_SMALL_ON_CPU, '--set', f'model.args.data={data}'],
           'llama_1b': [*LLAMA_1B_ON_CPU, '--set', f'model.args.data={data}'],
           'gpt': ['--set', 'model.args.layers=2'],
           # Fine-tuning transformers' tiny Llama (tests/fixtures/hf): the config's purpose.
           'llama_finetune': ['--mesh=8x1', '--set',
                              f'model.init=hf:{ROOT / "tests/fixtures/hf/llama"}', '--set',
                              'model.args.seq_len=32']}
  results = train_forked(scratch, *[[f'--config={name}', '--steps=1',
                                     f'--workdir={scratch / name}', *extra.get(name, [])]
                                    for name in names])
  return {name: (scratch / name, result) for name, result in zip(names, results, strict=True)}


@pytest.mark.parametrize('name', run.config_names())
def test_every_config_runs_one_step(one_step_runs, name):
  workdir, result = one_step_runs[name]
  assert result.returncode == 0, result.stderr
  [loss] = _losses(workdir)
  assert math.isfinite(loss)
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['final_step'] == 1 and summary['checkpoint_steps'] == [1]
  assert 'step 1/1 | loss' in result.stdout


def _expect_usage_error(result, *fragments):
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('train.py: error: '), result.stderr
  for fragment in fragments:
    assert fragment in lines[0]


BAD_INPUT = [
    (['--config=resnet'], ["unknown config 'resnet'"]),
    (['--config=mlp', '--set', 'model=resnet'], ["unknown model 'resnet'"]),
    (['--config=mlp', '--mesh=4x4'], ['mesh 4x4 needs 16 devices but 8']),
    (['--config=mlp', '--mesh=8'], ["mesh '8' is not 2 positive sizes"]),
    (['--config=mlp', '--set', 'global_batch=100', '--strategy=fsdp'],
     ['global batch 100 is not divisible by the data-parallel degree 8']),
    (['--config=mlp', '--strategy=pipeline'], ["unknown parallelism.strategy 'pipeline'"]),
    (['--config=mlp', '--strategy=fsdpp'],
     ["unknown parallelism.strategy 'fsdpp'; did you mean 'fsdp'? choose one of: data_parallel"]),
    (['--config=mlp', '--set', 'optimizer=lion'], ["unknown optimizer.name 'lion'"]),
    # A bare name two sections share is refused, naming both (issue 39).
    (['--config=mlp', '--set', 'schedule=cosine'],
     ["override 'schedule' is ambiguous: optimizer.schedule or pipeline.schedule"]),
    (['--config=mlp', '--set', 'learning_rate=fast'], ['expected float, got str']),
    (['--config=mlp', '--set', 'model_args.hidden=60', '--strategy=tensor_parallel'],
     ["parameter 'down/kernel': dimension 0 ('mlp', size 60)"]),
    (['--config=mlp', '--steps=many'], ['flag --steps=many']),
    (['--config=mlp', '--mesh=8x1', '--slowdown=wobble:3'], ["unknown trace 'wobble'"]),
    (['--config=mlp', '--mesh=8x1', '--slowdown=static:nan'], ['factors must be finite and > 0']),
    (['--config=mlp', '--mesh=8x1', '--shares=100,20'], ['shares (100, 20) must be 1']),
    (['--config=mlp', '--mesh=8x1', '--policy=lbbsp', '--bucket=64', '--memory_caps=128'],
     ['memory caps (128,) hold 128 rows, less than the global batch 256']),
    (['--config=mlp', '--mesh=8x1', '--policy=lbbsp', '--bucket=12'],
     ['bucket 12 is not a multiple of the local data-parallel degree 8']),
    (['--config=mlp', '--mesh=8x1', '--policy=fastest'], ["unknown balance.policy 'fastest'"]),
    ([], ['--config is required']),
    (['--config=mlp', '--mode=pipeline', '--slowdown=static:2'],
     ['mode pipeline takes no slowdown on one worker (slowdown makes every worker a host of known '
      'speed: modes shares, tokens, plan, schmp, ps and pipeline under several workers)']),
    (['--config=mlp', '--mode=spmd', '--policy=lbbsp', '--shares=256'],
     ['mode spmd takes no balance.policy, balance.shares (balance.policy re-sizes']),
    (['--config=mlp', '--mode=tokens', '--token_rows=24'],
     ['token_rows 24 does not divide the global batch 256']),
    (['--config=mlp', '--mode=tokens', '--plan=hetjax/configs/plans/pure_dp.json'],
     ['mode tokens takes no parallelism.plan (parallelism.plan lays each sub-model out on its '
      'group of workers: mode plan)']),
    (['--config=mlp', '--mode=plan'], ['mode plan needs a plan: --plan=PATH']),
    (['--config=mlp', '--plan=hetjax/configs/plans/pure_dp.json', '--slowdown=static:2'],
     ['this plan runs on one process: launch several workers']),
    (['--config=mlp', '--mode=pipeline', '--sync=ps'],
     ["pipeline.sync 'ps' is now 'periodic-average'", 'choose one of: all-reduce, random-pairs']),
    (['--config=mlp', '--mode=pipeline', '--sync=gossip'], ["unknown pipeline.sync 'gossip'"]),
    (['--config=mlp', '--mode=pipeline', '--sync=all-reduce'],
     ['mode pipeline takes no pipeline.sync on one worker (pipeline.sync groups pipeline replicas: '
      'mode pipeline under several workers)']),
    (['--config=mlp', '--set', 'ps=bsp,eager'], ['eager pull needs asp or ssp']),
    (['--config=mlp', '--set', 'ps=ssp'], ['ssp needs its bound, e.g. ssp:2']),
    (['--config=mlp', '--mode=ps'], ['mode ps needs parameter servers: launch it with']),
    (['--config=mlp', '--set', 'network=link:1:10'],
     ["mode spmd takes no network (network emulates each worker's link: modes shares and ps)"]),
    (['--config=mlp', '--mode=shares', '--set', 'network=link:1'], ["bad links 'link:1'"]),
    (['--config=mlp', '--mode=tokens', '--set', 'overlap=True'],
     ['mode tokens takes no overlap (overlap runs the all-reduce scheduler: mode shares)']),
    # Tokens size themselves: a share policy there was once silently ignored (issue 40).
    (['--config=mlp', '--mode=tokens', '--policy=lbbsp'],
     ["mode tokens takes no balance.policy (balance.policy re-sizes each worker's share: mode "
      'shares)']),
    (['--config=mlp', '--mode=shares', '--set', 'bucket_bytes=4096'],
     ['bucket_bytes sizes the all-reduce scheduler\'s buckets: set overlap=True']),
    # The language model's data and training options (issue 26).
    (['--config=gpt', '--set', 'model.args.data=no/such/dir'],
     ['token dataset no/such/dir does not exist',
      'prepare_text.py --source=DIR --out=no/such/dir']),
    (['--config=gpt', '--set', 'model.args.vocab_size=100'],
     ['gpt vocab_size=100 is smaller than the 256 byte values']),
    (['--config=gpt', '--set', 'optimizer.accumulate=3'],
     ['global batch 32 is not divisible by accumulate 3 x the data-parallel degree 4']),
    (['--config=gpt', '--set', 'optimizer.shedule=cosine'],
     ["unknown key; did you mean 'optimizer.schedule'?"]),
    (['--config=mlp', '--set', 'model.remat=full'],
     ["model.remat: model 'mlp' takes no remat argument"]),
]


@pytest.fixture(scope='module')
def bad_input_results(tmp_path_factory):
  """Every `BAD_INPUT` command line run by `tests/workers/cli_cases.py`: one import of JAX and
  train.py, then one forked child per case (the real entry point, exit code and all), each with
  a run directory of its own."""
  scratch = tmp_path_factory.mktemp('bad-input')
  return train_forked(scratch, *[[*args, f'--workdir={scratch / str(i)}']
                                 for i, (args, _) in enumerate(BAD_INPUT)])


@pytest.mark.parametrize('case', range(len(BAD_INPUT)),
                         ids=[' '.join(args) or 'no-args' for args, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(bad_input_results, case):
  _expect_usage_error(bad_input_results[case], *BAD_INPUT[case][1])


def test_bad_input_from_a_fresh_process_is_one_line_and_exit_2(tmp_path):
  """The same as a command of its own (no fork): a bad flag value and a bad config."""
  _expect_usage_error(train('--config=mlp', '--steps=many', f'--workdir={tmp_path}'),
                      'flag --steps=many')
  _expect_usage_error(train('--config=mlp', '--mesh=4x4', f'--workdir={tmp_path}'),
                      'mesh 4x4 needs 16 devices but 8')


@pytest.fixture(scope='module')
def saved_run(tmp_path_factory):
  """An mlp run of 8 steps, and the same run stopped after 4 steps."""
  full, part = tmp_path_factory.mktemp('full'), tmp_path_factory.mktemp('part')
  results = train_forked(tmp_path_factory.mktemp('saved'),
                         ['--config=mlp', '--steps=8', f'--workdir={full}'],
                         ['--config=mlp', '--steps=4', f'--workdir={part}'])
  assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
  return full, part


def test_resume_continues_the_same_run(saved_run):
  full, part = saved_run
  result = train('--config=mlp', '--steps=8', f'--workdir={part}', '--resume')
  assert result.returncode == 0, result.stderr
  assert 'steps 4→8' in result.stdout
  assert _losses(part) == _losses(full)


def test_resume_refuses_a_checkpoint_of_another_model(saved_run):
  _, part = saved_run
  _expect_usage_error(train('--config=wide_deep', f'--workdir={part}', '--resume'),
                      "its task is {name='mlp'", "this run has {name='wide_deep'")


def test_existing_run_is_not_overwritten_silently(saved_run):
  _, part = saved_run
  _expect_usage_error(train('--config=mlp', f'--workdir={part}'), 'pass --resume or --overwrite')


def test_resume_without_a_run_is_an_error(tmp_path):
  _expect_usage_error(train('--config=mlp', f'--workdir={tmp_path}', '--resume'), 'no run in')


@pytest.mark.slow
def test_kill_during_save_leaves_only_complete_checkpoints(tmp_path):
  # A large table makes each save long; the process is killed while orbax's temporary directory
  # for a step exists, i.e. in the middle of writing it. Both runs at XLA's default level: the
  # suite's compile-time flags make the table's code slow (39 CPU-seconds against 23).
  env = default_xla_env()
  args = ['--config=wide_deep', '--set', 'model_args.rows=400000', '--set', 'checkpoint_every=1',
          '--steps=50', f'--workdir={tmp_path}']
  proc = subprocess.Popen(_cmd(*args), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env)
  ckpt_dir, killed_mid_save = tmp_path / 'checkpoints', False
  try:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
      names = [p.name for p in ckpt_dir.iterdir()] if ckpt_dir.exists() else []
      if any(n.isdigit() for n in names) and any('tmp' in n for n in names):
        proc.send_signal(signal.SIGKILL)
        killed_mid_save = True
        break
      time.sleep(0.005)
  finally:
    proc.kill()
    proc.wait(timeout=30)
  assert killed_mid_save, 'the run ended before a save could be interrupted'
  complete = sorted(int(n.name) for n in ckpt_dir.iterdir() if n.name.isdigit())
  result = train(*args[:-2], '--steps=' + str(complete[-1] + 1), f'--workdir={tmp_path}',
                 '--resume', env=env)
  assert result.returncode == 0, result.stderr
  assert f'steps {complete[-1]}→{complete[-1] + 1}' in result.stdout


MODES = {
    'tokens': ['--mesh=8x1', '--token_rows=64'],
    'shares': ['--mesh=8x1', '--shares=256'],
    'pipeline': ['--set', 'stages=2', '--set', 'micro_batches=4'],
}


@pytest.fixture(scope='module')
def mode_runs(tmp_path_factory):
  """``{mode: (workdir, result)}``: two mlp steps in each of `MODES`, forked (`train_forked`)."""
  scratch = tmp_path_factory.mktemp('modes')
  results = train_forked(scratch, *[['--config=mlp', f'--mode={mode}', '--steps=2',
                                     f'--workdir={scratch / mode}', *extra]
                                    for mode, extra in MODES.items()])
  return {mode: (scratch / mode, result) for mode, result in zip(MODES, results, strict=True)}


@pytest.mark.parametrize('mode', MODES)
def test_every_mode_runs_from_train_py_on_one_process(mode_runs, mode):
  workdir, result = mode_runs[mode]
  assert result.returncode == 0, result.stderr
  assert f'mlp: {mode},' in result.stdout
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['final_step'] == 2 and summary['first_shares'] == summary['last_shares'] == [256]
  assert len(_losses(workdir)) == 2 and all(math.isfinite(x) for x in _losses(workdir))


def test_a_pipeline_run_resumes_at_its_step(tmp_path):
  """Two runs, each a child of its own (`train_forked`): the second starts from the files only."""
  args = ['--config=mlp', '--mode=pipeline', f'--workdir={tmp_path / "run"}', '--set',
          'micro_batches=2']
  first, result = train_forked(tmp_path, [*args, '--steps=2'], [*args, '--steps=3', '--resume'])
  assert first.returncode == 0, first.stderr
  assert result.returncode == 0, result.stderr
  assert 'steps 2→3' in result.stdout and len(_losses(tmp_path / 'run')) == 3


def test_a_config_of_your_own_from_a_file_or_a_function(tmp_path):
  path = tmp_path / 'mine.py'
  path.write_text(
      'from hetjax.run import Config, override\n\n'
      'def get_config():\n'
      "  return override(Config(model='mlp'), ['model.args.hidden=32', 'model.args.width=16',\n"
      "                  'data.global_batch=64', 'steps=2', 'mesh=8x1', 'strategy=data_parallel'])\n")
  from_file, from_function = train_forked(
      tmp_path, [f'--config={path}', f'--workdir={tmp_path / "a"}'],
      ['--config=hetjax.configs.mlp:get_config', '--steps=1', '--set',
       'model=hetjax.models:make_task', '--set', 'model_args.name=mlp',
       f'--workdir={tmp_path / "b"}'])
  assert from_file.returncode == 0, from_file.stderr
  assert json.loads((tmp_path / 'a' / 'summary.json').read_text())['final_step'] == 2
  assert from_function.returncode == 0, from_function.stderr


# Pipeline replicas under the launcher: one replica of the whole pipeline per worker, grouped by
# the sync policy (worker 0 runs the scheduler), each replica slowed by its host of known speed.
REPLICA_ARGS = ['--config=mlp', '--set', 'mode=pipeline', '--set', 'sync=sdpipe',
                '--set', 'model_args.hidden=32', '--set', 'model_args.width=16',
                '--set', 'global_batch=32', '--set', 'checkpoint_every=2', '--set', 'log_every=1',
                '--set', 'host_row_s=0.001', '--slowdown=persistent:0:3']


def launch(workdir, *args):
  command = [sys.executable, '-m', 'hetjax.launch', '--workers', '2', '--devices-per-worker', '2',
             '--timeout', '120', '--', sys.executable, str(ROOT / 'experiments' / 'train.py'),
             *REPLICA_ARGS, f'--workdir={workdir}', *args]
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)


@pytest.mark.multiprocess
@pytest.mark.timeout(320)
def test_pipeline_replicas_run_and_resume_under_the_launcher(tmp_path):
  result = launch(tmp_path, '--steps=4')
  assert result.returncode == 0, result.stdout[-3000:]
  assert '2 replicas of 2 stages' in result.stdout and 'sync sdpipe' in result.stdout
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['final_step'] == 4 and summary['sync']['groups'] >= 4
  # Worker 0's host is 3x slow: 3 × 32 rows × 1 ms a step, padded by sleep.
  assert summary['wall_s'] >= 4 * 3 * 0.032 * 0.95
  assert json.loads((tmp_path / 'run.json').read_text())['sync'] == 'sdpipe'
  saved = {}
  for w in (0, 1):
    meta = ReplicaCheckpointer(tmp_path / 'checkpoints' / f'replica-{w}').read_meta(4)
    assert meta['step'] == 4 and meta['policy_name'] == 'sdpipe'
    saved[w] = meta

  # Resumed with the sync overlapped with the next step (`sync_overlap`, one step late).
  result = launch(tmp_path, '--steps=6', '--resume', '--set', 'sync_overlap=true')
  assert result.returncode == 0, result.stdout[-3000:]
  assert 'steps 4→6' in result.stdout and len(_losses(tmp_path)) == 6
  policy = ReplicaPolicy(SyncPolicy('sdpipe', 2), None, '', serve=False)
  before = Checkpointer.policy_state(saved[0], policy.init())
  after = Checkpointer.policy_state(
      ReplicaCheckpointer(tmp_path / 'checkpoints' / 'replica-0').read_meta(6), policy.init())
  assert (before['step'], after['step']) == (4, 6)
  # The scheduler went on from its saved state: group numbers and its clock continue. Only step
  # 5's group is sure to be closed by step 6's checkpoint: with the sync one step late, step 6's
  # arrival may land after it, and the two replicas may share one group.
  assert after['sync']['seq'] > before['sync']['seq'] >= 4
  assert after['sync']['now'] > before['sync']['now']
