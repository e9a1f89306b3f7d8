#!/usr/bin/env bash
# The demo walk's learning curve (mask AP against steps and minutes of training) on this
# machine: see bench/demo_recipe.py. About seven minutes on 2 idle CPU cores.
#   bash bench/demo_recipe.sh [--steps N] [--eval-every N] [--out FILE]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
exec "$repo/.venv/bin/python" "$repo/bench/demo_recipe.py" "$@"
