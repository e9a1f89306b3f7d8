"""Benchmark: structured pruning of Mask R-CNN (resnet18 / resnet50) at thresholds 0.1..0.7.

For each backbone, the unpruned model is the baseline measured in the same run; each
pruned model reports parameters, multiply-accumulates (backbone + FPN + RPN head at
``--image-size``, plus the RoI heads per RoI), CPU latency (the dense part, and the whole
eval forward on one image with exactly test_detections_per_image detections), each
as a ratio to the baseline. Latencies of baseline and pruned model are timed alternately.

Weights. Pruning decisions depend on how filter norms spread within each layer. Random
initial weights have nearly equal norms (everything scores ~0.9..1 with ``-n max``, so no
threshold under 0.9 removes anything), which says nothing about a trained model. By
default every prunable filter is therefore scaled by a factor drawn from U(0, 1) (seeded):
a synthetic, documented spread under which a threshold t removes about a fraction t of a
single conv's filters. ``--checkpoint PATH`` prunes real weights instead (a maskops
checkpoint, or torchvision/ImageNet weights loaded through maskops.checkpoints.pretrained).

``--retrain`` (slow, minutes to hours on a CPU) adds the quality column: on the demo shapes
data it trains the unpruned model ``--train-steps`` steps, prunes that checkpoint at each
threshold, retrains every pruned model and the unpruned one ``--retrain-steps`` more steps
(regularisers off: the rows compare pruning alone) and reports mask AP of each, with the
goal line: >= 40% fewer MACs for <= 2 points of mask AP. Every column is then measured on
that trained base's weights (``--checkpoint`` does not apply).

``--target-macs F`` (with ``--retrain``) adds, per arch, the row the README's recipe would
prune at: after training the base, the smallest ``-pth`` (in steps of
``--threshold-resolution``, by bisection) whose pruned model keeps at most a fraction F of
the MACs. The threshold is thus chosen before any retraining, by the bench itself.
``--thresholds`` defaults to none with it.

``--norm`` and ``--equalization`` take several values: every combination (a criterion)
gets its own rows, pruned from the same base and compared with the same unpruned row, so
that criteria are compared at equal MACs with ``--target-macs``.

``--seeds N`` retrains every row N times (seeds differ in data order and the heads'
sampling) and reports the mean mask AP, with each seed's in the JSON. Seed k of every row
runs before seed k+1 of any, each printed as it ends, so a run stopped early leaves paired
seeds in its log. ``--first-seed K`` numbers them from K, to add seeds to an earlier run's
measurement of the same base (``--base-checkpoint``).

``--base-checkpoint PATH`` (one arch) starts from the base an earlier run trained, found
in the work dir that run printed first (``/tmp/bench_prune_*/resnetN/base``), so that
retraining recipes can be compared on one base without training it again.
``--unpruned-from RESULTS.json`` takes the unpruned row's per-seed mask AP from an earlier
run on the same base instead of retraining it (it checks that the base evaluates the same and
that the recipe and seeds match), so that another criterion or ``--excluded-layers`` costs
only its own retraining. The base is the ``--base-checkpoint``, or one this run trains
again with the earlier run's ``--train-steps``: training is deterministic on one kind of
CPU, which the base check confirms (a new machine loses /tmp, not the results JSON).

``--heads small`` swaps TAO's heads (512 RoIs per image through the 4-conv mask head,
which make a CPU step take seconds) for the small ones of the tests' trained fixture, so
that the quality column can be measured on a CPU in about half an hour.

    .venv/bin/python bench/bench_prune.py                      # a few minutes
    .venv/bin/python bench/bench_prune.py --archs 18 --retrain --train-steps 300
    .venv/bin/python bench/bench_prune.py --archs 18 --heads small --image-size 128 128 \
        --retrain --train-steps 800 --retrain-steps 200 --demo-images 160  # CPU, ~30 min
    # The pruning recipe (README): a plainly trained base, the threshold that leaves 0.6 of
    # its MACs, retrained as long as it trained; 40-50 minutes on 2 CPU cores per arch.
    .venv/bin/python bench/bench_prune.py --archs 50 --heads small --image-size 128 128 \
        --target-macs 0.6 --threshold-resolution 0.01 --retrain --train-steps 800 \
        --retrain-steps 800 --seeds 3 --demo-images 160 --freeze-bn \
        --out bench/results/bench_prune_small_r50.json
    # Two -eq criteria at equal MACs, on a resnet50 base trained twice as long (~100 min).
    .venv/bin/python bench/bench_prune.py --archs 50 --heads small --image-size 128 128 \
        --target-macs 0.6 --equalization union arithmetic_mean --retrain --train-steps 1600 \
        --retrain-steps 800 --seeds 3 --demo-images 160 --freeze-bn \
        --out bench/results/bench_prune_small_r50_base1600.json
    # Another retraining recipe on a base an earlier run trained (its work dir is printed
    # first): here 1200 retraining steps, ~30 min per seed of both rows on 2 cores.
    .venv/bin/python bench/bench_prune.py --archs 50 --heads small --image-size 128 128 \
        --target-macs 0.6 --retrain --train-steps 1600 --retrain-steps 1200 --seeds 2 \
        --base-checkpoint /tmp/bench_prune_XXXX/resnet50/base/model.step-1600.pth \
        --demo-images 160 --freeze-bn --out bench/results/bench_prune_small_r50_retrain1200.json
    # Another criterion on that base, against the unpruned row measured there (~15 min a seed).
    .venv/bin/python bench/bench_prune.py --archs 50 --heads small --image-size 128 128 \
        --target-macs 0.6 --excluded-layers rpn.head.conv --retrain --train-steps 1600 \
        --retrain-steps 1200 --seeds 2 --demo-images 160 --freeze-bn \
        --base-checkpoint /tmp/bench_prune_XXXX/resnet50/base/model.step-1600.pth \
        --unpruned-from bench/results/bench_prune_small_r50_retrain1200.json --out OUT.json
    # The resnet50 recipe that meets the goal (README): a converged base (3200 steps, ~35 min
    # on 2 cores), -nf 64 keeping the stem and the first stage's 64-filter convs whole and
    # -el keeping the RPN head's conv (~80 min in all).
    .venv/bin/python bench/bench_prune.py --archs 50 --heads small --image-size 128 128 \
        --target-macs 0.6 --excluded-layers rpn.head.conv --min-filters 64 --retrain \
        --train-steps 3200 --retrain-steps 1200 --seeds 2 --demo-images 160 --freeze-bn \
        --out OUT.json
    # The L1 sparsity recipe, with a reference row: the unpruned model trained as many steps
    # without the penalty (about 45 minutes). bench_prune_small_l1.json was measured with
    # --l1-weight-decay 1e-3 when maskops' penalty was l1_weight_decay * sum(|w|); TAO's
    # l1_weight_decay / 2 * sum(|w|), which maskops now uses, needs 2e-3 for the same.
    .venv/bin/python bench/bench_prune.py --archs 18 --heads small --image-size 128 128 \
        --thresholds 0.5 0.7 --retrain --train-steps 800 --retrain-steps 800 --seeds 2 \
        --demo-images 160 --freeze-bn --l1-weight-decay 2e-3 --l1-weight-decay-layers prunable \
        --out bench/results/bench_prune_small_l1.json

Figures go to ``bench/results/bench_prune.json`` (``bench_prune_small.json`` with
``--heads small``), or to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from machine import start_run, write_results
from timing import alternated_seconds
from torch import nn

from maskops.checkpoints.pretrained import load_weights_into
from maskops.modeling import build_model, prunable_convs
from maskops.prune import prune_model
from maskops.prune.cost import count_parameters, macs, output_positions
from maskops.prune.importance import EQUALIZATIONS, NORMS
from maskops.prune.report import PruneReport
from maskops.prune.run import MODEL_FILENAME, run_prune, trace_input
from maskops.spec.models import (
    L1_WEIGHT_DECAY_LAYERS,
    DataConfig,
    ExperimentSpec,
    MaskRCNNConfig,
)

RESULTS = Path(__file__).resolve().parent / "results" / "bench_prune.json"
# maskrcnn_config overrides: TAO's defaults, or the heads of tests/conftest.py's trained
# fixture (mask AP about 0.2 after 800 CPU steps at 128x128).
HEADS: dict[str, dict[str, Any]] = {
    "tao": {},
    "small": {
        "min_level": 3,
        "max_level": 5,
        "anchor_scale": 2.0,
        "rpn_batch_size_per_im": 64,
        "batch_size_per_im": 64,
        "fast_rcnn_mlp_head_dim": 256,
        "train_rpn_pre_nms_topn": 400,
        "train_rpn_post_nms_topn": 200,
        "test_rpn_pre_nms_topn": 200,
        "test_rpn_post_nms_topn": 100,
        "test_detections_per_image": 50,
        "gt_mask_size": 28,
        "mrcnn_resolution": 16,
    },
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", type=int, nargs="+", default=[18, 50])
    parser.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=None,
        help="-pth values to prune at (default 0.1 0.3 0.5 0.7, or none with --target-macs)",
    )
    parser.add_argument(
        "--target-macs",
        type=float,
        default=None,
        help="with --retrain: also prune each arch at the smallest -pth that leaves at most "
        "this fraction of its trained base's MACs (0.6 for the goal's 40%% fewer)",
    )
    parser.add_argument(
        "--threshold-resolution",
        type=float,
        default=0.001,
        help="step of the --target-macs search (-n L2 scores are about 1/sqrt(channels), so "
        "its thresholds are a few hundredths)",
    )
    parser.add_argument("--image-size", type=int, nargs=2, default=[256, 256], metavar=("H", "W"))
    parser.add_argument("--norm", nargs="+", choices=NORMS, default=["max"])
    parser.add_argument("--equalization", nargs="+", choices=EQUALIZATIONS, default=["union"])
    parser.add_argument("--granularity", type=int, default=8)
    parser.add_argument("--min-filters", type=int, default=16)
    parser.add_argument(
        "--excluded-layers",
        nargs="+",
        default=[],
        metavar="LAYER",
        help="never pruned (-el: module names or prefixes, e.g. rpn.head.conv)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each model, interleaved (median)"
    )
    parser.add_argument("--checkpoint", type=Path, default=None, help="real weights to prune")
    parser.add_argument("--retrain", action="store_true", help="also mask AP after retraining")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument(
        "--base-checkpoint",
        type=Path,
        default=None,
        help="with --retrain and one arch: the base an earlier run of this bench trained "
        "(its work dir's resnetN/base/model.step-S.pth, same --heads, --image-size, "
        "--demo-images, --freeze-bn) instead of training one; it is evaluated again and "
        "--train-steps should say how long it trained (it is only recorded)",
    )
    parser.add_argument("--retrain-steps", type=int, default=100)
    parser.add_argument(
        "--unpruned-from",
        type=Path,
        default=None,
        help="take the unpruned row's retrained mask AP per seed from an earlier run's "
        "results JSON on the same base (--base-checkpoint, or a base this run trains again "
        "with the same --train-steps: training is deterministic on one kind of CPU; checked: "
        "same base metrics, retraining and data settings, and seeds) instead of retraining it",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="retrain every row with this many seeds and report the mean mask AP (a small "
        "validation set moves a couple of points between seeds)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="retrain with seeds first..first+N-1: with --base-checkpoint, adds seeds to an "
        "earlier run's measurement of the same base",
    )
    parser.add_argument("--demo-images", type=int, default=200)
    parser.add_argument(
        "--l1-weight-decay",
        type=float,
        default=0.0,
        help="L1 penalty on kernels while training the base (sparsifies filters for pruning)",
    )
    parser.add_argument(
        "--l1-weight-decay-layers",
        choices=L1_WEIGHT_DECAY_LAYERS,
        default="all",
        help="kernels the L1 penalty applies to (the spec's l1_weight_decay_layers)",
    )
    parser.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --l1-weight-decay, also train the unpruned model as many steps without the "
        "L1 penalty, to show what the sparsity training cost (one more full-length run)",
    )
    parser.add_argument(
        "--use-amp", action="store_true", help="train with use_amp (bf16 on capable CPUs)"
    )
    parser.add_argument(
        "--freeze-bn",
        action="store_true",
        help="train with freeze_bn (as TAO does): filter norms then measure what a filter adds",
    )
    parser.add_argument(
        "--heads", choices=sorted(HEADS), default="tao", help="RoI/RPN head sizes (see above)"
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON (see above)")
    args = parser.parse_args()
    if args.retrain and args.checkpoint is not None:
        parser.error("--retrain prunes the base it trains: drop --checkpoint")
    if args.base_checkpoint is not None and not (args.retrain and len(args.archs) == 1):
        parser.error("--base-checkpoint replaces the one base --retrain trains: one --archs")
    if args.target_macs is not None and not args.retrain:
        parser.error("--target-macs chooses thresholds on trained weights: it needs --retrain")
    if args.thresholds is None:
        args.thresholds = [] if args.target_macs is not None else [0.1, 0.3, 0.5, 0.7]
    args.image_size = (args.image_size[0], args.image_size[1])
    return args


class Criterion(NamedTuple):
    """How filters are scored: ``-n`` and ``-eq``."""

    norm: str
    equalization: str

    def __str__(self) -> str:
        return f"{self.norm}/{self.equalization}"


class Setting(NamedTuple):
    """One pruned row: a criterion and its ``-pth``."""

    criterion: Criterion
    threshold: float


def criteria(args: argparse.Namespace) -> list[Criterion]:
    return [Criterion(n, eq) for n, eq in itertools.product(args.norm, args.equalization)]


def prune_options(args: argparse.Namespace, criterion: Criterion) -> dict[str, Any]:
    """The ``maskops prune`` options of a row, all but the threshold."""
    return {
        "norm": criterion.norm,
        "equalization": criterion.equalization,
        "granularity": args.granularity,
        "min_filters": args.min_filters,
        "excluded_layers": args.excluded_layers,
    }


def spread_filter_norms(model: nn.Module, *, seed: int) -> None:
    """Scale every prunable conv filter by U(0, 1): the synthetic importance spread."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for conv in prunable_convs(model).values():
            conv.weight.mul_(torch.rand(conv.out_channels, 1, 1, 1, generator=generator))


def workload(
    model: nn.Module, image_size: tuple[int, int]
) -> tuple[dict[str, int], dict[str, Callable[[], None]]]:
    """(params and MACs, {"dense": fn, "full": fn}) of a model on one random image."""
    model.eval()
    # Every model then returns exactly test_detections_per_image detections: the same RoI
    # workload, whatever random or pruned weights score.
    roi_heads = cast(Any, model.roi_heads)
    roi_heads.score_thresh = 0.0
    backbone, rpn_head = cast(nn.Module, model.backbone), cast(Any, model.rpn).head
    image = torch.rand(3, *image_size, generator=torch.Generator().manual_seed(0))
    dense_positions, roi_positions = output_positions(model, image_size)

    @torch.inference_mode()
    def dense() -> None:
        features = backbone(image[None])
        rpn_head(list(features.values()))

    @torch.inference_mode()
    def full() -> None:
        model([image])

    figures = {
        "params": count_parameters(model),
        "macs": macs(model, dense_positions),
        "roi_macs": macs(model, roi_positions),
    }
    return figures, {"dense": dense, "full": full}


def model_config(nlayers: int, args: argparse.Namespace) -> MaskRCNNConfig:
    return MaskRCNNConfig(nlayers=nlayers, freeze_bn=args.freeze_bn, **HEADS[args.heads])


def base_model(nlayers: int, args: argparse.Namespace, checkpoint: Path | None) -> nn.Module:
    """The unpruned model: ``checkpoint``'s weights, or the synthetic spread without one."""
    torch.manual_seed(0)
    model = build_model(model_config(nlayers, args), num_classes=4, image_size=args.image_size)
    if checkpoint is None:
        spread_filter_norms(model, seed=nlayers)
    else:
        report = load_weights_into(model, checkpoint)
        # Heads of other sizes may keep their initial values (they are not pruned, and the
        # timed forward always keeps test_detections_per_image detections); prunable convs
        # may not, or random filters would be pruned.
        prunable = set(prunable_convs(model))
        misfits = [key for key, *_ in report.shape_mismatch if key.rsplit(".", 1)[0] in prunable]
        if misfits:
            raise SystemExit(
                f"{checkpoint}: {len(misfits)} prunable conv kernels of other shapes, "
                f"e.g. {misfits[:3]} (another nlayers or spec?)"
            )
    return model


def sweep(
    args: argparse.Namespace,
    settings: dict[int, list[Setting]],
    checkpoints: dict[int, Path | None],
) -> list[dict[str, Any]]:
    """Rows of params, MACs and latency: each arch's baseline, then each of its settings."""
    image_size = args.image_size
    rows = []
    for nlayers, arch_settings in settings.items():
        arch = f"resnet{nlayers}"
        checkpoint = checkpoints[nlayers]
        base_figures, base_fns = workload(base_model(nlayers, args, checkpoint), image_size)
        base_row: dict[str, Any] = {"arch": arch, "threshold": 0.0, **base_figures}
        base_times: dict[str, list[float]] = {"dense": [], "full": []}
        rows.append(base_row)
        for criterion, threshold in arch_settings:
            model = base_model(nlayers, args, checkpoint)
            prune_model(
                model,
                example_inputs=trace_input(model_config(nlayers, args)),
                threshold=threshold,
                **prune_options(args, criterion),
            )
            figures, fns = workload(model, image_size)
            row: dict[str, Any] = {
                "arch": arch,
                "norm": criterion.norm,
                "equalization": criterion.equalization,
                "threshold": threshold,
                **figures,
            }
            for key, value in figures.items():
                row[f"{key}_ratio"] = value / base_figures[key]
            for part in ("dense", "full"):
                base, pruned = alternated_seconds([base_fns[part], fns[part]], args.repeats)
                base_times[part].append(base.median)
                row[f"{part}_latency_s"] = pruned.median
                row[f"{part}_latency_s_range"] = [min(pruned.values), max(pruned.values)]
                row[f"{part}_latency_s_ratio"] = pruned.median / base.median
            rows.append(row)
            print_row(row)
        for part, values in base_times.items():
            base_row[f"{part}_latency_s"] = statistics.median(values) if values else float("nan")
    return rows


class QualityBench:
    """The ``--retrain`` column: see the module docstring.

    Bases are trained first (:meth:`train_base`) so that ``--target-macs`` can choose each
    arch's threshold on its trained weights before the sweep; :meth:`retrain` then adds
    ``mask_AP`` (and box ``AP``) to that arch's rows.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        from maskops.data.convert import convert_dataset
        from maskops.data.demo import generate_demo_dataset

        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="bench_prune_"))
        print(f"work dir {self.work} (bases, pruned models, retraining runs)", flush=True)
        self.demo = generate_demo_dataset(
            self.work / "demo", num_images=args.demo_images, image_size=args.image_size, seed=0
        )
        self.shards = self.work / "shards"
        convert_dataset(self.demo.train_images, self.demo.train_json, self.shards)
        convert_dataset(self.demo.val_images, self.demo.val_json, self.shards)
        self.base_metrics: dict[str, dict[str, float]] = {}
        # Checked now, before minutes of base evaluation and threshold search; the base
        # metrics are compared when the base has been evaluated.
        self.unpruned_from = (
            earlier_unpruned_metrics(args, json.loads(args.unpruned_from.read_text()))
            if args.unpruned_from
            else None
        )

    def spec(self, nlayers: int, steps: int, **fields: Any) -> ExperimentSpec:
        args = self.args
        return ExperimentSpec(
            use_amp=args.use_amp,
            total_steps=steps,
            train_batch_size=4,
            eval_batch_size=8,
            init_learning_rate=0.01,
            warmup_steps=min(50, steps // 4),
            learning_rate_steps=[int(steps * 0.8)],
            learning_rate_decay_levels=[0.1],
            data_config=DataConfig(
                image_size=args.image_size,
                training_file_pattern=f"{self.shards}/train*",
                validation_file_pattern=f"{self.shards}/val*",
                val_json_file=str(self.demo.val_json),
                num_classes=4,
                n_workers=2,
            ),
            maskrcnn_config=model_config(nlayers, args),
            **fields,
        )

    @staticmethod
    def evaluate(run_spec: ExperimentSpec, checkpoint: Path) -> dict[str, float]:
        """``checkpoint``'s COCO metrics on ``run_spec``'s validation data, quietly."""
        from maskops.evaluation.runner import run_evaluation

        return run_evaluation(run_spec, checkpoint, progress=False, log=lambda _line: None)

    @classmethod
    def train_and_evaluate(
        cls, run_spec: ExperimentSpec, run_dir: Path
    ) -> tuple[Path, dict[str, float]]:
        """Trains ``run_spec`` into ``run_dir``: the final checkpoint and its metrics."""
        from maskops.training.train import run_training

        checkpoint = run_training(run_spec, run_dir).checkpoint
        assert checkpoint is not None
        return checkpoint, cls.evaluate(run_spec, checkpoint)

    def train_base(self, nlayers: int) -> Path:
        """Trains the base of ``resnet{nlayers}``; its AP and mask AP go to ``base_metrics``.

        With ``--base-checkpoint`` that checkpoint is the base: evaluated, not trained.
        """
        base_spec = self.spec(
            nlayers,
            self.args.train_steps,
            l1_weight_decay=self.args.l1_weight_decay,
            l1_weight_decay_layers=self.args.l1_weight_decay_layers,
        )
        if self.args.base_checkpoint is not None:
            checkpoint = self.args.base_checkpoint
            metrics = self.evaluate(base_spec, checkpoint)
        else:
            checkpoint, metrics = self.train_and_evaluate(
                base_spec, self.work / f"resnet{nlayers}" / "base"
            )
        self.base_metrics[f"resnet{nlayers}"] = {k: metrics[k] for k in ("AP", "mask_AP")}
        print(f"resnet{nlayers} base: mask AP {metrics['mask_AP']:.3f}", flush=True)
        return checkpoint

    def prune(self, trained: Path, setting: Setting, out_dir: Path) -> PruneReport:
        return run_prune(
            trained,
            out_dir,
            threshold=setting.threshold,
            **prune_options(self.args, setting.criterion),
        )

    def threshold_for_macs(
        self, trained: Path, criterion: Criterion, target: float
    ) -> tuple[float, dict[str, float]]:
        """The smallest threshold (in resolution steps) leaving at most ``target`` of the MACs.

        Bisection: raising the threshold only ever removes more filters. Returns the
        threshold and the MACs ratio of every threshold tried.
        """
        scratch = self.work / "threshold_search"
        resolution = self.args.threshold_resolution
        steps = round(1 / resolution)
        decimals = max(0, -int(Decimal(str(resolution)).as_tuple().exponent))
        tried: dict[str, float] = {}

        def macs_ratio(step: int) -> float:
            threshold = round(step / steps, decimals)
            report = self.prune(trained, Setting(criterion, threshold), scratch)
            print(f"  -pth {threshold:.{decimals}f}: MACs {report.macs_ratio:.3f}", flush=True)
            tried[f"{threshold:.{decimals}f}"] = report.macs_ratio
            return report.macs_ratio

        low, high = 0, steps
        if macs_ratio(high) > target:
            raise SystemExit(f"{trained}: even -pth 1 leaves more than {target} of the MACs")
        while high - low > 1:
            middle = (low + high) // 2
            if macs_ratio(middle) <= target:
                high = middle
            else:
                low = middle
        return round(high / steps, decimals), tried

    def retrain(self, nlayers: int, trained: Path, rows: list[dict[str, Any]]) -> None:
        """Retrains every row of ``resnet{nlayers}`` from ``trained`` and adds its mask AP."""
        args = self.args
        arch = f"resnet{nlayers}"
        # Retraining with the regularisers off (the spec's pruned_model_path keeps them on,
        # as TAO does): the rows compare pruning alone.
        no_reg = {"l2_weight_decay": 0.0, "l1_weight_decay": 0.0}
        arch_rows = [r for r in rows if r["arch"] == arch]
        runs: list[tuple[Path, ExperimentSpec]] = []
        for row in arch_rows:
            threshold = row["threshold"]
            if threshold == 0.0:
                run_dir = self.work / arch / "unpruned"
                retrain_spec = self.spec(
                    nlayers, args.retrain_steps, checkpoint=str(trained), **no_reg
                )
            else:
                criterion = Criterion(row["norm"], row["equalization"])
                run_dir = self.work / arch / f"{criterion.norm}_{criterion.equalization}"
                run_dir = run_dir / f"pth{threshold}"
                self.prune(trained, Setting(criterion, threshold), run_dir / "pruned")
                retrain_spec = self.spec(
                    nlayers,
                    args.retrain_steps,
                    pruned_model_path=str(run_dir / "pruned" / MODEL_FILENAME),
                    **no_reg,
                )
            runs.append((run_dir, retrain_spec))
        per_seed: list[list[dict[str, float]]] = [[] for _ in arch_rows]
        reused = self.reused_unpruned_metrics(arch)
        # Seeds outermost: a run cut short (each retraining is minutes to hours) has still
        # retrained every row with the same seeds, and its log pairs them.
        for k in range(args.first_seed, args.first_seed + args.seeds):
            for row, (run_dir, retrain_spec), measured in zip(
                arch_rows, runs, per_seed, strict=True
            ):
                if reused is not None and row["threshold"] == 0.0:
                    metrics, source = reused[k], f" (from {args.unpruned_from})"
                else:
                    _, metrics = self.train_and_evaluate(
                        retrain_spec.model_copy(update={"seed": retrain_spec.seed + k}),
                        run_dir / f"retrain_seed{k}",
                    )
                    source = ""
                print(
                    f"{arch} {row_criterion(row)} pth={row['threshold']} seed {k}: "
                    f"mask AP {metrics['mask_AP']:.3f}  AP {metrics['AP']:.3f}{source}",
                    flush=True,
                )
                measured.append(metrics)
        for row, measured in zip(arch_rows, per_seed, strict=True):
            for key in ("AP", "mask_AP"):
                row[f"{key}_per_seed"] = [m[key] for m in measured]
                row[key] = statistics.mean(row[f"{key}_per_seed"])
        base_row = next(r for r in arch_rows if r["threshold"] == 0)
        if args.l1_weight_decay > 0 and args.reference:
            # What the sparsity training itself cost: the same total steps without L1.
            reference_spec = self.spec(nlayers, args.train_steps + args.retrain_steps)
            base_row["reference_mask_AP"] = self.train_and_evaluate(
                reference_spec, self.work / arch / "reference"
            )[1]["mask_AP"]
        for row in (r for r in arch_rows if r["threshold"] > 0):
            row["mask_AP_drop_points"] = 100 * (base_row["mask_AP"] - row["mask_AP"])
            row["meets_goal"] = row["macs_ratio"] <= 0.6 and row["mask_AP_drop_points"] <= 2.0

    def reused_unpruned_metrics(self, arch: str) -> dict[int, dict[str, float]] | None:
        """``--unpruned-from``: the earlier run's unpruned metrics of ``arch`` by seed.

        Refuses (exits) unless that run retrained the same base: its re-evaluated metrics
        are equal (evaluation is deterministic).
        """
        if self.unpruned_from is None:
            return None
        theirs, ours = self.unpruned_from.base_metrics.get(arch), self.base_metrics[arch]
        if theirs != ours:
            raise SystemExit(
                f"--unpruned-from {self.args.unpruned_from}: base metrics {theirs} there, "
                f"{ours} here"
            )
        return self.unpruned_from.by_arch[arch]


class EarlierUnpruned(NamedTuple):
    """What ``--unpruned-from`` reuses: per arch, the base metrics and unpruned AP by seed."""

    base_metrics: dict[str, dict[str, float]]
    by_arch: dict[str, dict[int, dict[str, float]]]


def earlier_unpruned_metrics(args: argparse.Namespace, earlier: dict[str, Any]) -> EarlierUnpruned:
    """The unpruned rows of an earlier run's results, by arch and seed.

    Refuses (exits) unless that run used the same recipe and data and covers every seed
    this run retrains.
    """
    source, retraining = args.unpruned_from, earlier.get("retraining") or {}
    same = {
        "--retrain-steps": (retraining.get("retrain_steps"), args.retrain_steps),
        "--demo-images": (retraining.get("demo_images"), args.demo_images),
        "--freeze-bn": (retraining.get("freeze_bn"), args.freeze_bn),
        "--use-amp": (retraining.get("use_amp"), args.use_amp),
        "--heads": (earlier.get("heads"), args.heads),
        "--image-size": (earlier.get("image_size"), list(args.image_size)),
    }
    for what, (theirs, ours) in same.items():
        if theirs != ours:
            raise SystemExit(f"--unpruned-from {source}: {what} {theirs} there, {ours} here")
    first = retraining["first_seed"]
    wanted = range(args.first_seed, args.first_seed + args.seeds)
    by_arch: dict[str, dict[int, dict[str, float]]] = {}
    for nlayers in args.archs:
        arch = f"resnet{nlayers}"
        row = next((r for r in earlier["rows"] if r["arch"] == arch and r["threshold"] == 0), None)
        if row is None or "mask_AP_per_seed" not in row:
            raise SystemExit(f"--unpruned-from {source}: no retrained unpruned {arch} there")
        by_seed = {
            first + i: {"AP": ap, "mask_AP": mask_ap}
            for i, (ap, mask_ap) in enumerate(
                zip(row["AP_per_seed"], row["mask_AP_per_seed"], strict=True)
            )
        }
        if missing := [k for k in wanted if k not in by_seed]:
            raise SystemExit(f"--unpruned-from {source}: no seed {missing} of {arch} there")
        by_arch[arch] = by_seed
    return EarlierUnpruned(retraining.get("base_metrics", {}), by_arch)


def print_row(row: dict[str, Any]) -> None:
    ratios = (
        f"  params {row['params_ratio']:.2f}x  MACs {row['macs_ratio']:.2f}x"
        f"  dense latency {row['dense_latency_s_ratio']:.2f}x"
        f"  full latency {row['full_latency_s_ratio']:.2f}x"
        if "params_ratio" in row
        else "  (baseline)"
    )
    print(f"{row['arch']} {row_criterion(row)} pth={row['threshold']}:{ratios}", flush=True)


def row_criterion(row: dict[str, Any]) -> str:
    return str(Criterion(row["norm"], row["equalization"])) if "norm" in row else "-"


def format_table(rows: list[dict[str, Any]], image_size: tuple[int, int]) -> str:
    header = (
        f"{'arch':<9} {'-n/-eq':<20} {'pth':>6} {'params M':>9} {'ratio':>6} "
        f"{'GMACs':>7} {'ratio':>6} {'RoI MMACs':>9} {'dense ms':>9} {'ratio':>6} "
        f"{'full ms':>8} {'ratio':>6} "
        f"{'mask AP':>8} {'AP change':>9}"
    )
    lines = [f"MACs and latency at {image_size[0]}x{image_size[1]}, CPU, batch 1", header]
    for row in rows:
        ap = f"{row['mask_AP']:.3f}" if "mask_AP" in row else "-"
        drop = f"{-row['mask_AP_drop_points']:+.1f}" if "mask_AP_drop_points" in row else "-"
        lines.append(
            f"{row['arch']:<9} {row_criterion(row):<20} {row['threshold']:>6.3f} "
            f"{row['params'] / 1e6:>9.2f} "
            f"{row.get('params_ratio', 1.0):>6.2f} {row['macs'] / 1e9:>7.2f} "
            f"{row.get('macs_ratio', 1.0):>6.2f} {row['roi_macs'] / 1e6:>9.1f} "
            f"{row['dense_latency_s'] * 1e3:>9.0f} {row.get('dense_latency_s_ratio', 1.0):>6.2f} "
            f"{row['full_latency_s'] * 1e3:>8.0f} {row.get('full_latency_s_ratio', 1.0):>6.2f} "
            f"{ap:>8} {drop:>9}"
        )
    for row in rows:
        if "reference_mask_AP" in row:
            lines.append(
                f"{row['arch']}: mask AP {row['reference_mask_AP']:.3f} unpruned, trained as "
                "long without the L1 penalty (what the sparsity training cost)"
            )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    conditions = start_run()
    print(f"machine {json.dumps(conditions.machine)}", flush=True)
    quality = QualityBench(args) if args.retrain else None
    trained = {nlayers: quality.train_base(nlayers) for nlayers in args.archs} if quality else {}
    settings = {
        nlayers: [Setting(c, t) for c in criteria(args) for t in args.thresholds]
        for nlayers in args.archs
    }
    searches: dict[str, dict[str, float]] = {}
    if quality is not None and args.target_macs is not None:
        for (nlayers, checkpoint), criterion in itertools.product(trained.items(), criteria(args)):
            print(
                f"resnet{nlayers} {criterion}: -pth leaving <= {args.target_macs} of the MACs",
                flush=True,
            )
            chosen, searches[f"resnet{nlayers} {criterion}"] = quality.threshold_for_macs(
                checkpoint, criterion, args.target_macs
            )
            if Setting(criterion, chosen) not in settings[nlayers]:
                settings[nlayers].append(Setting(criterion, chosen))
    # With --retrain every column is measured on the trained base's weights.
    checkpoints = {nlayers: trained.get(nlayers, args.checkpoint) for nlayers in args.archs}
    rows = sweep(args, settings, checkpoints)
    if quality is not None:
        for nlayers, checkpoint in trained.items():
            quality.retrain(nlayers, checkpoint, rows)
    print(format_table(rows, args.image_size))
    out = args.out or (
        RESULTS if args.heads == "tao" else RESULTS.with_name(f"bench_prune_{args.heads}.json")
    )
    figures = {
        "image_size": list(args.image_size),
        "weights": "the trained base (--retrain)"
        if args.retrain
        else str(args.checkpoint or "synthetic U(0,1) spread"),
        "heads": args.heads,
        "options": {
            "criteria": [str(c) for c in criteria(args)],
            "granularity": args.granularity,
            "min_filters": args.min_filters,
            "excluded_layers": args.excluded_layers,
        },
        "retraining": {
            "train_steps": args.train_steps,
            "base_checkpoint": str(args.base_checkpoint) if args.base_checkpoint else None,
            "unpruned_from": str(args.unpruned_from) if args.unpruned_from else None,
            "retrain_steps": args.retrain_steps,
            "seeds": args.seeds,
            "first_seed": args.first_seed,
            "target_macs": args.target_macs,
            "threshold_resolution": args.threshold_resolution,
            "threshold_search_macs": searches,
            "base_metrics": quality.base_metrics if quality else {},
            "reference": args.reference,
            "demo_images": args.demo_images,
            "base_l1_weight_decay": args.l1_weight_decay,
            "base_l1_weight_decay_layers": args.l1_weight_decay_layers,
            "use_amp": args.use_amp,
            "freeze_bn": args.freeze_bn,
        }
        if args.retrain
        else None,
        "rows": rows,
    }
    write_results(out, figures, conditions)


if __name__ == "__main__":
    main()
