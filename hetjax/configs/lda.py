"""SchMP-LDA: collapsed Gibbs on the standard library's docstrings, vocabulary shards rotating
over the devices (`hetjax.schmp._lda`). A round is 1/P of a sweep; ``--set scheduler=unscheduled``
is the unscheduled parallel Gibbs baseline (a round is a whole sweep)."""

from hetjax.run import Config


def get_config() -> Config:
  return Config(
      model='lda', model_args={'topics': 16, 'alpha': 0.1, 'beta': 0.01, 'documents': 256,
                               'vocabulary': 1000},
      steps=40, scheduler='schmp', staleness=1, objective_every=4, log_every=4,
      checkpoint_every=20)
