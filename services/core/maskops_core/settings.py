"""The one configuration object of the control plane (environment variables ``MASKOPS_*``)."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Read from the environment (prefix ``MASKOPS_``) and an optional ``.env`` file."""

    model_config = SettingsConfigDict(env_prefix="MASKOPS_", env_file=".env", extra="ignore")

    database_url: str = "sqlite:///./.maskops/maskops.db"
    database_schema: str | None = None
    """Postgres schema holding the tables (``None`` = the default search path)."""
    broker_url: str = "redis://127.0.0.1:6379/0"
    queue_prefix: str = ""
    """Prepended to the queue names ``gpu`` and ``cpu`` (lets test sessions share a Redis)."""
    data_root: Path = Path("./.maskops/data")
    """Datasets are registered relative to this; job outputs live under ``data_root/jobs``."""
    pretrained_dirs: list[Path] = Field(default_factory=list)
    """Folders outside the data root whose files experiment specs sent over REST may name
    (``checkpoint``: pretrained weights the operator provides), as a JSON list."""
    triton_url: str = ""
    """Triton HTTP endpoint (``host:port``); empty = no Triton (``/readyz`` skips it)."""
    model_repository: Path = Path("./model_repository")
    triton_net_backend: Literal["python", "onnxruntime", "tensorrt"] = "python"
    """How published models run their network: ``python`` (onnxruntime inside Triton's
    python backend, the PyPI server) or the official image's onnxruntime/tensorrt."""
    max_infer_image_bytes: int = 32 * 1024**2
    max_infer_images: int = 16
    max_infer_image_pixels: int = Field(default=50_000_000, ge=1)
    """Width x height of one ``/infer`` image, read from its header (refused with 413)."""

    host: str = "127.0.0.1"
    """Where the API listens; auth is required whenever this is not a loopback address."""
    auth: Literal["auto", "required", "disabled"] = "auto"
    access_log: bool = False
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
    max_attempts: int = Field(default=5, ge=1)
    """A job whose worker was lost this many times fails instead of being requeued (a job
    that always crashes its worker, or always exceeds the hard time limit)."""
    max_upload_bytes: int = 2 * 1024**3
    """The largest request body of ``POST /datasets/upload`` (refused as it arrives)."""
    max_extracted_bytes: int = 8 * 1024**3
    max_archive_ratio: int = Field(default=200, ge=1)
    """An upload may expand to at most this many times its own size (every archive format;
    counted while extracting)."""
    max_json_body_bytes: int = Field(default=1024**2, ge=1024)
    """The largest request body of every other route (JSON bodies; refused as it arrives)."""
    task_soft_time_limit_s: int = 7 * 24 * 3600
    task_time_limit_s: int = 7 * 24 * 3600 + 600

    @property
    def gpu_queue(self) -> str:
        return f"{self.queue_prefix}gpu"

    @property
    def cpu_queue(self) -> str:
        return f"{self.queue_prefix}cpu"

    @property
    def jobs_dir(self) -> Path:
        return self.data_root / "jobs"

    @property
    def auth_required(self) -> bool:
        if self.auth != "auto":
            return self.auth == "required"
        return not is_loopback(self.host)


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
