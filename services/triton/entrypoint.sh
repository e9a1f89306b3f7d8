#!/usr/bin/env bash
# Build TensorRT engines for published networks, then run tritonserver with the given args.
#
# For every network part _<model>.net whose config.pbtxt says platform "tensorrt_plan", each
# version folder holding model.onnx but no model.plan gets one, built by trtexec at the
# precision recorded by `maskops publish` (settings.json: data_type fp32 | fp16 | int8; int8 graphs are QDQ, so
# TensorRT takes the scales from the graph and needs no calibrator). The graph serves one
# image (batch 1); Triton batches requests in front of it.
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
    data_type="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_type"])' \
      "$version_dir/settings.json")"
    flags=()
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
