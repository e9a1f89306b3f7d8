"""The one configuration object of the control plane (environment variables ``MASKOPS_*``)."""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal, TypedDict

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from maskops.serving.publish_options import (
    NETWORK_QUEUE_DELAY_US,
    Device,
    NetBackend,
    Precision,
)

Tracker = Literal["mlflow", "wandb", "clearml"]


class ReplicaLookupError(RuntimeError):
    """``MASKOPS_TRITON_DNS`` does not resolve."""


def _default_trackers() -> list[Tracker]:
    return ["mlflow"]


class InferImageLimits(TypedDict):
    """Keyword arguments of ``maskops.serving.protocol.ImageLimits`` (see there)."""

    max_image_pixels: int
    max_image_side: int
    max_image_aspect: float


class Settings(BaseSettings):
    """Read from the environment (prefix ``MASKOPS_``) and an optional ``.env`` file."""

    model_config = SettingsConfigDict(env_prefix="MASKOPS_", env_file=".env", extra="ignore")

    database_url: str = "sqlite:///./.maskops/maskops.db"
    database_schema: str | None = None
    """Postgres schema holding the tables (``None`` = the default search path)."""
    database_pool_size: int = Field(default=10, ge=1)
    database_max_overflow: int = Field(default=20, ge=0)
    database_pool_timeout_s: float = Field(default=10.0, gt=0)
    """How long a request waits for one of the pool's connections (``database_pool_size``
    kept, up to ``database_max_overflow`` more) before it is answered 503 with
    ``Retry-After``."""
    broker_url: str = "redis://127.0.0.1:6379/0"
    queue_prefix: str = ""
    """Prepended to the queue names ``gpu`` and ``cpu`` (lets test sessions share a Redis)."""
    stack_id: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    """Names this stack (one database and its workers) among stacks sharing a broker. Job
    messages carry it, and a worker runs only its own stack's messages (another's go
    back to the broker); on Redis every broker key (queues, unacknowledged messages)
    starts with ``<stack_id>:``. ``maskops serve`` derives it from its state dir. Empty:
    no prefix and no check (the broker, or its Redis database, serves one stack)."""
    data_root: Path = Path("./.maskops/data")
    """Datasets are registered relative to this; job outputs live under ``data_root/jobs``."""
    pretrained_dirs: list[Path] = Field(default_factory=list)
    """Folders outside the data root whose files experiment specs sent over REST may name
    (``checkpoint``: pretrained weights the operator provides), as a JSON list."""
    triton_url: str = ""
    """Triton HTTP endpoint ``host:port``, or several separated by commas: one per replica,
    all on the same model repository (docs/operations.md#several-triton-replicas); empty
    = no Triton (``/readyz`` skips it)."""
    triton_dns: str = ""
    """``host:port`` whose host name resolves to one address per Triton replica (a
    Kubernetes headless service, compose's ``--scale triton=N``), looked up again every
    ``triton_dns_refresh_s``; its replicas add to ``triton_url``'s."""
    triton_dns_refresh_s: float = Field(default=10.0, gt=0)
    triton_control_key: str = Field(default="", repr=False)
    """The key Triton wants in the header of model-control requests (load, unload, the
    repository index), which only the control plane's processes hold; the engine's client
    reads it from this variable, ``MASKOPS_TRITON_CONTROL_KEY``
    (``maskops.serving.control``). ``maskops serve`` makes one at each start; the Triton
    image refuses to start without one (docs/operations.md#triton-model-control)."""
    model_repository: Path = Path("./model_repository")
    triton_device: Device = "cpu"
    """Where Triton runs the networks of published models (the operator says, nothing is
    probed): ``gpu`` for the official GPU image (docs/operations.md#gpu-serving)."""
    triton_gpus: list[int] = Field(default_factory=list)
    """GPU ids the network instances run on (JSON list, ``[0, 1]``); empty: every GPU
    each Triton sees."""
    triton_net_backend: Literal["auto", NetBackend] = "auto"
    """How published models run their network: ``python`` (onnxruntime inside Triton's
    python backend, the PyPI server), ``onnxruntime`` (Triton's backend; on GPUs with the
    TensorRT accelerator), ``tensorrt`` (an engine from ``maskops gen_trt_engine``) or
    ``torch`` (a train or prune job's checkpoint run by PyTorch in the python backend, for
    GPU hosts without TensorRT); ``auto``: onnxruntime on GPUs, python on CPUs
    (docs/operations.md#gpu-serving)."""
    triton_instances: int = Field(default=1, ge=1)
    """Instances of each published network (per GPU on GPUs): ``instance_group`` count."""
    triton_processing_instances: int = Field(default=1, ge=1)
    """Instances of each published model's preprocess and postprocess models, processes
    on the CPU: more decode and encode more images at once."""
    triton_max_queue_delay_us: int = Field(default=NETWORK_QUEUE_DELAY_US, ge=0)
    """How long each published network waits for more requests to fill a batch, in
    microseconds: up to that much more latency for a lone request (0: no wait)."""
    triton_precision: Precision = "auto"
    """The ``torch`` network backend's precision: ``auto`` is bf16 autocast on GPUs with
    native bf16, fp16 on other GPUs, fp32 on the CPU."""
    triton_tensorrt_version: str = ""
    """The TensorRT of the Triton that serves (``tensorrt`` engines must be built by the
    same); empty: the version in the Triton image maskops pins."""
    triton_engine_cache: str = ""
    """Where each Triton process caches the TensorRT engines of GPU models, as Triton sees
    it; empty: ``maskops.serving.placement.ENGINE_CACHE_ROOT``, which the Triton image
    makes."""
    max_infer_image_bytes: int = 32 * 1024**2
    max_infer_images: int = 16
    max_infer_image_pixels: int = Field(default=50_000_000, ge=1)
    """Width x height of one ``/infer`` image, read from its header (refused with 413)."""
    max_infer_image_side: int = Field(default=20_000, ge=1)
    """The longest side of one ``/infer`` image (413 beyond)."""
    max_infer_image_aspect: float = Field(default=20.0, ge=1.0)
    """Long side / short side of one ``/infer`` image (422 beyond): a 1 x 50,000,000 PNG is
    within the pixel limit, and its resize weights once took Triton 65 s and 1.8 GB."""
    infer_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds Triton may take per image of an ``/infer`` request (about 11 times the 0.9 s
    one image took on two CPU cores, docs/benchmarks.md): a request of N images waits at
    most N times this, then is answered 503 and that replica's circuit opens
    (docs/operations.md#several-triton-replicas)."""
    max_concurrent_infer: int = Field(default=16, ge=1)
    """``/infer`` requests waiting on Triton at once per API process, each on a thread of a
    pool of its own (never the other routes' threads); one more is answered 429 with
    ``Retry-After``."""

    trackers: list[Tracker] = Field(default_factory=_default_trackers)
    """The experiment trackers a spec sent over REST may turn on (a JSON list). Where they
    write is the operator's: the workers' environment (``MLFLOW_TRACKING_URI``, W&B's and
    ClearML's own configuration); MLflow without one writes under the job's folder. W&B
    and ClearML send data off the host, so they are off unless listed here."""

    host: str = "127.0.0.1"
    """Where the API listens; auth is required whenever this is not a loopback address."""
    auth: Literal["auto", "required", "disabled"] = "auto"
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names (a JSON list) requests may carry in ``Host`` besides the bound address;
    on loopback also ``localhost``, ``127.0.0.1`` and ``::1``. Others get 400 (DNS
    rebinding). Bound beyond loopback with this empty, any name is served (tokens are
    required there)."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins (``https://app.example:443``, a JSON list) whose pages may call the API from
    a browser; every other origin's request is refused with 403 (cross-site request
    forgery). ``maskops_api.middleware.origin_guard``."""
    access_log: bool = False
    max_log_followers: int = Field(default=64, ge=1)
    """Concurrent ``GET /jobs/{id}/logs?follow=true`` streams; one more is answered 429. A
    stream holds no database connection while it waits."""
    """uvicorn's line per request. Off by default: ``/metrics`` has latency per route, and
    under pollers the log line cost more than serving a status poll from memory."""

    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_timeout_s: float = Field(default=60.0, gt=0)
    """A running job whose heartbeat is older than this is considered orphaned."""
    worker_row_retention_s: float = Field(default=7 * 24 * 3600, gt=0)
    """A ``worker_heartbeats`` row not refreshed for this long (a worker killed without a
    clean stop) is deleted by the next beat of any worker."""
    redispatch_after_s: float = Field(default=30.0, ge=0)
    """A queued job whose message is not in the broker after this long is re-sent."""
    reconcile_interval_s: float = Field(default=15.0, gt=0)
    max_running_searches: int | None = Field(default=None, ge=1)
    """AutoML searches whose controllers run at once (None: no limit); a further search
    stays queued, unsent, until one ends. A controller holds a worker slot for its whole
    search: where controllers and trials share the slots (``maskops serve``: one worker,
    two slots, limit 1) a limit below the slots leaves trials one to train in."""
    queue_stall_after_s: float = Field(default=600.0, gt=0)
    """A queue with a job sent this long ago, while no job runs anywhere but search
    controllers, is stalled: ``/readyz`` says so."""
    max_attempts: int = Field(default=5, ge=1)
    """A job whose worker was lost this many times fails instead of being requeued (a job
    that always crashes its worker, or always exceeds the hard time limit)."""
    max_upload_bytes: int = 2 * 1024**3
    """The largest request body of ``POST /datasets/upload`` (refused as it arrives)."""
    max_extracted_bytes: int = 8 * 1024**3
    max_archive_ratio: int = Field(default=200, ge=1)
    """An upload may expand to at most this many times its own size (every archive format;
    counted while extracting)."""
    min_free_disk_bytes: int = Field(default=256 * 1024**2, ge=0)
    """Below this much free space on the data root's disk ``/readyz`` reports ``disk``
    (503): uploads and jobs would fail with "no space left" (answered 507)."""
    max_json_body_bytes: int = Field(default=1024**2, ge=1024)
    """The largest request body of every other route (JSON bodies; refused as it arrives)."""
    task_soft_time_limit_s: int = 7 * 24 * 3600
    task_time_limit_s: int = 7 * 24 * 3600 + 600
    train_max_restarts: int = Field(default=3, ge=0)
    """Times torchrun restarts the ranks of a multi-rank train job (each resumes from the
    last checkpoint) before the job fails with the failing rank's error."""
    worker_gpus: int | None = Field(default=None, ge=0)
    """The GPUs this worker reports; None: the NVIDIA devices it sees."""
    require_cuda: bool = False
    """A GPU worker's jobs must run on a usable GPU: without one (no GPU visible, or a driver
    too old for torch's CUDA build) they fail, saying why, instead of running on the CPU.
    The engine reads the same variable, ``MASKOPS_REQUIRE_CUDA`` (``maskops.device``), in
    every process a job starts; the worker image sets it."""
    rendezvous_timeout_s: float = Field(default=600.0, gt=0)
    """How long the nodes of a multi-node train job may take to gather; after it the job
    goes back to the queue with the reason."""
    cpu_ranks: int = Field(default=1, ge=1, le=64)
    """The ranks a worker without a GPU offers a train job (gloo on its cores): a job's
    ``options.gpus`` may go up to this where no worker has a GPU."""

    @field_validator("triton_gpus")
    @classmethod
    def _gpus(cls, value: list[int], info: ValidationInfo) -> list[int]:
        if value and info.data.get("triton_device") != "gpu":
            raise ValueError("GPU ids given but triton_device is not gpu")
        if any(g < 0 for g in value):
            raise ValueError(f"GPU ids must be >= 0, got {value}")
        return value

    @field_validator("triton_url", "triton_dns")
    @classmethod
    def _endpoints(cls, value: str, info: ValidationInfo) -> str:
        entries = [e.strip() for e in value.split(",") if e.strip()]
        if info.field_name == "triton_dns" and len(entries) > 1:
            raise ValueError(f"one host:port, not a list: {value!r}")
        for entry in entries:
            host, port = split_endpoint(entry)
            if not host or not port.isdigit():
                raise ValueError(f"{entry!r} is not host:port")
        return ",".join(entries)

    @property
    def infer_image_limits(self) -> InferImageLimits:
        """The ``/infer`` image limits as keyword arguments of
        ``maskops.serving.protocol.ImageLimits``: the API checks them, and publish writes
        them for the preprocess model, which clients may call directly."""
        return InferImageLimits(
            max_image_pixels=self.max_infer_image_pixels,
            max_image_side=self.max_infer_image_side,
            max_image_aspect=self.max_infer_image_aspect,
        )

    @property
    def triton_endpoints(self) -> list[str]:
        """``triton_url``'s replicas (``triton_dns``'s are looked up by
        :meth:`triton_replicas`)."""
        return [e for e in self.triton_url.split(",") if e]

    def triton_replicas(self) -> list[str]:
        """``host:port`` of every Triton replica, each once, in a stable order:
        ``triton_url``'s list, plus every address ``triton_dns`` resolves to
        (docs/operations.md#several-triton-replicas).

        Raises:
            ReplicaLookupError: ``triton_dns`` is set and its name does not resolve.
        """
        replicas = list(self.triton_endpoints)
        if self.triton_dns:
            replicas += resolve_all(self.triton_dns)
        return list(dict.fromkeys(replicas))

    @property
    def has_triton(self) -> bool:
        return bool(self.triton_url or self.triton_dns)

    @property
    def gpu_queue(self) -> str:
        return f"{self.queue_prefix}gpu"

    @property
    def cpu_queue(self) -> str:
        return f"{self.queue_prefix}cpu"

    @property
    def broker_key_prefix(self) -> str:
        """What every Redis key of this stack's broker starts with (kombu's
        ``global_keyprefix``); readers of the broker's keys add it too."""
        return f"{self.stack_id}:" if self.stack_id else ""

    @property
    def jobs_dir(self) -> Path:
        return self.data_root / "jobs"

    @property
    def auth_required(self) -> bool:
        if self.auth != "auto":
            return self.auth == "required"
        return not is_loopback(self.host)


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """``(host, port)`` of ``host:port`` (an ``http://`` prefix is accepted)."""
    host, _, port = endpoint.split("://", 1)[-1].rstrip("/").rpartition(":")
    return host, port


def resolve_all(endpoint: str) -> list[str]:
    """``host:port`` for every address ``endpoint``'s host name resolves to, sorted.

    Raises:
        ReplicaLookupError: the host name does not resolve.
    """
    host, port = split_endpoint(endpoint)
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ReplicaLookupError(
            f"MASKOPS_TRITON_DNS {endpoint}: {host} does not resolve ({exc})"
        ) from None
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses; ``0.0.0.0`` and names are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
