#!/usr/bin/env bash
# How learnable the demo data is: train the quick recipe (bench/demo_recipe_resnet10.txt)
# from scratch on a fresh synthetic dataset and print box/mask AP at each evaluation.
#   bash bench/demo_recipe.sh [WORK_DIR]      (about 30 minutes on 2 idle CPU cores)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
maskops="$repo/.venv/bin/maskops"
mkdir -p "$work" && cd "$work"
cp "$repo/bench/demo_recipe_resnet10.txt" spec.txt
"$maskops" demo-data -o demo --images 400 --size 128 128 --seed 1 >/dev/null
for split in train val; do
  "$maskops" dataset_convert -i "demo/images/$split" -a "demo/annotations/$split.json" -o shards >/dev/null
done
start=$(date +%s)
"$maskops" train -e spec.txt -d run 2>train.log
echo "training + evaluation: $(( $(date +%s) - start )) s"
grep -E "step [0-9]+/[0-9]+: AP:" train.log | sed -E 's/^.*(step [0-9]+\/[0-9]+): AP: ([0-9.]+).*mask_AP: ([0-9.]+).*/\1  box AP \2  mask AP \3/'
