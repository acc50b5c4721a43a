#!/usr/bin/env bash
# What long-range attention buys: two models of equal attention cost trained on longattn-train's
# synthetic long-range task (a key-value pair at the start of a 2048-token sequence, its key
# asked at the end, 2045 filler tokens between), LongNet dilated attention against a
# local-window block-sparse pattern. Prints each model's FLOPs per step and its validation
# losses (the loss counts only the asked value: ln 26 = 3.26 is a guess among the 26 letters).
# Options after the steps go to both runs (e.g. --pairs 16 --queries 4: associative recall).
#
#   perf_tests/train_long_range.sh <build-dir> [steps (default 200)] [longattn-train options...]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: perf_tests/train_long_range.sh <build-dir> [steps] [options...]" >&2; exit 2; }
program=$(cd "$1" && pwd)/apps/train/longattn-train
steps=${2:-200}
[ $# -ge 2 ] && shift 2 || shift 1
out=$(mktemp -d)
common=(--task long_range --context 2048 --pairs 1 --queries 1 --layers 2 --embed 64 --heads 4 --batch 8
        --steps "$steps" --lr 3e-3 --min-lr 3e-4 --warmup 20 --eval-every 25 --eval-batches 4 --quiet)
# Equal cost: dilated w=256 r=1 and w=2048 r=2 (LongNet: heads split over the 2 offsets)
# computes 2.5% fewer FLOPs per step than a 384-token local window in 64-token blocks.
declare -A kinds=([dilated]="dilated:w=256,2048;r=1,2" [local_window]="block_sparse:pattern=local_window;radius=384")
for kind in dilated local_window; do
  "$program" "${common[@]}" --attention "${kinds[$kind]}" --json "$out/$kind.json" "$@" > "$out/$kind.log"
done
python3 - "$out" <<'PY'
import json, sys
for kind in ("dilated", "local_window"):
    s = json.load(open(f"{sys.argv[1]}/{kind}.json"))
    evals = ", ".join(f"{e['step']}: {e['loss']:.3f}" for e in s["evals"])
    print(f"{kind:13s} {s['config']['attention']:45s} {s['flops_per_step'] / 1e9:6.2f} GFLOP/step  "
          f"{s['summary']['seconds']:6.1f} s  validation loss by step: {evals}")
PY
rm -rf "$out"
