#!/usr/bin/env bash
# Choose the demo bundle's alert policy (hysteresis margin, cooldown) on the validation streams its
# threshold was calibrated on (seeds 200000-200039, never the test streams or the demo's seed), and record
# it in sdqes_edge/data/demo_bundle/manifest.json. The threshold itself stays the one training chose. About a minute.
#
#   scripts/calibrate_demo_policy.sh [WORK_DIR] [BUNDLE]      (defaults runs/demo-policy, sdqes_edge/data/demo_bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-runs/demo-policy}
bundle=${2:-sdqes_edge/data/demo_bundle}
sdqes=.venv/bin/sdqes-edge
[ -x "$sdqes" ] || { echo "calibrate_demo_policy: run scripts/setup.sh first" >&2; exit 2; }
validation=$(.venv/bin/python -c "from sdqes_edge.train_options import split_seeds; s = split_seeds('val', 40); print(s[0])")

rm -rf "$work"
"$sdqes" synth --out "$work/data" --train 0 --val 40 --test 0 --seed "$validation"
for video in "$work"/data/videos/*.avi; do
  uid=$(basename "$video" .avi)
  # Each stream's own queries, as the demo asks them.
  mapfile -t queries < <(.venv/bin/python -c "
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    if row['video_uid'] == sys.argv[2]:
        print(row['query'])" "$work/data/annotations.csv" "$uid")
  args=()
  for q in "${queries[@]}"; do args+=(--query "$q"); done
  "$sdqes" run "$bundle" --source "$video" "${args[@]}" --scores "$work/scores" --quiet 2>/dev/null
done
"$sdqes" eval --annotations "$work/data/annotations.csv" --split val --scores "$work/scores" --calibrate-policy \
  --write-threshold "$bundle" --plots 0 --out "$work/eval"
