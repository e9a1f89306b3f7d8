"""Published weights by name or URL, fetched into the weights cache (:func:`fetch_weights`).

A spec's ``checkpoint`` may name torchvision weights (``ResNet50_Weights.IMAGENET1K_V2``)
or ``URL#sha256=HEX`` (:mod:`maskops.spec.weights_reference`). They are downloaded the way
``torch.hub`` caches checkpoints: into one folder, under the URL's file name, through
``torch.hub.download_url_to_file`` with the SHA-256 checked before the file is renamed
into place (for a torchvision name, the hash prefix its file name carries, as
``torch.hub.load_state_dict_from_url(check_hash=True)`` checks; for a URL, the whole hash
given). As in torch.hub, a file already in the cache under that name is used as it is, so
an operator without internet places the file there; a URL's file is checked again, since
its whole hash is known.

The cache is ``$MASKOPS_WEIGHTS_DIR``, else ``$MASKOPS_DATA_ROOT/cache/weights`` (the
control plane's data root), else ``.maskops/data/cache/weights``. ``MASKOPS_OFFLINE=1``
downloads nothing: a missing file is an error naming the file to place and where.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from maskops.checkpoints.model_file import CheckpointError
from maskops.data.shards import file_sha256
from maskops.spec.weights_reference import is_url, is_weights_name, split_weights_url

WEIGHTS_DIR_ENV = "MASKOPS_WEIGHTS_DIR"
DATA_ROOT_ENV = "MASKOPS_DATA_ROOT"
OFFLINE_ENV = "MASKOPS_OFFLINE"
DEFAULT_DATA_ROOT = Path(".maskops/data")
CACHE_SUBDIR = Path("cache/weights")

LISTED_WEIGHTS = (
    "MaskRCNN_ResNet50_FPN_Weights",
    "MaskRCNN_ResNet50_FPN_V2_Weights",
    "ResNet18_Weights",
    "ResNet34_Weights",
    "ResNet50_Weights",
    "ResNet101_Weights",
    "ResNet152_Weights",
)
"""The torchvision weights ``maskops weights list`` shows: the Mask R-CNN COCO models and the
ImageNet ResNets whose layout this engine's model shares (any torchvision name is
accepted; these are the ones that load)."""

logger = logging.getLogger(__name__)


def weights_cache_dir() -> Path:
    """Where fetched weights live (see the module docstring)."""
    if os.environ.get(WEIGHTS_DIR_ENV):
        return Path(os.environ[WEIGHTS_DIR_ENV]).expanduser()
    root = os.environ.get(DATA_ROOT_ENV)
    return (Path(root).expanduser() if root else DEFAULT_DATA_ROOT) / CACHE_SUBDIR


def offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class WeightsSource:
    """Where a weights reference comes from and the cache file it becomes."""

    reference: str
    url: str
    file_name: str
    sha256: str
    """The whole hash (a URL's) or the prefix in the file name (torchvision's)."""
    size_mb: float | None = None


def weights_source(reference: str) -> WeightsSource:
    """The :class:`WeightsSource` of a torchvision weights name or ``URL#sha256=HEX``."""
    if is_url(reference):
        try:
            url, sha256 = split_weights_url(reference)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        return WeightsSource(reference, url, _file_name(url), sha256)
    if not is_weights_name(reference):
        raise CheckpointError(f"{reference!r}: not a torchvision weights name or a URL")
    from torch.hub import HASH_REGEX
    from torchvision.models import get_weight

    try:
        weights = get_weight(reference)
    except (KeyError, ValueError, AttributeError):
        raise CheckpointError(
            f"{reference}: torchvision has no such weights (maskops weights list shows the "
            "names that fit this model)"
        ) from None
    name = _file_name(weights.url)
    match = HASH_REGEX.search(name)
    size = weights.meta.get("_file_size")
    return WeightsSource(
        reference, weights.url, name, match.group(1) if match else "", size and float(size)
    )


def _file_name(url: str) -> str:
    return PurePosixPath(urlsplit(url).path).name or "weights.pth"


def cached_weights(source: WeightsSource, cache_dir: Path | None = None) -> Path | None:
    """The cache file of ``source`` if it is there (a URL's is checked against its hash)."""
    path = (cache_dir or weights_cache_dir()) / source.file_name
    if not path.is_file():
        return None
    if is_url(source.reference) and (got := file_sha256(path)) != source.sha256:
        raise CheckpointError(
            f"{source.reference}: the cached {path} has SHA-256 {got}, not {source.sha256}; "
            "remove it to fetch it again"
        )
    return path


def fetch_weights(
    reference: str, cache_dir: Path | None = None, *, progress: bool | None = None
) -> Path:
    """The local file of a weights name or URL: from the cache, else downloaded into it.

    ``progress``: tqdm's download bar (None: when stderr is a terminal). Raises
    :class:`CheckpointError` naming the reference when offline and not cached, when the
    download fails, or when its hash differs (nothing is left in the cache then).
    """
    source = weights_source(reference)
    folder = cache_dir or weights_cache_dir()
    cached = cached_weights(source, folder)
    if cached is not None:
        return cached
    target = folder / source.file_name
    if offline():
        raise CheckpointError(
            f"{reference}: not in the weights cache and {OFFLINE_ENV} forbids downloads: "
            f"place {source.file_name} (from {source.url}) in {folder}"
        )
    import torch.hub

    folder.mkdir(parents=True, exist_ok=True)
    logger.info("%s: downloading %s to %s", reference, source.url, target)
    show = sys.stderr.isatty() if progress is None else progress
    try:
        torch.hub.download_url_to_file(
            source.url, str(target), hash_prefix=source.sha256 or None, progress=show
        )
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{reference}: fetching {source.url} failed: {exc}") from None
    return target


def resolve_checkpoint(value: str | os.PathLike[str]) -> Path:
    """The file a ``checkpoint`` names: fetched for a weights name or URL, else the path."""
    text = os.fspath(value)
    if is_weights_name(text) or is_url(text):
        return fetch_weights(text)
    return Path(text)
