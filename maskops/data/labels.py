"""Mapping between a dataset's COCO category ids and contiguous training labels.

Training label 0 is background; categories get labels 1..K in ascending category-id
order. Every result that leaves maskops carries the original category id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Category:
    id: int
    name: str
    label: int


class LabelMap:
    """An immutable, ordered category-id <-> label mapping."""

    def __init__(self, categories: Sequence[Category]) -> None:
        labels = [c.label for c in categories]
        if labels != list(range(1, len(categories) + 1)):
            raise ValueError(f"labels must be 1..{len(categories)} in order, got {labels}")
        ids = [c.id for c in categories]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate category ids in label map: {ids}")
        self.categories: tuple[Category, ...] = tuple(categories)
        self._by_id = {c.id: c for c in categories}

    @classmethod
    def from_coco_categories(cls, categories: Iterable[Mapping[str, Any]]) -> LabelMap:
        """Build from COCO ``categories`` entries (``{"id": .., "name": ..}``), sorted by id."""
        ordered = sorted(categories, key=lambda c: int(c["id"]))
        return cls([Category(int(c["id"]), str(c["name"]), i + 1) for i, c in enumerate(ordered)])

    @classmethod
    def from_json(cls, data: Sequence[Mapping[str, Any]]) -> LabelMap:
        return cls([Category(int(d["id"]), str(d["name"]), int(d["label"])) for d in data])

    def to_json(self) -> list[dict[str, Any]]:
        return [{"id": c.id, "name": c.name, "label": c.label} for c in self.categories]

    @property
    def num_classes(self) -> int:
        """Number of model classes, background included."""
        return len(self.categories) + 1

    @property
    def names(self) -> list[str]:
        """Category names in label order (label 1 first)."""
        return [c.name for c in self.categories]

    def label_of(self, category_id: int) -> int:
        return self._by_id[category_id].label

    def category_id_of(self, label: int) -> int:
        if not 1 <= label <= len(self.categories):
            raise KeyError(f"label {label} is outside 1..{len(self.categories)}")
        return self.categories[label - 1].id

    def name_of_label(self, label: int) -> str:
        return self.categories[label - 1].name

    def __contains__(self, category_id: object) -> bool:
        return category_id in self._by_id

    def __len__(self) -> int:
        return len(self.categories)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelMap) and self.categories == other.categories

    def __hash__(self) -> int:
        return hash(self.categories)

    def __repr__(self) -> str:
        return f"LabelMap({[(c.id, c.name) for c in self.categories]})"
