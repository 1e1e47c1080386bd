#!/usr/bin/env bash
# Rebuild the bundle that `sdqes-edge demo` ships (sdqes_edge/data/demo_bundle) from nothing: train the qrnn model on
# synthetic streams from its recorded seed, export it with the threshold calibrated on validation streams,
# and keep the training record beside it. About 5 minutes on two CPU cores.
#
#   scripts/make_demo_bundle.sh [RUN_DIR]        (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
run_dir=${1:-runs/demo}
sdqes=.venv/bin/sdqes-edge
[ -x "$sdqes" ] || { echo "make_demo_bundle: run scripts/setup.sh first" >&2; exit 2; }

"$sdqes" train --adapter qrnn --seed 0 --out "$run_dir"
record="$run_dir/synthetic+qrnn.record.json"
threshold=$(.venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['threshold'])" "$record")
# Export into a staging folder first: the shipped bundle is replaced only by a verified one.
"$sdqes" export --checkpoint "$run_dir/synthetic+qrnn.pt" --threshold "$threshold" --out "$run_dir/bundle"
cp "$record" "$run_dir/bundle/training_record.json"
rm -rf sdqes_edge/data/demo_bundle.old
[ -d sdqes_edge/data/demo_bundle ] && mv sdqes_edge/data/demo_bundle sdqes_edge/data/demo_bundle.old
cp -r "$run_dir/bundle" sdqes_edge/data/demo_bundle
rm -rf sdqes_edge/data/demo_bundle.old
# Hysteresis and cooldown chosen on the validation streams, recorded in the manifest.
scripts/calibrate_demo_policy.sh "$run_dir/policy" sdqes_edge/data/demo_bundle
echo "sdqes_edge/data/demo_bundle rebuilt; next: .venv/bin/sdqes-edge demo"
