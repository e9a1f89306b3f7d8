"""What an AutoML search finds on the demo data against the recipe's defaults.

The demo walk's dataset and spec (``maskops_serve.demo``, the recipe): each trial of the
search trains the recipe with its sampled fields (``recipe_space``) for ``--steps`` steps
(the fixed training budget of one model; pruned trials stop earlier), evaluating every
``--steps // 3`` steps for the pruner; the recipe's own defaults are trained exactly as
long. Recorded: the best trial's mask AP and fields, every trial, the steps the whole
search trained, and the recipe's mask AP.

    python bench/automl_vs_recipe.py                      # 8 trials of 300 steps (ASHA)
    python bench/automl_vs_recipe.py --trials 3 --steps 30 --out /tmp/a.json   # smoke run

Results: bench/results/automl_vs_recipe.json (machine and load recorded; see
bench/machine.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from machine import start_run, write_results

from maskops.automl.search import run_search
from maskops.automl.space import resolve_space
from maskops.automl.study import SearchSettings
from maskops.spec.text import parse_spec_text
from maskops.training import run_training
from maskops_serve.demo import demo_spec_text, prepare_walk_training

RESULTS = Path(__file__).parent / "results" / "automl_vs_recipe.json"
METRIC = "mask_AP"


def recipe_space(steps: int) -> dict[str, dict[str, Any]]:
    """The searched fields around the recipe: its learning rate, warm-up, weight decay,
    anchor scale and sampling sizes (the recipe's small RoI batches keep a step short)."""
    return {
        "init_learning_rate": {"min": 0.005, "max": 0.05, "log": True},
        "warmup_steps": {"min": 0, "max": max(1, steps // 4)},
        "l2_weight_decay": {"min": 1e-5, "max": 1e-3, "log": True},
        "maskrcnn_config.anchor_scale": {"min": 1.5, "max": 4.0},
        "maskrcnn_config.rpn_batch_size_per_im": {"choices": [32, 64, 128]},
        "maskrcnn_config.batch_size_per_im": {"choices": [16, 32, 64]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300, help="steps of one trained model")
    parser.add_argument("--algorithm", default="asha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    conditions = start_run()
    work = Path(tempfile.mkdtemp(prefix="automl_bench_"))
    walk = prepare_walk_training(work, args.steps)
    every = max(1, args.steps // 3)
    text = demo_spec_text(args.steps, shards=work / "shards", val_json=walk.dataset.val_json)
    recipe = parse_spec_text(text).model_copy(update={"num_steps_per_eval": every})

    baseline = run_training(recipe, work / "recipe")
    settings = SearchSettings(
        algorithm=args.algorithm,
        metric=METRIC,
        min_resource=every,
        max_resource=args.steps,
        seed=args.seed,
    )
    result = run_search(
        recipe,
        work / "search",
        resolve_space(recipe_space(args.steps), recipe),
        settings,
        trials=args.trials,
    )
    trials: list[dict[str, Any]] = [vars(t) for t in result.trials]
    best = result.best
    figures = {
        "trials": args.trials,
        "steps_per_model": args.steps,
        "algorithm": args.algorithm,
        "space": recipe_space(args.steps),
        "search_steps_trained": sum(t.steps for t in result.trials),
        "recipe_mask_AP": round(float(baseline.metrics.get(METRIC, 0.0)), 4),
        "best_mask_AP": round(best.value, 4) if best and best.value is not None else None,
        "best_params": best.params if best else None,
        "trial_results": trials,
    }
    print(
        f"recipe mask AP {figures['recipe_mask_AP']}, search best {figures['best_mask_AP']} "
        f"({figures['search_steps_trained']} steps over {args.trials} trials)"
    )
    write_results(args.out, figures, conditions)


if __name__ == "__main__":
    main()
