"""``maskops automl``: a real search of tiny trainings in this process, whose pruner stops
the poor trials at their first evaluation; run again, it continues the same study."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from maskops.automl.search import RESULT_FILE, STUDY_NAME
from maskops.cli.automl import BEST_SPEC_FILE, parse_params
from maskops.cli.common import CLIError
from maskops.cli.main import main
from maskops.spec import spec_to_text
from maskops.spec.models import ExperimentSpec
from maskops.spec.text import parse_spec_text

GOOD_LR, BAD_LR = 0.008, 0.00001


def test_cli_search_prunes_keeps_the_best_and_continues(
    tmp_path: Path, tiny_spec: ExperimentSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.txt"
    spec.write_text(spec_to_text(tiny_spec.model_copy(update={"num_steps_per_eval": 2})))
    results = tmp_path / "search"
    args = [
        # bayesian's GP and median pruner replaced: a seeded random search with ASHA.
        "automl", "-e", str(spec), "-d", str(results), "--algorithm", "bayesian",
        "--sampler", "random", "--pruner", "asha", "--reduction_factor", "2",
        "--metric", "val/Total loss",
        "--param", f"init_learning_rate={GOOD_LR},{BAD_LR}", "--seed", "0",
    ]  # fmt: skip
    # Seed 0 samples BAD, GOOD, BAD: the last one is worse than the good one at step 2.
    assert main([*args, "--trials", "3"]) == 0
    first = json.loads((results / RESULT_FILE).read_text())
    states = [t["state"] for t in first["trials"]]
    assert states == ["complete", "complete", "pruned"], first
    assert first["best"]["params"] == {"init_learning_rate": GOOD_LR}
    assert Path(first["best"]["checkpoint"]).is_file()
    best_spec = parse_spec_text((results / BEST_SPEC_FILE).read_text())
    assert best_spec.init_learning_rate == GOOD_LR
    assert "best: trial 1" in capsys.readouterr().out
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{results / 'automl.db'}")
    assert (study.user_attrs["sampler"], study.user_attrs["pruner"]) == ("random", "asha")

    # The same command with more trials continues the study: the 3 finished are kept.
    assert main([*args, "--trials", "4"]) == 0
    second = json.loads((results / RESULT_FILE).read_text())
    assert second["trials"][:3] == first["trials"] and len(second["trials"]) == 4


def test_param_flags_parse_ranges_and_choices() -> None:
    assert parse_params([]) is None
    assert parse_params(["a=1:10:log", "b=0.5:2", "c=64,128", "d=true,false", "e"]) == {
        "a": {"min": 1, "max": 10, "log": True},
        "b": {"min": 0.5, "max": 2, "log": False},
        "c": {"choices": [64, 128]},
        "d": {"choices": [True, False]},
        "e": {},
    }
    with pytest.raises(CLIError, match="--param"):
        parse_params(["a=x:y"])


def test_a_field_the_spec_lacks_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.txt"
    spec.write_text(spec_to_text(ExperimentSpec()))
    code = main(["automl", "-e", str(spec), "-d", str(tmp_path / "r"), "--param", "nope=1:2"])
    assert code != 0 and "nope" in capsys.readouterr().err


def test_an_interrupted_trial_is_retried_in_its_folder_and_counted_once() -> None:
    from maskops.automl.search import _finished_trials, _retry_interrupted

    study = optuna.create_study()
    lr = optuna.distributions.FloatDistribution(0.001, 0.01)
    killed = study.ask({"init_learning_rate": lr})  # left running by a killed search
    killed.set_user_attr("results_dir", "/runs/trial_0")
    _retry_interrupted(study)
    retry = study.ask({"init_learning_rate": lr})
    assert retry.params == killed.params
    assert retry.user_attrs["results_dir"] == "/runs/trial_0"  # where its checkpoint is
    assert _finished_trials(study) == 0
    study.tell(retry, 1.0)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert _finished_trials(study) == 1
