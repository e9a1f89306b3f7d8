#!/usr/bin/env bash
# Build TensorRT engines for published networks, then run tritonserver with the given args.
#
# For every network part _<model>.net whose config.pbtxt says platform "tensorrt_plan", each
# version folder holding model.onnx but no model.plan gets one, built by trtexec at the
# precision recorded by `maskops publish` (settings.json: data_type fp32 | fp16 | int8; int8 graphs are QDQ, so
# TensorRT takes the scales from the graph and needs no calibrator). The graph takes a batch
# [N, 3, H, W]: a dynamic N gets the optimisation profile 1..max_batch_size (settings.json,
# the network's Triton max_batch_size), tuned for max_batch_size since Triton's dynamic
# batcher fills batches under load; a static N (older exports: 1) needs no profile.
set -euo pipefail

REPO=/models
for arg in "$@"; do
  case "$arg" in --model-repository=*) REPO="${arg#*=}" ;; esac
done

shopt -s nullglob
for config in "$REPO"/_*.net/config.pbtxt; do
  grep -q 'platform: "tensorrt_plan"' "$config" || continue
  model_dir="$(dirname "$config")"
  for version_dir in "$model_dir"/[0-9]*/; do
    onnx="$version_dir/model.onnx"; plan="$version_dir/model.plan"
    [[ -f "$onnx" && ! -f "$plan" ]] || continue
    read -r data_type shapes < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
h, w = s["image_size"]
dynamic = "max_batch_size" in s and s.get("static_batch_size") is None
b = s.get("max_batch_size", 1)
print(s["data_type"], f"images:1x3x{h}x{w},images:{b}x3x{h}x{w}" if dynamic else "-")
' "$version_dir/settings.json")
    flags=()
    if [[ "$shapes" != "-" ]]; then
      flags+=(--minShapes="${shapes%%,*}" --optShapes="${shapes#*,}" --maxShapes="${shapes#*,}")
    fi
    case "$data_type" in
      fp16) flags+=(--fp16) ;;
      int8) flags+=(--int8 --fp16) ;;
    esac
    echo "maskops-triton: building TensorRT engine ($data_type) for $version_dir"
    trtexec --onnx="$onnx" --saveEngine="$plan.tmp" "${flags[@]}" --skipInference
    mv "$plan.tmp" "$plan"
  done
done

exec tritonserver "$@"
