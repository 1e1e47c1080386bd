#!/usr/bin/env bash
# Rebuild the bundle that `sdqes-edge demo` ships (sdqes_edge/data/demo_bundle) from nothing: train the qrnn model on
# synthetic streams from its recorded seed, export it (fp32, and int8 calibrated and checked for drift over
# 2,000 frames of training streams, the model's own domain) with the threshold calibrated on validation
# streams, and keep the training record beside it. About 6 minutes on two CPU cores.
#
#   scripts/make_demo_bundle.sh [RUN_DIR]        (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
run_dir=${1:-runs/demo}
sdqes=.venv/bin/sdqes-edge
[ -x "$sdqes" ] || { echo "make_demo_bundle: run scripts/setup.sh first" >&2; exit 2; }

# From nothing: an earlier run's model in RUN_DIR is trained again (train itself refuses to replace a checkpoint).
rm -f "$run_dir/synthetic+qrnn.pt" "$run_dir/synthetic+qrnn.record.json"
"$sdqes" train --adapter qrnn --seed 0 --out "$run_dir"
# Training streams back to back (the video `sdqes-edge accuracy` calibrates on): int8 calibration and the drift
# check see many of the scenes the model knows, never a validation or test stream. One long stream is one scene,
# and on it the check could not tell a drifting int8 graph from a good one.
.venv/bin/python -c "import sys; from pathlib import Path; from sdqes_edge.benchmarks.accuracy import write_calibration_video
from sdqes_edge.train_options import TrainOptions; write_calibration_video(Path(sys.argv[1]), TrainOptions())" "$run_dir/calibration.avi"
# Export into a staging folder first: the shipped bundle is replaced only by a verified one (export refuses an int8
# graph that drifts from fp32). The checkpoint's training record gives the bundle its threshold (calibrated on the
# validation streams) and goes into it as training_record.json.
rm -rf "$run_dir/bundle"
"$sdqes" export --checkpoint "$run_dir/synthetic+qrnn.pt" --precision fp32 int8 \
  --calibration-video "$run_dir/calibration.avi" --out "$run_dir/bundle"
rm -rf sdqes_edge/data/demo_bundle.old
[ -d sdqes_edge/data/demo_bundle ] && mv sdqes_edge/data/demo_bundle sdqes_edge/data/demo_bundle.old
cp -r "$run_dir/bundle" sdqes_edge/data/demo_bundle
rm -rf sdqes_edge/data/demo_bundle.old
# Hysteresis and cooldown chosen on the validation streams, recorded in the manifest.
scripts/calibrate_demo_policy.sh "$run_dir/policy" sdqes_edge/data/demo_bundle
echo "sdqes_edge/data/demo_bundle rebuilt; next: .venv/bin/sdqes-edge demo"
