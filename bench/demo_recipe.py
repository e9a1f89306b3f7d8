"""How fast the demo walk's recipe learns: mask AP against steps and minutes of training.

Trains exactly what ``maskops serve --demo`` trains (the walk's dataset, layout and spec,
from ``maskops_serve.demo``) in this process, evaluating every ``--eval-every`` steps, and
records each evaluation's box/mask AP with the training minutes spent to reach it (the
evaluations' own time left out: it is estimated per step from the steps without one).
Then it runs the trained model on every validation image as the walk's ``/infer`` does and
counts the shapes it labels twice (two listed detections of different classes on one
shape), naming what the walk's picture shows.

    python bench/demo_recipe.py                   # the walk's steps, about 5 min idle
    python bench/demo_recipe.py --steps 40 --eval-every 20 --out /tmp/r.json   # smoke run

Results: bench/results/demo_recipe.json (machine and load recorded; see bench/machine.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import start_run, write_results

from maskops.evaluation.inference import run_inference
from maskops.training import run_training
from maskops.training.trainer import HookBase
from maskops_serve.demo import (
    DEMO_STEPS,
    WalkTraining,
    describe_detections,
    labelled_twice,
    prepare_walk_training,
    walk_picture,
)

RESULTS = Path(__file__).parent / "results" / "demo_recipe.json"


class StepTimes(HookBase):
    """Wall time of every step (whatever other hooks do after it, evaluation included)."""

    def __init__(self) -> None:
        self.durations: dict[int, float] = {}
        self._start = 0.0

    def before_step(self) -> None:
        self._start = time.perf_counter()

    def after_step(self) -> None:
        self.durations[self.trainer.iter] = time.perf_counter() - self._start


def training_minutes(durations: dict[int, float], eval_steps: set[int]) -> dict[int, float]:
    """Minutes of training up to each step: an evaluating step counts as a median step."""
    plain = [d for step, d in durations.items() if step not in eval_steps]
    typical = statistics.median(plain) if plain else 0.0
    elapsed, minutes = 0.0, {}
    for step in sorted(durations):
        elapsed += typical if step in eval_steps else durations[step]
        minutes[step] = elapsed / 60
    return minutes


def curve(results_dir: Path, durations: dict[int, float]) -> list[dict[str, Any]]:
    """One point per evaluation: step, training minutes, box AP, mask AP."""
    evaluations = [
        record
        for line in (results_dir / "metrics.jsonl").read_text().splitlines()
        if "mask_AP" in (record := json.loads(line))
    ]
    minutes = training_minutes(durations, {int(r["step"]) for r in evaluations})
    return [
        {
            "step": int(r["step"]),
            "train_minutes": round(minutes[int(r["step"])], 2),
            "AP": round(float(r["AP"]), 4),
            "mask_AP": round(float(r["mask_AP"]), 4),
        }
        for r in evaluations
    ]


def shapes_labelled_twice(walk: WalkTraining, checkpoint: Path, work: Path) -> dict[str, Any]:
    """The trained model's detections on every validation image, as the walk lists them:
    how many shapes got two labels (``labelled_twice``) and what the picture shows."""
    labels = work / "labels"
    images = walk.dataset.val_images
    run_inference(walk.spec, checkpoint, images, work / "drawn", label_dir=labels, progress=False)
    categories = json.loads(walk.dataset.val_json.read_text())["categories"]
    category_names = {c["id"]: c["name"] for c in categories}

    def detections(stem: str) -> list[dict[str, Any]]:
        """As /infer answers: each detection with its category's name."""
        found = json.loads((labels / f"{stem}.json").read_text())
        return [{**d, "category_name": category_names[d["category_id"]]} for d in found]

    names = sorted(path.stem for path in images.glob("*.jpg"))
    twice = {name: pairs for name in names if (pairs := labelled_twice(detections(name)))}
    picture = walk_picture(images)
    return {
        "images": len(names),
        "labelled_twice": sum(len(pairs) for pairs in twice.values()),
        "labelled_twice_on": twice,
        "picture": f"{picture.name}: {describe_detections(detections(picture.stem))}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEMO_STEPS)
    parser.add_argument("--eval-every", type=int, default=DEMO_STEPS // 6)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--seed", type=int, default=None, help="the spec's seed instead of the walk's (spread)"
    )
    args = parser.parse_args()
    conditions = start_run()
    work = Path(tempfile.mkdtemp(prefix="demo_recipe_"))
    walk = prepare_walk_training(work, args.steps)
    spec = walk.spec.model_copy(update={"num_steps_per_eval": args.eval_every})
    if args.seed is not None:
        spec = spec.model_copy(update={"seed": args.seed})
    times = StepTimes()
    result = run_training(spec, work / "run", extra_hooks=[times])
    points = curve(work / "run", times.durations)
    for point in points:
        print(
            f"step {point['step']:4d}  {point['train_minutes']:5.2f} min  "
            f"box AP {point['AP']:.3f}  mask AP {point['mask_AP']:.3f}"
        )
    assert result.checkpoint is not None
    twice = shapes_labelled_twice(walk, result.checkpoint, work)
    print(f"{twice['labelled_twice']} shapes labelled twice; {twice['picture']}")
    figures = {"steps": args.steps, "eval_every": args.eval_every, "seed": spec.seed}
    figures |= {"curve": points, **twice}
    write_results(args.out, figures, conditions)


if __name__ == "__main__":
    main()
