"""hetjax's public surface, pinned: every package's ``__all__`` (`SURFACE`) and what
``import hetjax`` gives (`ROOT`).

What may join the surface: a name joins a package's ``__all__`` when a user's code needs it: the
README, ``docs/``, ``examples/``, or a model, policy or script of the user's own written against
them. What only hetjax's own benchmarks or tests need (a timing, a FLOP count, a builder's
default, a launcher's free port) goes to `hetjax.bench`, which re-exports it from its private
module and promises no stability. A name has one home: the package whose module defines it
exports it, and no other package re-exports it (import it from its home).

A name that joins or leaves a package's ``__all__`` changes `SURFACE` here, so it shows in
review; `MAX_SURFACE` caps the total, so a growing surface is a decision too.
"""

import ast
import importlib
import pathlib
import subprocess
import sys

from tests.test_layering import SUBPACKAGES, package_dir

ROOT_DIR = pathlib.Path(__file__).parents[1]
PACKAGES = SUBPACKAGES   # hetjax.models' files included (they live in models/)
HOOKS = 'bench'   # hetjax.bench: the benchmarks' and tests' hooks, outside the surface

#: At most this many names in all packages' ``__all__`` (`hetjax.bench` aside).
MAX_SURFACE = 401   # issue 43: local SGD (train.LocalTrainer, LocalState, outer_optimizer,
#   run.LocalConfig, balance.RoundPolicy: a share policy held for a round, and its virtual clock
#   simulation.simulate_local, LocalRun; planner.local_sgd_advice, LocalAdvice: when it pays,
#   from the cluster); issue 41: Hugging Face checkpoints (run.load_hf,
#   run.save_hf, sharding.Weights, sharding.initial_params, sharding.read_weights), run.generate,
#   run.sample, data.text_codec, core.HasModel

#: ``hetjax.__all__``: the packages a user writes code against, and the library's errors
#: (``cli``, ``configs`` and ``bench`` are imported by name when needed).
ROOT = [
    'ConfigError',
    'ShardingError',
    'balance',
    'checkpoint',
    'core',
    'data',
    'emulation',
    'models',
    'pipeline',
    'planner',
    'ps',
    'replicas',
    'report',
    'run',
    'runtime',
    'schmp',
    'sharding',
    'simulation',
    'train',
]

#: One name, two different things, each in its own package (not one thing exported twice).
HOMONYMS = {
    'Batch': ['core', 'data'],          # a step program's batch; a data source's batch
    'Schedule': ['pipeline', 'schmp'],  # a pipeline's order of actions; a SchMP round's blocks
    'evaluate': ['planner', 'run'],     # a plan's costs filled in; a trained run's eval loss
    'make_task': ['models', 'run'],     # a shipped model's task by name; a config's task
}

#: Every ``package.name`` in every package's ``__all__`` but `hetjax.bench`'s, sorted.
SURFACE = [
    'balance.AR',
    'balance.ARState',
    'balance.BalancePolicy',
    'balance.EWMA',
    'balance.EWMAState',
    'balance.Fixed',
    'balance.GpuState',
    'balance.KnownCosts',
    'balance.LBBSP',
    'balance.LBBSPGpu',
    'balance.LBBSPState',
    'balance.LastValue',
    'balance.LastValueState',
    'balance.NARX',
    'balance.NARXState',
    'balance.Oracle',
    'balance.PolicyName',
    'balance.Proportional',
    'balance.ProportionalState',
    'balance.Regime',
    'balance.RegimeState',
    'balance.RoundPolicy',
    'balance.SharesState',
    'balance.ShiftDetector',
    'balance.ShiftState',
    'balance.SpeedPredictor',
    'balance.TimeModel',
    'balance.Uniform',
    'balance.describe_policy',
    'balance.expected_makespan',
    'balance.finish_time_shares',
    'balance.fit_time_model',
    'balance.make_policy',
    'balance.observed_speeds',
    'checkpoint.ArraysCheckpointer',
    'checkpoint.Checkpointer',
    'checkpoint.CheckpointerProtocol',
    'checkpoint.StepCheckpointer',
    'checkpoint.check_compatible',
    'checkpoint.draining_event_loops',
    'cli.fail',
    'cli.run_main',
    'configs.PLANS',
    'core.Batch',
    'core.Collective',
    'core.HasModel',
    'core.LinkCost',
    'core.Pace',
    'core.Policy',
    'core.ShareRules',
    'core.Shares',
    'core.StepProgram',
    'core.StepStats',
    'core.Work',
    'core.WorkerTiming',
    'core.decode_state',
    'core.encode_state',
    'core.host_load',
    'core.ring_bytes',
    'core.ring_fraction',
    'core.ring_steps',
    'data.ArraySource',
    'data.Batch',
    'data.DataFile',
    'data.DataSource',
    'data.Documents',
    'data.Ratings',
    'data.Response',
    'data.RowSource',
    'data.SparseDesign',
    'data.StdlibText',
    'data.StepBatch',
    'data.TokenDataset',
    'data.Tokenizer',
    'data.ZipfClicks',
    'data.batch_size',
    'data.bundled_design',
    'data.check_vocab',
    'data.correlated_design',
    'data.digits',
    'data.is_data_path',
    'data.prepare_text',
    'data.read_data_file',
    'data.read_design',
    'data.read_documents',
    'data.read_ratings',
    'data.read_token_dataset',
    'data.share_offsets',
    'data.slice_batch',
    'data.split_batch',
    'data.stdlib_docstrings',
    'data.stdlib_text',
    'data.step_rng',
    'data.take_rows',
    'data.text_codec',
    'data.write_token_split',
    'data.zipf_clicks',
    'data.zipf_ratings',
    'emulation.Board',
    'emulation.Calibration',
    'emulation.ComposedTrace',
    'emulation.CsvTrace',
    'emulation.Exchange',
    'emulation.HostModel',
    'emulation.KnownSpeedHost',
    'emulation.LinkedHost',
    'emulation.Links',
    'emulation.MARGIN',
    'emulation.MarkovTrace',
    'emulation.RowCost',
    'emulation.SlowdownTrace',
    'emulation.StagePace',
    'emulation.StaticTrace',
    'emulation.StepChangeTrace',
    'emulation.SubsetTrace',
    'emulation.TransientTrace',
    'emulation.build_host',
    'emulation.calibrate_row_cost',
    'emulation.parse_links',
    'emulation.parse_trace',
    'emulation.replica_trace',
    'emulation.subset',
    'models.NAMES',
    'models.make_task',
    'pipeline.Action',
    'pipeline.HasChain',
    'pipeline.Link',
    'pipeline.PipelineState',
    'pipeline.PipelineTrainer',
    'pipeline.Schedule',
    'pipeline.SimResult',
    'pipeline.StageCheckpointer',
    'pipeline.StageLayout',
    'pipeline.StagePrograms',
    'pipeline.check_chain',
    'pipeline.equal_stages',
    'pipeline.gpipe',
    'pipeline.one_f_one_b',
    'pipeline.roofline_costs',
    'pipeline.split_stages',
    'pipeline.time_schedule',
    'planner.Alternative',
    'planner.AnalyticCost',
    'planner.ClusterSpec',
    'planner.CollectiveBytes',
    'planner.CompiledCost',
    'planner.CompiledPlan',
    'planner.Cost',
    'planner.CostModel',
    'planner.Layout',
    'planner.LocalAdvice',
    'planner.Plan',
    'planner.PricedBy',
    'planner.Pricing',
    'planner.SubmodelPlan',
    'planner.SubmodelProfile',
    'planner.TIE_TOLERANCE',
    'planner.WHOLE_MODEL',
    'planner.WorkerSpec',
    'planner.alternatives',
    'planner.compile_plan',
    'planner.evaluate',
    'planner.explain',
    'planner.feasible',
    'planner.local_sgd_advice',
    'planner.measure_cluster',
    'planner.plan_stages',
    'planner.profile_split',
    'planner.profile_submodels',
    'planner.search',
    'planner.worker_devices',
    'ps.Consistency',
    'ps.ENV_NUM_SERVERS',
    'ps.LrRule',
    'ps.ParameterServer',
    'ps.PsClient',
    'ps.PsConfig',
    'ps.PsRole',
    'ps.PsStep',
    'ps.PsWorker',
    'ps.PsWorkerState',
    'ps.PushResult',
    'ps.ServerCheckpointer',
    'ps.ServerError',
    'ps.ServerLayout',
    'ps.ServerReport',
    'ps.ServerState',
    'ps.ShardUpdate',
    'ps.Transport',
    'ps.UpdateRecord',
    'ps.make_server',
    'ps.make_worker',
    'ps.parse_ps',
    'ps.ps_role',
    'ps.serve',
    'replicas.Arrive',
    'replicas.GroupAverager',
    'replicas.GroupRules',
    'replicas.Leave',
    'replicas.RENAMED_SYNC_NAMES',
    'replicas.ReplicaCheckpointer',
    'replicas.ReplicaDriver',
    'replicas.ReplicaPolicy',
    'replicas.ReplicaStep',
    'replicas.ServiceReport',
    'replicas.ServiceThread',
    'replicas.SyncClient',
    'replicas.SyncGroup',
    'replicas.SyncName',
    'replicas.SyncPolicy',
    'replicas.SyncService',
    'replicas.Tick',
    'replicas.consensus_distance',
    'replicas.parse_sync_name',
    'replicas.resume_state',
    'replicas.start_service',
    'report.ComparedRun',
    'report.IterationSummary',
    'report.Launch',
    'report.LiveThroughput',
    'report.LossCurves',
    'report.METRICS_FILE',
    'report.ObjectiveCurve',
    'report.SteadyCount',
    'report.Telemetry',
    'report.TensorBoardWriter',
    'report.Throughput',
    'report.WorkerSummary',
    'report.compare_runs',
    'report.describe_hosts',
    'report.format_comparison',
    'report.format_goodput',
    'report.format_table',
    'report.goodput',
    'report.hosts_of',
    'report.hosts_warning',
    'report.iteration_summary',
    'report.load_loss',
    'report.load_objective',
    'report.load_telemetry',
    'report.plot_comparison',
    'report.plot_loss',
    'report.plot_objective',
    'report.plot_shares',
    'report.plot_throughput',
    'report.plot_timeline',
    'report.steady_throughput',
    'report.summarise',
    'report.summary_fields',
    'report.telemetry_throughput',
    'report.write_plots',
    'run.BalanceConfig',
    'run.Built',
    'run.CheckpointConfig',
    'run.Config',
    'run.DataConfig',
    'run.EmulationConfig',
    'run.EvalConfig',
    'run.LocalConfig',
    'run.LoggingConfig',
    'run.MODES',
    'run.Mode',
    'run.ModeEntry',
    'run.ModelConfig',
    'run.OptimizerConfig',
    'run.ParallelismConfig',
    'run.ParameterServerConfig',
    'run.PipelineConfig',
    'run.SchmpConfig',
    'run.build',
    'run.config_keys',
    'run.config_names',
    'run.describe_modes',
    'run.emulated_host',
    'run.evaluate',
    'run.generate',
    'run.import_function',
    'run.load_config',
    'run.load_hf',
    'run.load_model',
    'run.make_task',
    'run.mode_of',
    'run.optimizer_of',
    'run.override',
    'run.sample',
    'run.save_hf',
    'run.train',
    'runtime.AllReduceFit',
    'runtime.Channel',
    'runtime.Cluster',
    'runtime.LaunchResult',
    'runtime.LocalChannel',
    'runtime.ProgressWatchdog',
    'runtime.TelemetryGatherer',
    'runtime.WorkerContext',
    'runtime.WorkerInfo',
    'runtime.chain_length',
    'runtime.device_flops_per_s',
    'runtime.device_memory',
    'runtime.discover_cluster',
    'runtime.enable_compilation_cache',
    'runtime.fit_allreduce',
    'runtime.hosts',
    'runtime.initialize',
    'runtime.launch_elastic',
    'runtime.launch_local',
    'runtime.measure_peak_flops',
    'runtime.median_seconds',
    'runtime.original_workers',
    'runtime.peak_flops',
    'runtime.port_in_use',
    'runtime.restart_attempt',
    'runtime.restart_cause',
    'runtime.seconds_per_call',
    'runtime.stall_timeout',
    'runtime.time_allreduce',
    'runtime.verdict_dir',
    'schmp.APPS',
    'schmp.AXIS',
    'schmp.App',
    'schmp.CoordinateApp',
    'schmp.Cyclic',
    'schmp.DynamicScheduler',
    'schmp.Priority',
    'schmp.RoundInfo',
    'schmp.Schedule',
    'schmp.Scheduler',
    'schmp.SchmpProgram',
    'schmp.SchmpState',
    'schmp.Shotgun',
    'schmp.StaticRotation',
    'schmp.make_app',
    'sharding.DEFAULT_AXES',
    'sharding.LogicalRules',
    'sharding.ShardingRules',
    'sharding.Weights',
    'sharding.abstract_model',
    'sharding.activation_rules',
    'sharding.batch_sharding',
    'sharding.constrain',
    'sharding.fallen_back',
    'sharding.init_sharded',
    'sharding.initial_params',
    'sharding.make_mesh',
    'sharding.param_shardings',
    'sharding.parse_mesh_shape',
    'sharding.process_rows',
    'sharding.put_batch',
    'sharding.read_weights',
    'sharding.scope',
    'sharding.submodel_names',
    'sharding.submodel_prefixes',
    'sharding.unmapped_names',
    'simulation.ClockCosts',
    'simulation.CommProblem',
    'simulation.CommRun',
    'simulation.LeastSquares',
    'simulation.LocalRun',
    'simulation.Scheme',
    'simulation.SyncRun',
    'simulation.TaskProblem',
    'simulation.VirtualRun',
    'simulation.iteration_s',
    'simulation.simulate_comm',
    'simulation.simulate_local',
    'simulation.simulate_shares',
    'simulation.simulate_sync',
    'simulation.simulate_tokens',
    'train.Evaluation',
    'train.Granularity',
    'train.HasSubmodels',
    'train.Hook',
    'train.LocalState',
    'train.LocalTrainer',
    'train.MetricsLogger',
    'train.Optimizer',
    'train.OverlapEstimate',
    'train.OverlapState',
    'train.OverlapTrainer',
    'train.SURE_TAKE',
    'train.StepInfo',
    'train.Strategy',
    'train.Task',
    'train.TokenRules',
    'train.TokenTrainer',
    'train.TrainState',
    'train.Trainer',
    'train.WorkerTrainer',
    'train.fixed_state_notice',
    'train.learning_rate_schedule',
    'train.local_batch_degree',
    'train.merge_trainable',
    'train.micro_rows_of',
    'train.outer_optimizer',
    'train.program_flops',
    'train.split_trainable',
    'train.summed_value_and_grad',
    'train.takes_token',
    'train.trainable_value_and_grad',
    'train.training_steps',
    'train.worker_meshes',
]


def _all(package: str) -> list[str]:
  return list(importlib.import_module(f'hetjax.{package}').__all__)


def _surface() -> list[str]:
  return sorted(f'{p}.{n}' for p in PACKAGES if p != HOOKS for n in _all(p))


def test_every_package_has_an_all_without_repeats():
  for package in PACKAGES:
    names = _all(package)
    assert len(names) == len(set(names)), f'hetjax.{package}.__all__ repeats a name'


def test_every_exported_name_resolves():
  import hetjax
  missing = [f'hetjax.{n}' for n in hetjax.__all__ if not hasattr(hetjax, n)]
  for package in PACKAGES:
    module = importlib.import_module(f'hetjax.{package}')
    missing += [f'hetjax.{package}.{n}' for n in module.__all__ if not hasattr(module, n)]
  assert missing == []


def _is_value(obj) -> bool:
  """Whether ``obj`` is a constant whose identity says nothing (a string, a number: Python may
  share equal ones between unrelated modules)."""
  return isinstance(obj, str | bytes | int | float | complex | tuple | frozenset | type(None))


def test_no_name_is_exported_by_two_packages():
  homes: dict[str, list[str]] = {}
  for package in PACKAGES:
    for name in _all(package):
      homes.setdefault(name, []).append(package)
  twice = {name: where for name, where in homes.items() if len(where) > 1}
  assert twice == HOMONYMS, ('a name is exported by two packages: export it from the package '
                             'that defines it only (or, for two different things, list it in '
                             f'HOMONYMS): {twice}')
  for name, (a, b) in HOMONYMS.items():
    one = getattr(importlib.import_module(f'hetjax.{a}'), name)
    other = getattr(importlib.import_module(f'hetjax.{b}'), name)
    assert one is not other, f'{name} is one thing exported by {a} and {b}: keep its home only'


def test_each_object_has_one_home():
  seen: dict[int, str] = {}
  twice = []
  for package in PACKAGES:
    module = importlib.import_module(f'hetjax.{package}')
    for name in module.__all__:
      obj = getattr(module, name)
      if _is_value(obj):
        continue
      if id(obj) in seen:
        twice.append(f'{seen[id(obj)]} is also hetjax.{package}.{name}')
      seen.setdefault(id(obj), f'hetjax.{package}.{name}')
  assert twice == []


def test_packages_export_only_what_their_own_modules_define():
  """A package's ``__init__`` imports what it exports from its own modules, never from another
  package (that package is the name's home); `hetjax.bench` alone re-exports others' names, and
  `hetjax.core` the root's link model (``hetjax._links``: a private module of the root, below
  every package, whose public home is core)."""
  found = []
  for package in PACKAGES:
    if package == HOOKS:
      continue
    path = package_dir(package) / '__init__.py'
    exported = set(_all(package))
    for node in ast.parse(path.read_text()).body:
      if not isinstance(node, ast.ImportFrom):
        continue
      module = (f'hetjax.{package}' + (f'.{node.module}' if node.module else '')
                if node.level else node.module)
      for alias in node.names:
        home = module == f'hetjax.{package}' or module.startswith(f'hetjax.{package}.')
        if package == 'core' and module == 'hetjax._links':
          home = True
        if (alias.asname or alias.name) in exported and not home:
          found.append(f'{path.relative_to(ROOT_DIR)}:{node.lineno}: {alias.name} from {module}')
  assert found == [], 'names exported away from their home:\n' + '\n'.join(found)


def test_the_hooks_are_outside_the_surface():
  hooks = set(_all(HOOKS))
  assert hooks
  exported = {n for p in PACKAGES if p != HOOKS for n in _all(p)}
  assert sorted(hooks & exported) == []


def test_the_surface_is_the_snapshot():
  assert sorted(SURFACE) == SURFACE
  surface = _surface()
  joined = sorted(set(surface) - set(SURFACE))
  left = sorted(set(SURFACE) - set(surface))
  assert (joined, left) == ([], []), (
      f'the public surface changed: joined {joined}, left {left}. A name joins when a user\'s '
      'code needs it (module docstring); a benchmark\'s or test\'s hook goes to hetjax.bench. '
      'Update SURFACE if the change is meant.')


def test_the_surface_stays_small():
  assert len(_surface()) <= MAX_SURFACE


def test_import_hetjax_gives_the_user_packages_and_not_the_hooks():
  code = ('import sys, hetjax\n'
          'print(sorted(hetjax.__all__))\n'
          'print(sorted(m for m in ("hetjax.bench", "hetjax.cli") if m in sys.modules))\n')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT_DIR, capture_output=True,
                       text=True, timeout=300, check=True).stdout.splitlines()
  assert out[-2:] == [str(sorted(ROOT)), '[]']
