"""Publish jobs take where Triton runs the network, where it caches TensorRT engines and
how many instances of each model it runs from the worker's settings."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from maskops.serving.placement import ENGINE_CACHE_ROOT, Placement
from maskops.serving.publish_options import NETWORK_QUEUE_DELAY_US
from maskops_core.settings import Settings
from maskops_worker.actions.publish import _network_options
from maskops_worker.contract import JobContext


def _options(settings: Settings) -> dict[str, Any]:
    context = SimpleNamespace(settings=settings)  # all that the options read
    return _network_options(cast(JobContext, context))


def test_the_engine_cache_defaults_to_the_triton_images_root() -> None:
    options = _options(Settings(triton_device="gpu", triton_gpus=[1]))
    assert options["placement"] == Placement("gpu", (1,))
    assert options["engine_cache_root"] == ENGINE_CACHE_ROOT


def test_an_operators_engine_cache_is_written_into_the_configs() -> None:
    settings = Settings(triton_engine_cache="/srv/trt")
    assert _options(settings)["engine_cache_root"] == "/srv/trt"


def test_the_instance_counts_and_batching_wait_come_from_the_operators_environment(
    monkeypatch,
) -> None:
    defaults = _options(Settings())
    assert (defaults["instances"], defaults["processing_instances"]) == (1, 1)
    assert defaults["max_queue_delay_us"] == NETWORK_QUEUE_DELAY_US
    monkeypatch.setenv("MASKOPS_TRITON_INSTANCES", "2")
    monkeypatch.setenv("MASKOPS_TRITON_PROCESSING_INSTANCES", "4")
    monkeypatch.setenv("MASKOPS_TRITON_MAX_QUEUE_DELAY_US", "0")
    options = _options(Settings())
    assert (options["instances"], options["processing_instances"]) == (2, 4)
    assert options["max_queue_delay_us"] == 0
