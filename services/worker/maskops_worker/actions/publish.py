"""The ``publish`` action: an export (or a checkpoint, for the torch net backend) written
into the Triton model repository and rolled out on every Triton replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maskops.tasks import PUBLISH
from maskops_core import job_state
from maskops_core.actions import JobAction
from maskops_core.settings import ReplicaLookupError, Settings
from maskops_worker.actions.common import declared_job_options
from maskops_worker.contract import JobContext, JobInputError


def publish(ctx: JobContext) -> dict[str, Any]:
    """Write the parent export into the Triton model repository and roll it out on every
    Triton replica.

    The new version is listed only once every replica serves it (or no Triton is
    configured): when one cannot load it, the publish is undone, the version before it
    serves again on every replica, and the job fails saying why, replica by replica.
    """
    from maskops.serving import PublishError
    from maskops.serving.protocol import ImageLimits
    from maskops.serving.rollout import RolloutFailed, publish_and_roll_out

    job, settings = ctx.job, ctx.settings
    # The job names the model; where and how it is served is the operator's settings.
    name = declared_job_options(ctx, PUBLISH)[1].name
    source = _publish_source(ctx)
    replicas = _replicas(ctx)
    try:
        version, rollout = publish_and_roll_out(
            source,
            settings.model_repository,
            name,
            replicas,
            log=ctx.job_log.write,
            **_network_options(ctx),
            # The API's limits, so that Triton called directly refuses what /infer does.
            image_limits=ImageLimits(**settings.infer_image_limits),
        )
    except PublishError as exc:
        raise JobInputError(f"publish {name!r}: {exc}") from None
    except RolloutFailed as failed:
        raise JobInputError(str(failed)) from None
    note = "" if replicas else "no Triton configured; the version is in the repository"
    assert job.parent_job_id is not None  # _publish_source checked
    job_state.record_published_model(
        ctx.factory, name=name, version=version, export_job_id=job.parent_job_id
    )
    ctx.report(1, 1)
    states = rollout.states() if rollout else {}
    served = bool(replicas)
    return {"name": name, "version": version, "served": served, "note": note, "replicas": states}


def _publish_source(ctx: JobContext) -> Path:
    """What the network serves: the parent export's ONNX; for the torch net backend a
    checkpoint: the parent train or prune job's, or the one the parent export was made
    from."""
    job = ctx.job
    result, parent = job.parent_result or {}, f"{job.parent_action} job {job.parent_job_id}"
    if job.parent_job_id is None or job.parent_action not in JobAction.publish.spec.parents:
        raise JobInputError("publish needs parent_job_id of a succeeded export, train or prune job")
    torch = _net_backend(ctx.settings) == "torch"
    if not torch and job.parent_action != "export":
        raise JobInputError(f"{parent}: its checkpoint is served by the torch net backend only")
    if not torch:
        return ctx.input_path(str(result.get("onnx") or ""), f"the ONNX of {parent}")
    key = "source_checkpoint" if job.parent_action == "export" else "checkpoint"
    return ctx.input_path(str(result.get(key) or ""), f"the checkpoint of {parent}")


def _net_backend(settings: Settings) -> str:
    """The net backend publishes get (``auto``: the placement's default)."""
    from maskops.serving.placement import Placement

    if settings.triton_net_backend != "auto":
        return settings.triton_net_backend
    return Placement(settings.triton_device).default_net_backend()


def _network_options(ctx: JobContext) -> dict[str, Any]:
    """The publish arguments of the operator's Triton settings (where the network runs,
    on which backend, the TensorRT an engine must match, how many instances, how long
    the network waits to fill a batch)."""
    from maskops.serving.placement import ENGINE_CACHE_ROOT, Placement

    settings = ctx.settings
    device = settings.triton_device
    backend = settings.triton_net_backend
    # The tensorrt backend's engine is <onnx stem>.engine next to the export's ONNX
    # (`maskops gen_trt_engine -m ONNX -r ITS_FOLDER` on a host with Triton's TensorRT).
    return {
        "placement": Placement(device, tuple(settings.triton_gpus)),
        "net_backend": None if backend == "auto" else backend,
        "triton_tensorrt_version": settings.triton_tensorrt_version or None,
        "engine_cache_root": settings.triton_engine_cache or ENGINE_CACHE_ROOT,
        "precision": settings.triton_precision,
        "instances": settings.triton_instances,
        "processing_instances": settings.triton_processing_instances,
        "max_queue_delay_us": settings.triton_max_queue_delay_us,
    }


def _replicas(ctx: JobContext) -> list[str]:
    """The Triton replicas to publish to, looked up now; none when no Triton is set."""
    try:
        replicas = ctx.settings.triton_replicas()
    except ReplicaLookupError as exc:
        raise JobInputError(f"cannot find the Triton replicas: {exc}") from None
    if ctx.settings.has_triton and not replicas:
        raise JobInputError("MASKOPS_TRITON_DNS resolves to no Triton replica")
    return replicas
