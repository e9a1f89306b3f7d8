"""AutoML: hyperparameter search over spec fields on Optuna (samplers, pruners, studies in
an SQL database). :mod:`.space` checks and applies a search space (no Optuna needed to
import it), :mod:`.study` maps the algorithms to Optuna and reports a trial's evaluations to
its pruner, :mod:`.search` runs a whole search in this process (``maskops automl``)."""
