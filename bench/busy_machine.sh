#!/usr/bin/env bash
# The main job idle and beside one CPU-bound neighbour (`yes > /dev/null`), in one run, for
# lockstep's OpenMP waiting (passive, the default) and for libgomp's spinning (GOMP_SPINCOUNT set
# to its default, which also stops lockstep choosing passive): the ratios bench/RESULTS.md records
# under "A busy machine". Every run makes its own warm start in a fresh cache, as a first
# `lockstep train` does.
# Usage: bench/busy_machine.sh [BUILD_DIR] [-- lockstep train args]
#   default train args: --pretrain-steps 200 --steps 20 (the main job's model, task, recipe and
#   batch sizes, a fifth of its warm start and of its RL steps); `--` alone runs the full job.
set -euo pipefail
build=${1:-build}
shift || true
args=(--pretrain-steps 200 --steps 20)
if [[ ${1:-} == -- ]]; then
  shift
  args=("$@")
fi
bin=$(realpath "$build/lockstep")
work=$(mktemp -d /tmp/lockstep-busy.XXXXXX)
trap 'kill $busy 2>/dev/null || true; rm -rf "$work"' EXIT
busy=

one() {  # one(label, env...) -> prints "label seconds load"
  local label=$1
  shift
  local d
  d=$(mktemp -d "$work/run.XXXX")
  local t0 t1
  t0=$(date +%s.%N)
  env "$@" "$bin" train "${args[@]}" --cache-dir "$d/cache" --out "$d/run" >/dev/null 2>&1
  t1=$(date +%s.%N)
  printf '%-34s %8.1f s   load %s\n' "$label" "$(echo "$t1 - $t0" | bc)" \
    "$(cut -d' ' -f1 /proc/loadavg)"
  rm -rf "$d"
}

echo "lockstep train ${args[*]}  ($(nproc) CPUs, $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
one "passive (default), idle"
one "spinning (GOMP_SPINCOUNT=300000), idle" GOMP_SPINCOUNT=300000
yes >/dev/null &
busy=$!
one "passive (default), beside yes"
one "spinning (GOMP_SPINCOUNT=300000), beside yes" GOMP_SPINCOUNT=300000
kill $busy
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
