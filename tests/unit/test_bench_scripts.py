"""The benchmark scripts run, end to end, at tiny sizes, and write what their readers expect.

Correctness only: the figures of such runs mean nothing (tiny sizes, a machine shared with
the rest of the suite); the published ones come from idle runs (bench/readme_table.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler
from torchvision.ops import MultiScaleRoIAlign

from maskops.modeling import build_model
from maskops.spec.models import MaskRCNNConfig
from tests.support.bench import load_bench_module, run_bench

timing = load_bench_module("timing")
machine = load_bench_module("machine")


def _results(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["machine"]["cpus"] >= 1 and doc["machine"]["torch"]
    assert set(doc["load_average"]) == {"before", "after"}
    assert isinstance(doc["loaded"], bool)
    assert doc["command"].startswith("python bench/")
    return doc


def test_arms_alternate_within_each_round() -> None:
    calls: list[str] = []

    def arm(name: str, value: float) -> Any:
        def measure() -> float:
            calls.append(name)
            return value

        return measure

    a, b = timing.alternate([arm("a", 1.0), arm("b", 2.0)], rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert a.values == (1.0, 1.0, 1.0) and b.median == 2.0
    spread = timing.Spread((3.0, 1.0, 2.0, 10.0))
    assert spread.summary("s") == {"median_s": 2.5, "min_s": 1.0, "max_s": 10.0, "rounds": 4}
    assert spread.percentile(50) == 2.0 and spread.percentile(99) == 10.0


def test_a_run_above_the_core_count_is_marked_loaded() -> None:
    cores = machine.usable_cores()
    busy = machine.RunConditions(load_before=[cores + 1.0, 0.0, 0.0])
    assert busy.record()["loaded"] is True
    assert busy.record()["load_average"]["before"][0] == cores + 1.0


SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def test_other_processes_cpu_time_marks_a_run_loaded_and_its_own_does_not() -> None:
    own = machine.RunConditions(load_before=[0.0, 0.0, 0.0])
    subprocess.run([sys.executable, "-c", SPIN.format(s=1.0)], check=True)  # waited: ours
    own_share = own.record()["other_work_share"]

    shared = machine.RunConditions(load_before=[0.0, 0.0, 0.0])
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN.format(s=2.0)])
        for _ in range(os.cpu_count() or 1)
    ]
    time.sleep(1.5)
    record = shared.record()  # the spinners still run: not this benchmark's processes
    for spinner in spinners:
        spinner.wait()
    assert record["loaded"] is True
    assert record["other_work_share"] > machine.OTHER_WORK_LIMIT
    assert record["other_work_share"] > own_share + 0.3


SERVER = (
    "import os, subprocess, sys\n"
    "workers = [subprocess.Popen([sys.executable, '-c', os.environ['SPIN']]) for _ in range({n})]\n"
    "for worker in workers: worker.wait()"
)


def test_a_run_ended_while_its_server_runs_counts_the_servers_workers_as_its_own() -> None:
    """A benchmark's server and the workers it starts (Triton's python stubs, say) are
    not waited for by the benchmark: ended while they run, their time is the run's."""
    run = machine.RunConditions(load_before=[0.0, 0.0, 0.0])
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER.format(n=os.cpu_count() or 1)],
        env={**os.environ, "SPIN": SPIN.format(s=2.0)},
    )
    time.sleep(1.5)
    as_other_work = run.record()["other_work_share"]
    run.end_now()
    server.wait()
    assert run.record()["other_work_share"] < as_other_work - 0.25


def test_bench_eval_tiny(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    run_bench("bench_eval.py", "--images", "2", "--detections", "10", "--height", "128",
              "--width", "192", "--rounds", "1", "--out", str(out))  # fmt: skip
    doc = _results(out)
    assert doc["metrics_identical"] is True
    assert "1" in doc["by_threads"]
    for row in doc["by_threads"].values():
        assert row["identical_rles"] == "20/20"
        assert row["maskops_end_to_end"]["median_s"] > 0
        assert row["speedup_vs_reference"] > 0 and row["speedup_vs_hybrid"] > 0


def test_bench_train_tiny(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    run_bench("bench_train.py", "--nlayers", "10", "--image-size", "128", "128", "--batch", "1",
              "--steps", "1", "--warmup", "1", "--rounds", "1", "--coco-shaped", "--heads",
              "tiny", "--arms", "torchvision-fp32", "maskops-fp32", "--out", str(out))  # fmt: skip
    doc = _results(out)
    assert doc["config"]["heads"] == "tiny"
    assert set(doc["arms"]) == {"torchvision-fp32", "maskops-fp32"}
    for arm in doc["arms"].values():
        assert arm["median_images_per_s"] > 0 and arm["peak_rss_mb"] > 0
        assert len(arm["mean_loss_by_round"]) == 1 and arm["mean_loss_by_round"][0] > 0
    assert doc["maskops_vs_torchvision"]["fp32"]["ratio"] > 0


def test_a_variant_arm_that_fails_is_recorded_and_the_others_go_on(tmp_path: Path) -> None:
    """A switch that cannot run on this device (a compile mode, say) costs its own arm,
    once: its error is kept, it is not started again, and it gives no ratio."""
    bench_train = load_bench_module("bench_train")
    args = argparse.Namespace(nlayers=10, image_size=[128, 128], batch=1, steps=1, warmup=1,
                              workers=0, threads=1, device="cpu", coco_shaped=False,
                              heads="tiny")  # fmt: skip
    recorded: dict[str, Any] = {}
    arm = "maskops-fp32-nosuch"  # no such switch: the arm's process fails at its start
    assert math.isnan(bench_train.run_arm(arm, tmp_path, args, recorded))
    assert recorded[arm]["failed"].startswith("exit 1: KeyError: 'nosuch'")
    started = time.monotonic()
    assert math.isnan(bench_train.run_arm(arm, tmp_path, args, recorded))
    assert time.monotonic() - started < 0.5  # not run again
    spreads = {"maskops-fp32": timing.Spread((2.0,)), arm: timing.Spread((math.nan,))}
    assert bench_train.tuning_ratios(spreads) == {}
    assert bench_train.arm_summary(spreads[arm], recorded[arm]) == recorded[arm]
    with pytest.raises(SystemExit, match="arm maskops-fp32 failed"):  # not a variant: the end
        bench_train.run_arm("maskops-fp32", tmp_path / "no-data", args, {})


def test_coco_shaped_data_is_crowded_resized_and_flipped_alike(tmp_path: Path) -> None:
    """COCO-shaped benchmark data: 5-30 instances an image, drawn at 480x640 (so resized to
    the training size), flips on in maskops' spec and in the baseline's loader alike."""
    synthetic = load_bench_module("synthetic")
    bench_train = load_bench_module("bench_train")
    synthetic.prepare_shards(tmp_path, train_images=3, image_size=(128, 192), coco_shaped=True)
    coco = json.loads((tmp_path / "demo" / "annotations" / "train.json").read_text())
    counts = [sum(a["image_id"] == i["id"] for a in coco["annotations"]) for i in coco["images"]]
    assert all(5 <= n <= 30 for n in counts) and len(set(counts)) > 1
    assert {(i["height"], i["width"]) for i in coco["images"]} == {(480, 640)}
    args = type("Args", (), {"coco_shaped": True})()
    spec = synthetic.throughput_spec(
        tmp_path, steps=1, batch=1, image_size=(128, 192), nlayers=10, workers=0, augment=True
    )
    assert spec.data_config.augment_input_data and bench_train.coco_shaped(args)
    images = tmp_path / "demo" / "images" / "train"
    ann = tmp_path / "demo" / "annotations" / "train.json"
    plain = bench_train.CocoJsonDataset(images, ann, (128, 192))
    image, target = plain[0]
    flipped, mirrored = bench_train._flip(image, target, width=171)  # 640 * 128 / 480
    assert torch.equal(flipped[:, :, :171].flip(-1), image[:, :, :171])
    assert torch.equal(mirrored["masks"][:, :, :171].flip(-1), target["masks"][:, :, :171])
    assert torch.allclose(mirrored["boxes"][:, [2, 0]], 171 - target["boxes"][:, [0, 2]])


def test_data_prepared_for_more_images_is_reused_and_other_data_is_drawn_again(
    tmp_path: Path,
) -> None:
    """The GPU check's batch sweep draws its COCO-shaped data once, for the largest batch."""
    synthetic = load_bench_module("synthetic")
    size = {"image_size": (64, 64)}
    first = synthetic.prepare_shards(tmp_path, train_images=6, **size)
    assert first["train_images"] >= 6 and first["images"] == synthetic.images_for(6)
    shard = next((tmp_path / "shards").glob("train-*"))
    written = shard.stat().st_mtime_ns
    assert synthetic.prepare_shards(tmp_path, train_images=4, **size) == first
    assert shard.stat().st_mtime_ns == written  # not drawn again
    larger = synthetic.prepare_shards(tmp_path, train_images=9, **size)
    assert larger["train_images"] >= 9
    resized = synthetic.prepare_shards(tmp_path, train_images=4, image_size=(64, 96))
    assert resized["as"]["drawn_size"] == [64, 96] and resized["train_images"] < 9
    train = json.loads((tmp_path / "demo" / "annotations" / "train.json").read_text())
    assert len(train["images"]) == resized["train_images"]
    assert {(i["height"], i["width"]) for i in train["images"]} == {(64, 96)}


def test_the_tiny_heads_replace_taos_and_nothing_else(tmp_path: Path) -> None:
    from maskops.spec.models import MaskRCNNConfig

    synthetic = load_bench_module("synthetic")
    sizes = {"steps": 1, "batch": 1, "image_size": (128, 128), "nlayers": 10, "workers": 0}
    tao = synthetic.throughput_spec(tmp_path, **sizes)
    tiny = synthetic.throughput_spec(tmp_path, **sizes, heads="tiny")
    assert tao.maskrcnn_config == MaskRCNNConfig(nlayers=10)
    assert tiny.maskrcnn_config == MaskRCNNConfig(nlayers=10, **synthetic.TINY_HEADS)
    assert tiny.model_copy(update={"maskrcnn_config": tao.maskrcnn_config}) == tao


def test_profile_train_tiny(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    run_bench("profile_train.py", "--nlayers", "10", "--image-size", "128", "128", "--batch",
              "1", "--steps", "2", "--warmup", "1", "--no-amp", "--heads", "tiny", "--out",
              str(out))  # fmt: skip
    doc = _results(out)
    assert doc["config"]["heads"] == "tiny"
    assert doc["steps"] == 2 and doc["step_ms"] > 0 and doc["gpu_busy_fraction"] is None
    # No `.item()`: the step's reads are the `tolist` calls counted below (the degenerate
    # target-box check travels in the proposals' count).
    assert doc["item_calls"] == 0
    assert len(doc["top_cpu_ops"]) == load_bench_module("profile_train").TOP
    # The step's reads by name: the proposals kept, the positives, the two poolers' levels;
    # NMS on a CPU loops over the levels of this many boxes (torchvision's choice there).
    assert doc["host_reads"]["Tensor.tolist"] == 4
    assert doc["host_reads"]["torchvision.nms.default"] >= 1
    # A tiny step dispatches a couple of thousand operators; no kernel is launched.
    assert 1000 < doc["operators"] < 5000 and doc["kernel_launches"] is None


def test_bench_serving_steps_times_each_host_step_of_both_paths(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    run_bench("bench_serving_steps.py", "--outputs", "synthetic", "--images", "2", "--rounds",
              "2", "--out", str(out))  # fmt: skip
    doc = _results(out)
    steps = doc["ms_per_image"]
    assert len(steps) >= 6 and all(row["median_ms"] > 0 for row in steps.values())
    assert set(doc["served_vs_in_process"]) == {"preprocessing", "postprocessing"}
    assert all(ratio > 0 for ratio in doc["served_vs_in_process"].values())


def test_sync_sites_counts_only_synchronising_calls(tmp_path: Path) -> None:
    """On a CPU nothing synchronises; the data's own warnings (pycocotools' under numpy 2,
    one per mask decoded) are not counted as syncs."""
    out = tmp_path / "sites.json"
    run_bench("sync_sites.py", "--device", "cpu", "--steps", "3", "--out", str(out))
    doc = json.loads(out.read_text())
    assert doc["per_step"] == [0, 0, 0] and doc["sites"] == {} and doc["gpu"] is None


def test_a_sync_is_put_at_the_innermost_line_of_maskops_or_torchvision() -> None:
    import traceback

    call_site = load_bench_module("sync_sites").call_site
    site = "/x/site-packages"
    stack = [
        traceback.FrameSummary(f"{site}/maskops/training/trainer.py", 10, "step"),
        traceback.FrameSummary(
            f"{site}/torchvision/models/detection/_utils.py", 157, "encode_single"
        ),
        traceback.FrameSummary(f"{site}/torch/_tensor.py", 5, "__torch_function__"),
    ]
    assert call_site(stack) == "torchvision/models/detection/_utils.py:157 encode_single"
    assert call_site(stack[2:]) == "elsewhere"


def test_kernels_that_overlap_count_once_in_the_gpu_busy_time() -> None:
    busy_us = load_bench_module("profile_train").busy_us
    assert busy_us([(20, 25), (0, 10), (5, 15), (21, 22)]) == 20
    assert busy_us([]) == 0


def test_the_training_baseline_computes_the_same_losses_and_gradients() -> None:
    """The torchvision arm's stock poolers and per-image sampling code change how a step
    runs, not what it computes from the same samples."""
    bench_train = load_bench_module("bench_train")
    config = MaskRCNNConfig(nlayers=10, train_rpn_pre_nms_topn=200, train_rpn_post_nms_topn=100,
                            batch_size_per_im=64, fast_rcnn_mlp_head_dim=64)  # fmt: skip
    torch.manual_seed(0)
    ours = build_model(config, num_classes=3, image_size=(128, 128))
    baseline = bench_train.with_torchvision_parts(copy.deepcopy(ours))
    assert type(baseline.roi_heads.mask_roi_pool) is MultiScaleRoIAlign
    assert type(baseline.rpn.fg_bg_sampler) is BalancedPositiveNegativeSampler
    # The baseline replays the samples ours draws: the same proposals and RoIs in both.
    for part in ("rpn", "roi_heads"):
        recorded = _Recorded(getattr(ours, part).fg_bg_sampler)
        getattr(ours, part).fg_bg_sampler = recorded
        getattr(baseline, part).fg_bg_sampler = _Replayed(recorded)
    images = [torch.rand(3, 128, 128) for _ in range(2)]
    masks = torch.zeros(2, 128, 128, dtype=torch.uint8)
    masks[0, 20:60, 30:90] = masks[1, 70:120, 10:50] = 1
    target = {"boxes": torch.tensor([[30.0, 20, 90, 60], [10, 70, 50, 120]]),
              "labels": torch.tensor([1, 2]), "masks": masks}  # fmt: skip
    results = []
    for model in (ours, baseline):
        model.train()
        losses = model(images, [target, target])
        sum(losses.values()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append(({k: v.item() for k, v in losses.items()}, grads))
    (our_losses, our_grads), (base_losses, base_grads) = results
    assert our_losses == pytest.approx(base_losses, rel=1e-5)
    assert our_grads.keys() == base_grads.keys()
    for name, grad in our_grads.items():
        # The two poolers sum in float32 in different orders: with one thread on an AVX2
        # CPU, a mask-head kernel's gradients then differ by up to 1.4e-3 of its largest
        # (1.6e-6 of 1.2e-3), conv1's by 7e-5. The bound follows each tensor's scale; a
        # change in what is computed moves a gradient by a good part of it.
        scale = float(base_grads[name].abs().max())
        torch.testing.assert_close(grad, base_grads[name], rtol=1e-4, atol=1e-2 * scale, msg=name)


class _Recorded:
    """A sampler that keeps every draw of the one it wraps."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.batch_size_per_image = sampler.batch_size_per_image
        self.draws: list[Any] = []

    def __call__(self, labels: list[torch.Tensor]) -> Any:
        self.draws.append(self.sampler(labels))
        return self.draws[-1]


class _Replayed:
    """A sampler that gives the recorded draws back in order."""

    def __init__(self, recorded: _Recorded) -> None:
        self.recorded = recorded
        self.batch_size_per_image = recorded.batch_size_per_image

    def __call__(self, labels: list[torch.Tensor]) -> Any:
        return self.recorded.draws.pop(0)


def test_bench_serving_tiny(tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    run_bench("bench_serving.py", "--nlayers", "10", "--image-size", "128", "128", "--reps",
              "1", "--detections", "10", "--postprocess-hw", "64", "96", "--seconds", "1",
              "--open-loop-requests", "3", "--out", str(out))  # fmt: skip
    doc = _results(out)
    arms = doc["network"][0]["batch_1"]["arms"]
    assert {"eager_fp32", "ort_fp32", "ort_int8"} <= set(arms)
    for figures in arms.values():
        assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"]
    assert doc["postprocess"][0]["speedup"] > 0
    # Through the real API process and Triton, with dynamic batching on and off.
    triton = doc["triton"]
    assert triton["api_infer"]["p50_ms"] > 0 and triton["cold_start_s"] > 0
    assert set(triton["api_infer_under_load"]) == {"dynamic_batching_on", "dynamic_batching_off"}
    for mode in triton["api_infer_under_load"].values():
        assert mode["capacity_images_per_s"] > 0
        assert [row["load"] for row in mode["open_loop"]] == [0.5, 0.8, 1.2]
        assert all(row["failures"] == 0 and row["requests"] == 3 for row in mode["open_loop"])


def test_the_former_configs_differ_from_publishs_in_the_image_type_and_the_waits(
    tmp_path: Path, tiny_checkpoint: Path
) -> None:
    """bench_served_overhead's baseline: publish's configs with float images and 2 ms waits
    in the processing models (its Triton run is timed by hand: bench/results)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from maskops.serving import EnsembleNames

    overhead = load_bench_module("bench_served_overhead")
    gpu_serving = load_bench_module("gpu_serving")
    for name in ("now", "before"):
        gpu_serving.publish_torch(tiny_checkpoint, tmp_path, name, "fp32", cuda=False)
    overhead.as_formerly_published(tmp_path, "before")

    def config(model: str) -> Any:
        text = (tmp_path / model / "config.pbtxt").read_text()
        return text_format.Parse(text, model_config_pb2.ModelConfig())

    def image_types(name: str) -> list[str]:
        names = EnsembleNames(name)
        tensors = [*config(names.preprocess).output, *config(names.net).input]
        return [model_config_pb2.DataType.Name(t.data_type) for t in tensors if t.name == "images"]

    def waits(name: str) -> list[int]:
        parts = EnsembleNames(name).parts
        return [config(part).dynamic_batching.max_queue_delay_microseconds for part in parts]

    assert image_types("now") == ["TYPE_UINT8"] * 2 and image_types("before") == ["TYPE_FP32"] * 2
    assert waits("now") == [0, 2000, 0] and waits("before") == [2000, 2000, 2000]
    with pytest.raises(RuntimeError, match="no queue delay of 0"):
        overhead.as_formerly_published(tmp_path, "before")  # already rewritten


def test_time_in_server_is_each_parts_time_per_request_between_two_readings() -> None:
    gpu_serving = load_bench_module("gpu_serving")
    ms = 1_000_000
    parts = {"ensemble": "m", **{p: f"_m.{p}" for p in ("preprocess", "net", "postprocess")}}
    before = {model: dict.fromkeys(("requests", "executions", "inferences"), 3)
              for model in parts.values()}  # fmt: skip
    for row in before.values():
        row.update({f"{p}_ns": 5 * ms for p in (*gpu_serving.STAT_PARTS, "success")})
    after = {
        model: {"requests": 7, "executions": 5, "inferences": 7, "success_ns": 45 * ms,
                **{f"{p}_ns": (5 + 4 * (i + 1)) * ms for i, p in enumerate(gpu_serving.STAT_PARTS)}}
        for model in parts.values()
    }  # fmt: skip
    figures = gpu_serving.time_in_server(before, after, "m")
    assert set(figures) == set(parts)
    # 4 requests in 2 batches; 40 ms in all, 10 a request; each part 4(i + 1) ms in all.
    assert figures["net"] == {
        "requests": 4, "mean_batch": 2.0, "total_ms": 10.0, "queue_ms": 1.0,
        "compute_input_ms": 2.0, "compute_infer_ms": 3.0, "compute_output_ms": 4.0,
    }  # fmt: skip
    assert gpu_serving.time_in_server(after, after, "m") == {}  # no request in between


def test_a_served_arms_network_settings_join_what_publish_wrote(
    tmp_path: Path, tiny_checkpoint: Path
) -> None:
    gpu_serving = load_bench_module("gpu_serving")
    gpu_serving.publish_torch(tiny_checkpoint, tmp_path, "m", "fp32", cuda=False)
    arm = gpu_serving.SERVED_ARMS["host_outputs"]
    gpu_serving.add_net_settings(tmp_path, "m", arm.net_settings)
    settings = json.loads((tmp_path / "_m.net" / "1" / "settings.json").read_text())
    assert settings["outputs_via_host"] is True and settings["precision"] == "fp32"
    assert arm.cuda_only and not gpu_serving.SERVED_ARMS["instances_2"].cuda_only


def test_the_serving_checks_tuning_arms_run_likeliest_first_and_on_a_cpu_only_what_acts_there(
    tmp_path: Path,
) -> None:
    gpu_serving = load_bench_module("gpu_serving")
    every = tuple(gpu_serving.SERVED_ARMS)

    def planned(cuda: bool) -> list[tuple[str, str]]:
        arms = gpu_serving.planned_arms(tmp_path, [], tmp_path, every, cuda=cuda,
                                        precision="fp32", seconds=1.0, batch=8)  # fmt: skip
        return [(section, key) for section, key, estimate_s, _ in arms if estimate_s > 0]

    assert planned(cuda=True) == [
        ("served", "clients_8_host_outputs"),
        ("served", "clients_8_processing_4"),
        ("in_process_eager", "batch_8_compiled"),
        ("in_process_eager", "batch_8_graphs"),
        ("served", "clients_8_instances_2"),
        ("in_process_eager", "batch_8_channels_last"),
    ]
    assert planned(cuda=False) == [
        ("served", "clients_8_processing_4"),
        ("served", "clients_8_instances_2"),
    ]


def test_settled_statistics_wait_for_the_answers_the_statistics_lag() -> None:
    """Triton reports a request's statistics after its answer: a reading waits until every
    part counts the requests sent, or until two readings agree."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    gpu_serving = load_bench_module("gpu_serving")
    models = ["m", "_m.preprocess", "_m.net", "_m.postprocess"]
    readings: list[int] = []
    caught_up_at = 3  # the reading from which the postprocess model counts all 5 requests

    class Stats(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            readings.append(1)
            lagging = "_m.postprocess" if len(readings) < caught_up_at else None
            body = json.dumps({"model_stats": [{
                "name": model, "execution_count": 1, "inference_count": 1,
                "inference_stats": {part: {"count": 4 if model == lagging else 5, "ns": 0}
                                    for part in ("success", *gpu_serving.STAT_PARTS)},
            } for model in models]}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"127.0.0.1:{server.server_address[1]}"
    try:
        since = {model: {"requests": 3} for model in models}
        after = gpu_serving.settled_statistics(url, "m", since=since, requests=2)
        assert len(readings) == 3 and after["_m.postprocess"]["requests"] == 5
        readings.clear()
        caught_up_at = 2
        assert gpu_serving.settled_statistics(url, "m")["_m.postprocess"]["requests"] == 5
        assert len(readings) == 3  # changed at the second reading, agreed at the third
    finally:
        server.shutdown()
        server.server_close()


def test_bench_precision_measures_each_serving_arm_on_a_model_that_detects(
    tmp_path: Path, trained_model: Any
) -> None:
    out = tmp_path / "precision.json"
    run_bench("bench_precision.py", "--checkpoint", str(trained_model.checkpoint),
              "--latency-images", "2", "--rounds", "1", "--out", str(out))  # fmt: skip
    doc = _results(out)
    arms = doc["arms"]
    assert set(arms) == {"eager_fp32", "eager_bf16_channels_last", "ort_fp32", "ort_int8"}
    reference = arms["eager_fp32"]
    assert reference["mask_AP"] == pytest.approx(trained_model.mask_ap, abs=0.02)
    assert reference["mask_AP_drop_points"] == 0 and reference["speedup_vs_eager_fp32"] == 1
    assert doc["validation_images"] == reference["images"] > 0
    # The fp32 export computes what PyTorch computes; reduced precisions stay close on a
    # model that detects (the export test's INT8 bound).
    assert abs(arms["ort_fp32"]["mask_AP_drop_points"]) <= 1.0
    for name in ("eager_bf16_channels_last", "ort_int8"):
        assert abs(arms[name]["mask_AP_drop_points"]) <= 3.0, arms[name]
    for name in ("ort_fp32", "ort_int8"):
        assert arms[name]["latency"]["median_ms_per_image"] > 0
        assert arms[name]["speedup_vs_best_eager"] > 0


def test_bench_data_pipeline_tiny(tmp_path: Path) -> None:
    out = tmp_path / "data.json"
    run_bench("bench_data_pipeline.py", "--images", "10", "--unique", "5", "--size", "96", "128",
              "--image-size", "128", "128", "--samples", "4", "--workers", "1", "--rounds", "1",
              "--draw-images", "2", "--out", str(out))  # fmt: skip
    doc = _results(out)
    assert doc["conversion"]["all"]["images"] == 10
    assert doc["pipeline"]["ratio"] > 0
    drawing = doc["drawing"]
    assert drawing["images"] == 2 and drawing["ratio"] > 0
    assert drawing["one_process"]["rounds"] == drawing["workers"]["rounds"] == 1


def test_bench_prune_tiny(tmp_path: Path) -> None:
    out = tmp_path / "prune.json"
    run_bench("bench_prune.py", "--archs", "10", "--image-size", "128", "128", "--thresholds",
              "0.5", "--repeats", "1", "--heads", "small", "--out", str(out))  # fmt: skip
    doc = _results(out)
    unpruned, pruned = doc["rows"]
    assert pruned["macs"] < unpruned["macs"]
    low, high = pruned["dense_latency_s_range"]
    assert low <= pruned["dense_latency_s"] <= high


def test_open_loop_counts_queueing_from_the_scheduled_time() -> None:
    """A server that takes 50 ms per call, one at a time, offered 40 calls/s (2x what it
    can do): latencies grow with the queue, and arrivals keep their rate regardless."""
    open_loop = load_bench_module("bench_serving").open_loop
    lock = threading.Lock()

    def serial_server() -> None:
        with lock:
            time.sleep(0.05)

    row = open_loop(serial_server, rate=40.0, requests=20)
    assert row["failures"] == 0
    assert 45 <= row["p50_ms"] < row["p99_ms"]
    # The last call waits behind 19 others: ~20 x 50 ms - its 0.475 s arrival offset.
    assert row["p99_ms"] >= 400
    assert row["images_per_s"] == pytest.approx(20, rel=0.3)
