"""Does an exported graph answer like the PyTorch model it came from?

Detections are compared, not tensors: rank ties and near-threshold NMS decisions may
legitimately reorder or swap a few low-scoring detections, so the reference's ``top_k``
best detections per image are each matched to the candidate detection of the same label
with the highest IoU, and matched pairs are compared on box coordinates (pixels, input
frame), score and the ``M x M`` mask probabilities.

Tolerances per precision (measured on demo-trained models; fp32 agreement is usually two
orders of magnitude tighter than its bounds, see docs/architecture.md):

======  =========  ========  =========  =========  ============
dtype   match IoU  box (px)  score      mask prob  matched >=
======  =========  ========  =========  =========  ============
fp32    0.95       0.5       0.002      0.02       95 %
fp16    0.85       3.0       0.03       0.15       85 %
int8    0.5        (none)    (none)     (none)     50 %
======  =========  ========  =========  =========  ============

int8 moves boxes and scores by design; its detections must still largely coincide with
fp32's, and its real check is the mask AP drop on the validation set (export report).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torchvision.ops import box_iou


@dataclass(frozen=True)
class Tolerances:
    match_iou: float
    box_px: float | None
    score: float | None
    mask_prob: float | None
    min_matched_fraction: float
    top_k: int = 20


TOLERANCES: dict[str, Tolerances] = {
    "fp32": Tolerances(
        match_iou=0.95, box_px=0.5, score=2e-3, mask_prob=2e-2, min_matched_fraction=0.95
    ),
    "fp16": Tolerances(
        match_iou=0.85, box_px=3.0, score=3e-2, mask_prob=0.15, min_matched_fraction=0.85
    ),
    "int8": Tolerances(
        match_iou=0.5, box_px=None, score=None, mask_prob=None, min_matched_fraction=0.5
    ),
}


@dataclass
class ParityReport:
    """Outcome of :func:`compare_detections` over a set of images."""

    data_type: str
    tolerances: Tolerances
    images: int = 0
    reference_detections: int = 0
    matched: int = 0
    max_box_px: float = 0.0
    max_score: float = 0.0
    max_mask_prob: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def matched_fraction(self) -> float:
        return self.matched / self.reference_detections if self.reference_detections else 1.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        return (
            f"{self.data_type} parity on {self.images} images: "
            f"{self.matched}/{self.reference_detections} detections matched "
            f"(IoU >= {self.tolerances.match_iou}), max |d box| {self.max_box_px:.3g} px, "
            f"max |d score| {self.max_score:.3g}, max |d mask prob| {self.max_mask_prob:.3g}"
            + ("" if self.passed else f"; FAILED: {'; '.join(self.failures[:3])}")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "data_type": self.data_type,
            "tolerances": asdict(self.tolerances),
            "images": self.images,
            "reference_detections": self.reference_detections,
            "matched": self.matched,
            "matched_fraction": self.matched_fraction,
            "max_box_px": self.max_box_px,
            "max_score": self.max_score,
            "max_mask_prob": self.max_mask_prob,
            "passed": self.passed,
            "failures": self.failures,
        }


def coco_results_as_detections(results: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """One image's COCO results (``bbox`` ``[x, y, w, h]``, ``score``, ``category_id``), as
    served over HTTP, as :func:`compare_detections` takes them: ``boxes`` ``[N, 4]`` xyxy
    in the same pixels, ``scores`` ``[N]``, ``labels`` ``[N]``."""
    boxes = torch.tensor([r["bbox"] for r in results], dtype=torch.float32).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]
    return {
        "boxes": boxes,
        "scores": torch.tensor([r["score"] for r in results], dtype=torch.float32),
        "labels": torch.tensor([r["category_id"] for r in results], dtype=torch.int64),
    }


def _top(output: Mapping[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    order = torch.argsort(output["scores"], descending=True)[:k]
    return {key: value[order] for key, value in output.items()}


def overlaps(
    reference: torch.Tensor, candidate: torch.Tensor, *, box_px: float | None
) -> torch.Tensor:
    """IoU of ``reference`` ``[R, 4]`` and ``candidate`` ``[C, 4]`` xyxy boxes: ``[R, C]``.

    Two boxes without area (a detection clipped to an image edge leaves one: its COCO
    width or height is 0) have no IoU, 0 / 0: such a pair counts as overlapping fully
    where the boxes agree within ``box_px`` (exactly, where None), and not at all
    otherwise, so that it never matches an unrelated box.
    """
    iou = box_iou(reference, candidate)
    gap = (reference[:, None, :] - candidate[None, :, :]).abs().amax(dim=-1)
    agree = (gap <= (box_px or 0.0)).to(iou.dtype)
    return torch.where(torch.isnan(iou), agree, iou)


def compare_detections(
    reference: Sequence[Mapping[str, torch.Tensor]],
    candidate: Sequence[Mapping[str, torch.Tensor]],
    *,
    data_type: str,
    tolerances: Tolerances | None = None,
) -> ParityReport:
    """Compare per-image detections of a candidate (ONNX) against a reference (PyTorch).

    Args:
        reference, candidate: per image, ``boxes`` ``[N, 4]`` xyxy (same frame),
            ``scores`` ``[N]``, ``labels`` ``[N]``, optional ``masks`` ``[N, 1, M, M]``.
        data_type: "fp32" | "fp16" | "int8": picks the default tolerances.
    """
    tol = tolerances or TOLERANCES[data_type]
    report = ParityReport(data_type=data_type, tolerances=tol)
    for index, (ref_all, cand) in enumerate(zip(reference, candidate, strict=True)):
        report.images += 1
        ref = _top(ref_all, tol.top_k)
        count = int(ref["scores"].numel())
        report.reference_detections += count
        if count == 0:
            continue
        if cand["scores"].numel() == 0:
            report.failures.append(f"image {index}: no detections, reference has {count}")
            continue
        overlap = overlaps(ref["boxes"].float(), cand["boxes"].float(), box_px=tol.box_px)
        same_label = ref["labels"][:, None] == cand["labels"][None, :]
        iou: list[list[float]] = torch.where(same_label, overlap, 0.0).tolist()
        gaps = (ref["scores"].float()[:, None] - cand["scores"].float()[None, :]).abs().tolist()
        taken: set[int] = set()
        for r in range(count):
            # Equal overlaps (duplicate boxes of one label) go to the closest score.
            ranked = sorted(range(len(iou[r])), key=lambda j: (-iou[r][j], gaps[r][j]))
            c = next((j for j in ranked if j not in taken), None)
            if c is None or iou[r][c] < tol.match_iou:
                continue
            taken.add(c)
            report.matched += 1
            box_d = float((ref["boxes"][r] - cand["boxes"][c]).abs().max())
            score_d = abs(float(ref["scores"][r]) - float(cand["scores"][c]))
            report.max_box_px = max(report.max_box_px, box_d)
            report.max_score = max(report.max_score, score_d)
            if "masks" in ref and "masks" in cand:
                mask_d = float((ref["masks"][r].float() - cand["masks"][c].float()).abs().max())
                report.max_mask_prob = max(report.max_mask_prob, mask_d)
    if report.matched_fraction < tol.min_matched_fraction:
        report.failures.append(
            f"only {report.matched_fraction:.0%} of the reference's top-{tol.top_k} detections "
            f"matched (need {tol.min_matched_fraction:.0%})"
        )
    for name, value, bound in (
        ("box", report.max_box_px, tol.box_px),
        ("score", report.max_score, tol.score),
        ("mask probability", report.max_mask_prob, tol.mask_prob),
    ):
        if bound is not None and value > bound:
            report.failures.append(f"max {name} difference {value:.3g} > {bound}")
    return report
