#!/usr/bin/env bash
# Start tritonserver with the given args, after making this replica's TensorRT engine
# cache and building the TensorRT engines that repositories written by an older maskops
# still lack.
#
# Model control (load, unload: a load request can carry a python model's code) and the
# other administrative endpoints answer only requests with the control plane's key,
# MASKOPS_TRITON_CONTROL_KEY (maskops.serving.control); without a valid key the server
# does not start. gRPC is off: maskops speaks HTTP.
#
# The engine cache (MASKOPS_TRITON_ENGINE_CACHE, default /var/cache/maskops-trt, the
# root that publish writes into the onnxruntime backend's configs) holds one folder per
# network version, <net model>.<version>; onnxruntime creates only that folder, so the
# root must exist. Folders of versions no longer in a local repository are removed.
#
# Publish no longer needs this: on GPU hosts it writes Triton's onnxruntime backend with
# the TensorRT accelerator (Triton builds the engine when it loads the model), and the
# tensorrt backend takes only a model.plan built beforehand by `maskops gen_trt_engine`
# (docs/operations.md#gpu-serving). Older publishes wrote platform "tensorrt_plan" next to
# model.onnx alone: for each such version folder this builds model.plan with this image's
# trtexec (so with the TensorRT that Triton runs), at the precision recorded in
# settings.json (data_type fp32 | fp16 | int8; int8 graphs are QDQ, so TensorRT takes the
# scales from the graph) and, for a dynamic batch [N, 3, H, W], the profile
# 1..max_batch_size tuned for max_batch_size. A build that fails is logged and skipped:
# that model fails to load, every other model and the server start as usual.
set -uo pipefail

REPO=/models
for arg in "$@"; do
  case "$arg" in --model-repository=*) REPO="${arg#*=}" ;; esac
done
ENGINE_CACHE="${MASKOPS_TRITON_ENGINE_CACHE:-/var/cache/maskops-trt}"
# NVIDIA's images keep trtexec in TensorRT's folder, not always on PATH.
TRTEXEC="${TRTEXEC:-$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)}"

prepare_engine_cache() {  # the root, and no folder of a version the repository lost
  if ! mkdir -p "$ENGINE_CACHE"; then
    echo "maskops-triton: cannot make the engine cache $ENGINE_CACHE: GPU models of the" \
      "onnxruntime backend will not load (docs/operations.md#gpu-serving)" >&2
    return
  fi
  [[ -d "$REPO" ]] || return 0  # a remote repository: nothing to compare with
  local folder name
  for folder in "$ENGINE_CACHE"/_*.net.[0-9]*/; do
    folder="${folder%/}" name="${folder##*/}"
    if [[ ! -d "$REPO/${name%.*}/${name##*.}" ]]; then
      echo "maskops-triton: removing the engine cache of $name (no such version in $REPO)"
      rm -rf -- "$folder"
    fi
  done
}

build_engine() {  # build_engine VERSION_DIR: model.plan from model.onnx; non-zero on failure
  local version_dir="$1" onnx="$1/model.onnx" plan="$1/model.plan" data_type shapes
  read -r data_type shapes < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
h, w = s["image_size"]
dynamic = "max_batch_size" in s and s.get("static_batch_size") is None
b = s.get("max_batch_size", 1)
print(s["data_type"], f"images:1x3x{h}x{w},images:{b}x3x{h}x{w}" if dynamic else "-")
' "$version_dir/settings.json") || return 1
  local flags=()
  if [[ "$shapes" != "-" ]]; then
    flags+=(--minShapes="${shapes%%,*}" --optShapes="${shapes#*,}" --maxShapes="${shapes#*,}")
  fi
  case "$data_type" in
    fp16) flags+=(--fp16) ;;
    int8) flags+=(--int8 --fp16) ;;
  esac
  # A temporary of this process's own: replicas sharing the repository may build at once.
  local tmp
  tmp="$plan.tmp.${HOSTNAME:-host}.$$"
  echo "maskops-triton: building TensorRT engine ($data_type) for $version_dir"
  if "$TRTEXEC" --onnx="$onnx" --saveEngine="$tmp" "${flags[@]}" --skipInference; then
    mv "$tmp" "$plan"
  else
    rm -f "$tmp"
    return 1
  fi
}

restricted_api_argument() {  # Triton's flag, or the reason there is none on stderr
  python3 -c '
import os, sys
from maskops.serving.control import CONTROL_KEY_ENV, ControlKeyError, restricted_api_argument
try:
    print(restricted_api_argument(os.environ.get(CONTROL_KEY_ENV, "")))
except ControlKeyError as exc:
    sys.exit(f"maskops-triton: {exc}")
'
}

RESTRICTED_API="$(restricted_api_argument)" || exit 2

shopt -s nullglob
prepare_engine_cache
for config in "$REPO"/_*.net/config.pbtxt; do
  grep -q 'platform: "tensorrt_plan"' "$config" || continue
  for version_dir in "$(dirname "$config")"/[0-9]*/; do
    version_dir="${version_dir%/}"
    [[ -f "$version_dir/model.onnx" && ! -f "$version_dir/model.plan" ]] || continue
    if ! build_engine "$version_dir"; then
      echo "maskops-triton: no TensorRT engine for $version_dir (build failed, see above);" \
        "that model will not load: publish it again (docs/operations.md#gpu-serving)" >&2
    fi
  done
done

exec tritonserver "$@" --allow-grpc=false "$RESTRICTED_API"
