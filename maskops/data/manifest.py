"""The manifest of a converted split, and finding shards (and their label map) by pattern.

``dataset_convert`` writes ``<tag>_manifest.json`` next to the shards: format version,
label map (category id, name, contiguous label), shard list with sample counts and
checksums, counts per category, and the source annotation file's checksum. A spec's
``training_file_pattern`` (``OUT_DIR/train*``) also matches the manifest and warnings
files; only names of the shard form ``<tag>-NNNNN-of-MMMMM.tar`` count as shards.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskops.data.labels import LabelMap
from maskops.data.shards import SHARD_NAME_RE, is_shard_file

MANIFEST_FORMAT = "maskops-shards"
MANIFEST_VERSION = 1


def manifest_path(out_dir: Path, tag: str) -> Path:
    return out_dir / f"{tag}_manifest.json"


@dataclass(frozen=True)
class ShardInfo:
    file: str
    num_samples: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    path: Path
    tag: str
    label_map: LabelMap
    shards: tuple[ShardInfo, ...]
    num_images: int
    num_annotations: int
    include_masks: bool
    data: dict[str, Any]
    num_images_without_objects: int = 0
    """Negatives among num_images (0 in manifests written before maskops counted them)."""
    """The whole document, for fields not mirrored above."""

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read a manifest; ValueError (naming the file) if it is not one."""
        try:
            data = json.loads(path.read_text())
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format is {data.get('format')!r}, not {MANIFEST_FORMAT!r}")
            if int(data["version"]) > MANIFEST_VERSION:
                raise ValueError(f"version {data['version']} is newer than this maskops")
            return cls(
                path=path,
                tag=str(data["tag"]),
                label_map=LabelMap.from_json(data["label_map"]),
                shards=tuple(
                    ShardInfo(str(s["file"]), int(s["num_samples"]), str(s["sha256"]))
                    for s in data["shards"]
                ),
                num_images=int(data["num_images"]),
                num_annotations=int(data["num_annotations"]),
                include_masks=bool(data["include_masks"]),
                data=data,
                num_images_without_objects=int(data.get("num_images_without_objects", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) else exc
            raise ValueError(f"{path}: not a maskops manifest: {detail}") from exc

    def shard_paths(self) -> list[Path]:
        return [self.path.parent / s.file for s in self.shards]


def resolve_shards(pattern: str | Path) -> list[Path]:
    """Shard files selected by a file pattern (or every shard in a directory), sorted.

    Raises:
        ValueError: nothing matches (the message names the pattern).
    """
    text = str(pattern)
    if Path(text).is_dir():
        text = str(Path(text) / "*")
    # glob.glob: a pattern may hold wildcards in any component, absolute or relative.
    paths = sorted(Path(p) for p in glob.glob(text) if is_shard_file(p))  # noqa: PTH207
    if not paths:
        raise ValueError(
            f"no shards match {str(pattern)!r} (expected files named "
            "<tag>-NNNNN-of-MMMMM.tar written by dataset_convert)"
        )
    return paths


def manifests_for(shards: list[Path]) -> list[Manifest]:
    """The manifests that list the given shards (one per tag and directory)."""
    manifests: dict[Path, Manifest] = {}
    for shard in shards:
        match = SHARD_NAME_RE.match(shard.name)
        assert match is not None  # resolve_shards only returns shard names
        path = manifest_path(shard.parent, match["tag"])
        if path not in manifests:
            if not path.exists():
                raise ValueError(f"{shard}: no manifest {path.name} next to it")
            manifests[path] = Manifest.load(path)
        if shard.name not in {s.file for s in manifests[path].shards}:
            raise ValueError(f"{shard}: not listed in {path}")
    return list(manifests.values())


def load_label_map(pattern: str | Path) -> LabelMap:
    """The label map of the shards a pattern selects (they must all agree).

    Raises:
        ValueError: no shards, a missing manifest, or shards with different label maps.
    """
    manifests = manifests_for(resolve_shards(pattern))
    first = manifests[0]
    for other in manifests[1:]:
        if other.label_map != first.label_map:
            raise ValueError(
                f"{pattern}: shards disagree on categories: {first.path.name} has "
                f"{first.label_map!r}, {other.path.name} has {other.label_map!r}"
            )
    return first.label_map
