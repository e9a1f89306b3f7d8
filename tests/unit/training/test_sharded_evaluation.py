"""The evaluation inside a multi-rank training run is sharded and gathered: two real gloo
ranks (tests/unit/training/sharded_eval_ranks.py) evaluate a model on 7 validation images
(4 + 3: the count does not divide) and get the metrics and detections of one process,
also when rank 1's batch-norm statistics differ from rank 0's (as DDP leaves them after a
step); a cancel seen by one rank abandons the evaluation on both, and the run then stops."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from maskops.data.labels import LabelMap
from maskops.evaluation import COCOEvaluator, EvaluationError, TorchPredictor, evaluate_model
from maskops.evaluation.evaluator import EvaluatorState
from maskops.spec.models import ExperimentSpec
from maskops.training.distributed import EvalGroup, RankInfo
from maskops.training.errors import EvaluationAbandoned
from maskops.training.hooks import CancelHook, EvalHook
from maskops.training.periodic_evaluation import coco_eval_fn
from maskops.training.trainer import AmpSettings, Trainer
from tests.unit.training.conftest import SpecFactory
from tests.unit.training.sharded_eval_ranks import run_ranks

IMAGES = 7


def _checkpoint(spec: ExperimentSpec, label_map: LabelMap, path: Path) -> Path:
    from maskops.checkpoints.model_file import save_checkpoint
    from maskops.modeling import build_model

    torch.manual_seed(3)
    model = build_model(
        spec.maskrcnn_config, num_classes=label_map.num_classes, image_size=(128, 128)
    )
    return save_checkpoint(path, model=model, spec=spec, label_map=label_map, step=0)


def _one_process(spec: ExperimentSpec, checkpoint: Path) -> tuple[dict, COCOEvaluator]:
    """The figures of one process: training's evaluation function as rank 0 of 1, and the
    evaluator of ``maskops evaluate``'s loop; one thread, as each rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _evaluate_alone(spec, checkpoint)
    finally:
        torch.set_num_threads(threads)


def _evaluate_alone(spec: ExperimentSpec, checkpoint: Path) -> tuple[dict, COCOEvaluator]:
    from maskops.checkpoints.model_file import load_model
    from maskops.data.pipeline import build_eval_loader

    loaded = load_model(checkpoint)
    info = RankInfo(0, 1, 0, torch.device("cpu"))
    amp = AmpSettings(enabled=False, device_type="cpu")
    metrics = coco_eval_fn(spec, info, amp, loaded.label_map, EvalGroup(None))(loaded.model, 0)
    evaluator = COCOEvaluator(spec.data_config.val_json_file, loaded.label_map)
    loader = build_eval_loader(spec, label_map=loaded.label_map, with_masks=False)
    evaluate_model(TorchPredictor(loaded.model), loader, evaluator)
    return metrics, evaluator


def _by_image(results: list[dict]) -> list[dict]:
    # Stable: each image's detections keep the model's order.
    return sorted(results, key=lambda r: r["image_id"])


def test_two_gloo_ranks_evaluate_each_image_once_with_one_process_metrics(
    spec_factory: SpecFactory, tmp_path: Path
) -> None:
    from maskops.data.manifest import load_label_map

    # One image per batch and one thread: a batch of other images or another thread count
    # moves a box by 1e-5 px (float rounding), and the detections are compared exactly.
    spec = spec_factory(eval_batch_size=1, data_config={"eval_samples": IMAGES})
    label_map = load_label_map(spec.data_config.validation_file_pattern)
    checkpoint = _checkpoint(spec, label_map, tmp_path / "model.pth")
    out = tmp_path / "ranks"
    out.mkdir()
    run_ranks(2, spec, checkpoint, out)
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    metrics, single = _one_process(spec, checkpoint)

    # Disjoint slices of 4 and 3 images covering the 7; rank 0 evaluated all of them once.
    shards = [r["shard"] for r in ranks]
    assert [len(s) for s in shards] == [4, 3]
    assert sorted(shards[0] + shards[1]) == sorted(single.image_ids)
    assert sorted(ranks[0]["gathered_ids"]) == sorted(single.image_ids)
    # The same detections as one process, whichever rank produced them.
    assert single.results and metrics["AP50"] > 0, "nothing detected: the test would be vacuous"
    assert _by_image(ranks[0]["gathered_results"]) == json.loads(
        json.dumps(_by_image(single.results))
    )
    # Every rank has the metrics: the COCO ones and per-class AP exactly one process's; the
    # validation losses (RoI sampling is random, batches differ) only present alike.
    for rank in ranks:
        got = rank["metrics"]
        assert set(got) == set(metrics)
        coco = {k: v for k, v in metrics.items() if not k.startswith("val/")}
        assert {k: got[k] for k in coco} == coco
        assert all(torch.isfinite(torch.tensor(got[k])) for k in got if k.startswith("val/"))
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    # One rank's "no" is every rank's "no".
    assert [r["agreed"] for r in ranks] == [False, False]
    assert [r["abandoned"] for r in ranks] == [True, True]


def test_an_image_in_two_states_is_refused(tiny_spec: ExperimentSpec) -> None:
    from maskops.data.manifest import load_label_map

    label_map = load_label_map(tiny_spec.data_config.validation_file_pattern)
    evaluator = COCOEvaluator(tiny_spec.data_config.val_json_file, label_map)
    with pytest.raises(EvaluationError, match=r"more than once: ids \[5\]"):
        evaluator.load([EvaluatorState([4, 5], []), EvaluatorState([5, 6], [])])


class _Scalar(nn.Module):
    """One parameter: a model cheap enough for the training loop's hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, images: Any, targets: Any) -> dict[str, torch.Tensor]:
        return {"loss": ((self.w - 1.0) ** 2).sum()}


def test_an_evaluation_a_cancel_abandoned_publishes_nothing_and_the_run_stops() -> None:
    """Evaluating every step, a cancel arrives during the evaluation of step 2: that one
    publishes nothing, the run stops before step 3 and does not evaluate again at the end."""
    model = _Scalar()
    trainer = Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data=itertools.repeat(([torch.zeros(1)], [{}])),
        schedule=lambda step: 0.1,
        max_steps=5,
        device=torch.device("cpu"),
        amp=AmpSettings(enabled=False, device_type="cpu"),
    )
    cancel = threading.Event()
    evaluated: list[int] = []

    def evaluate(model: nn.Module, step: int) -> dict[str, float]:
        evaluated.append(step)
        if step == 2:
            cancel.set()
        if cancel.is_set():
            raise EvaluationAbandoned()
        return {"metric": float(step)}

    eval_hook = EvalHook(1, evaluate, agree=EvalGroup(None).all_agree)
    trainer.register_hooks([eval_hook, CancelHook(cancel.is_set)])
    trainer.train()
    assert (trainer.iter, trainer.cancelled, evaluated) == (2, True, [1, 2])
    assert eval_hook.last_eval_step == 1
    assert trainer.latest_metrics == {"metric": 1.0}
