"""Shared test configuration.

Tests that need Postgres or Redis use the ``postgres_url`` / ``redis_url`` fixtures. Where a
service is unreachable they skip, except under ``./dev test`` (``MASKOPS_REQUIRE_SERVICES=1``,
set once it has started both), where they fail: the suite must exercise the real services.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import torch

if TYPE_CHECKING:
    from maskops.data.demo import DemoDataset
    from maskops.spec.models import ExperimentSpec

pytest_plugins = ["tests.support.control_plane", "tests.support.tiny_model"]
"""``settings`` and ``factory``: the control plane on a migrated SQLite database (the unit
tests of the core, the API, the worker's runner and the single-machine stack);
``tiny_config`` and ``make_targets``: small models and their targets."""


def _share_the_cores_between_test_processes() -> None:
    """Under ``./dev test``'s two processes, each takes its share of the cores.

    With a thread per core in each process, the cores are oversubscribed and OpenMP's
    spinning threads make every training several times slower: two concurrent 160-step
    trainings of the demo recipe took 347 s each with two threads apiece, 79 s with one,
    on a 2-core machine (2026-11-27). Subprocesses (workers, torchrun's ranks, the
    benchmarks) inherit the share through ``OMP_NUM_THREADS`` where it is not set already.
    """
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if processes <= 1:
        return
    share = max(1, len(os.sched_getaffinity(0)) // processes)
    os.environ.setdefault("OMP_NUM_THREADS", str(share))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores_between_test_processes()

POSTGRES_URL = os.environ.get(
    "MASKOPS_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("MASKOPS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or default_port)
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


def _require(url: str, default_port: int, what: str) -> str:
    if _reachable(url, default_port):
        return url
    message = f"{what} is not reachable at {url}"
    if os.environ.get("MASKOPS_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


class PeakRss:
    """How far a process's resident memory rose above its level at the start of a block.

    Linux only: writing 5 to ``/proc/<pid>/clear_refs`` resets the peak (``VmHWM``) to the
    current resident size; on exit :attr:`grew_mb` is the new peak minus the start. Freed
    memory that a process reuses is not counted again, so this can under-count, never
    over-count: tests pair a bound with a control that exceeds it.
    """

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.grew_mb = 0.0

    def _kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise LookupError(f"no {field} in /proc/{self.pid}/status")

    def __enter__(self) -> PeakRss:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        self._start_kib = self._kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.grew_mb = (self._kib("VmHWM") - self._start_kib) / 1024


def large_jpeg(width: int, height: int, *, seed: int = 0, rotated: bool = False) -> bytes:
    """A photo-like JPEG with structure at several scales, made at full size by Pillow (fast
    at tens of megapixels); ``rotated`` adds EXIF orientation 6 (displayed turned 90 deg)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    image = coarse.resize((width, height), Image.Resampling.BICUBIC)
    exif = image.getexif()
    if rotated:
        exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90, exif=exif)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return _require(POSTGRES_URL, 5432, "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _require(REDIS_URL, 6379, "Redis")


DISK_NEEDED_BYTES = 7 * 1024**3
"""Free space the whole suite needs in pytest's temporary folder: at most 5.6 GB are there
at once (docs/architecture.md#development)."""
CHECK_DISK_ENV = "MASKOPS_CHECK_TEST_DISK"
"""Set by ``./dev test``, which runs the whole suite; a part of it needs less."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before any test where the disk cannot hold a run: on a full disk dozens of
    tests fail on whatever they write, none saying why."""
    if os.environ.get(CHECK_DISK_ENV) != "1" or hasattr(session.config, "workerinput"):
        return  # a part of the suite, or a process the controlling one checked for
    # Made now, as it would be for the first test: making it removes earlier runs' folders.
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    folder = factory.getbasetemp()
    free = shutil.disk_usage(folder).free
    if free < DISK_NEEDED_BYTES:
        pytest.exit(
            f"{free / 1024**3:.1f} GiB free in {folder}: the tests need "
            f"{DISK_NEEDED_BYTES / 1024**3:.0f} GiB there (pytest's temporary folders)",
            returncode=1,
        )


# Tests on the one Postgres database and Redis (each test empties them first): all live here.
SHARED_SERVICES_TESTS = "tests/integration/api/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        uses_services = {"postgres_url", "redis_url"} & set(getattr(item, "fixturenames", ()))
        if uses_services and not item.nodeid.startswith(SHARED_SERVICES_TESTS):
            raise pytest.UsageError(
                f"{item.nodeid} uses Postgres/Redis: move it under {SHARED_SERVICES_TESTS}, "
                "whose tests ./dev test runs one after another"
            )
    # The long runs first: the shared-services tests, then the files on trained_model; each
    # process of ./dev test takes one (with --no-loadscope-reorder), and neither is left to
    # run alone at the end. The rest keep their order.
    items.sort(key=_start_rank)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _start_rank(item: pytest.Item) -> int:
    if item.nodeid.startswith(SHARED_SERVICES_TESTS):
        return 0
    return 1 if "trained_model" in getattr(item, "fixturenames", ()) else 2


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``./dev test`` runs pytest in two processes (pytest-xdist): each file's tests in one
    process, in order (some follow on from the one before), and all the shared-services
    tests in one process, one after another. (``--dist loadgroup`` would say this with
    marks, but under pytest 9.2 it silently groups nothing: pytest-xdist issue #1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedServicesInOneProcess(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SHARED_SERVICES_TESTS):
                return SHARED_SERVICES_TESTS
            return nodeid.split("::")[0]

    return SharedServicesInOneProcess(config, log)


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory: pytest.TempPathFactory) -> DemoDataset:
    """The synthetic shapes dataset: 24 train + 8 val JPEGs of 128x128, seed 0.

    Categories circle (id 1), square (3), triangle (7); 1-5 shapes per image, occlusions
    included. Acts as its root path (``demo_dataset / "annotations" / "val.json"``); also
    ``.train_images``, ``.val_images``, ``.train_json``, ``.val_json``.
    """
    from maskops.data.demo import generate_demo_dataset

    return generate_demo_dataset(
        tmp_path_factory.mktemp("demo_dataset"),
        num_images=32,
        image_size=(128, 128),
        seed=0,
        val_fraction=0.25,
    )


@pytest.fixture(scope="session")
def demo_shards(tmp_path_factory: pytest.TempPathFactory, demo_dataset: DemoDataset) -> Path:
    """A directory of ``demo_dataset`` converted with masks: ``train-*`` (24 images, 1 shard),
    ``val-*`` (8 images), with ``train_manifest.json`` / ``val_manifest.json``. Use
    ``f"{demo_shards}/train*"`` as training_file_pattern and ``demo_dataset.val_json`` as
    val_json_file.
    """
    from maskops.data.convert import convert_dataset

    out = tmp_path_factory.mktemp("demo_shards")
    convert_dataset(demo_dataset.train_images, demo_dataset.train_json, out, workers=1)
    convert_dataset(demo_dataset.val_images, demo_dataset.val_json, out, workers=1)
    return out


@pytest.fixture(scope="session")
def tiny_spec(demo_dataset: DemoDataset, demo_shards: Path) -> ExperimentSpec:
    """A CI-sized training spec on ``demo_shards``: resnet10 at 128x128, batch 2, 4 steps.

    FPN levels 3..5 (anchors 16..64 px, the demo shapes' sizes) and small heads and
    sampling sizes (``TINY_HEADS``, bench/synthetic.py's, which the CI-sized benchmarks
    take): the default 512 RoIs through the 4-conv mask head and the stride-4 level would
    make each step many times slower.
    ``val_json_file`` is the demo val split, so the end-of-training evaluation is COCO.
    """
    from maskops.spec.models import DataConfig, ExperimentSpec, MaskRCNNConfig
    from tests.support.bench import load_bench_module

    heads = load_bench_module("synthetic").TINY_HEADS
    return ExperimentSpec(
        seed=7,
        total_steps=4,
        train_batch_size=2,
        eval_batch_size=4,
        # From scratch at batch 2 the mask head diverges at 0.01; 0.004 learns steadily.
        init_learning_rate=0.004,
        warmup_learning_rate=0.0004,
        warmup_steps=2,
        num_steps_per_eval=0,
        data_config=DataConfig(
            image_size=(128, 128),
            training_file_pattern=f"{demo_shards}/train*",
            validation_file_pattern=f"{demo_shards}/val*",
            val_json_file=str(demo_dataset.val_json),
            num_classes=4,
            n_workers=0,
            eval_samples=4,
        ),
        maskrcnn_config=MaskRCNNConfig(nlayers=10, **heads),
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_spec: ExperimentSpec) -> Path:
    """A maskops checkpoint of ``tiny_spec``'s resnet10 trained 4 steps on the demo shards
    (``save_checkpoint`` format, label map circle/square/triangle, step 4). Barely trained:
    use it for plumbing (load, evaluate, prune, export), not for accuracy."""
    from maskops.training import run_training

    result = run_training(tiny_spec, tmp_path_factory.mktemp("tiny_checkpoint"))
    assert result.checkpoint is not None
    return result.checkpoint


TRAINED_MODEL_STEPS = 100


@dataclass(frozen=True)
class TrainedModel:
    """A model that really detects, with what it was trained and validated on."""

    checkpoint: Path
    spec: ExperimentSpec
    dataset: DemoDataset
    mask_ap: float


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory: pytest.TempPathFactory) -> TrainedModel:
    """The demo walk's recipe (``maskops_serve.demo``: resnet10 from scratch, 128 px, its
    dataset of 160 train / 40 val images) cut to ``TRAINED_MODEL_STEPS`` steps in fp32
    (42 s on 2 idle cores, mask AP 0.31: a 2-core Intel Xeon, 2026-11-28; 160 steps took
    69 s to 0.40), far enough to detect: its mask AP is checked below. For assertions
    that only mean something on a model that detects, such as the INT8 export's mask AP
    drop; everything else uses tiny_checkpoint. Trained once per run: under
    ``./dev test``'s two processes the second waits for the first's.
    """
    from filelock import FileLock

    root = _shared_by_this_run(tmp_path_factory) / "trained_model"
    record = root / "trained_model.pickle"
    with FileLock(f"{root}.lock"):
        if not record.exists():
            root.mkdir()
            record.write_bytes(pickle.dumps(_train_model(root)))
    trained: TrainedModel = pickle.loads(record.read_bytes())
    return trained


def _shared_by_this_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this pytest run sees: under pytest-xdist, the run's base
    temporary folder holds one per worker."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _train_model(root: Path) -> TrainedModel:
    from maskops.training import run_training
    from maskops_serve.demo import prepare_walk_training

    walk = prepare_walk_training(root, TRAINED_MODEL_STEPS)
    # fp32: the slow mask AP comparison of test_bf16_recipe trains it again in bf16.
    spec = walk.spec.model_copy(update={"use_amp": False})
    result = run_training(spec, root / "run")
    assert result.checkpoint is not None
    mask_ap = float(result.metrics["mask_AP"])
    # Below this, "the INT8 model lost at most x AP" would hold for a model that detects
    # nothing: fail loudly rather than let those tests pass vacuously.
    assert mask_ap >= 0.12, f"the trained fixture reached mask AP {mask_ap:.3f} only"
    return TrainedModel(result.checkpoint, spec, walk.dataset, mask_ap)
