#!/usr/bin/env bash
# Run the device side (demo, inspect, run, build-ort-ops, doctor, tokenize, synth, score, eval) on the oldest releases
# pyproject.toml accepts, as on a device with an older software stack (a Jetson's ONNX Runtime build, an OpenCV
# made for numpy 1.x). CI runs on the newest releases only; this is how tests/test_older_stacks.py's facts were
# found. A few minutes with the registry (4-5 on a 2-core machine, most of it exporting the bundles).
#
#   scripts/oldest_stack_check.sh [PYTHON] [DIR]     (defaults: python3.10, /tmp/sdqes-oldest)
#
# PYTHON is the interpreter of the device's Python (3.8, JetPack 5's, is the oldest pyproject.toml accepts). Each base and
# runtime dependency is installed at the oldest release its lower bound allows; the bundles are exported by this
# checkout's .venv (run scripts/setup.sh first).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3.10}
dir=${2:-/tmp/sdqes-oldest}
[ -x .venv/bin/sdqes-edge ] || { echo "oldest_stack_check: run scripts/setup.sh first" >&2; exit 2; }
rm -rf "$dir" && mkdir -p "$dir/src"
"$python" -m venv "$dir/venv"

# The oldest release at or above each lower bound that pip can install on this Python (`pip index versions`
# lists only those), pre-releases left out.
pins=$(.venv/bin/python - "$dir/venv/bin/pip" <<'PY'
import re, subprocess, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
def numbers(version):
    return tuple(int(part) for part in version.split("."))
for requirement in project["dependencies"] + project["optional-dependencies"]["runtime"]:
    name, low = re.fullmatch(r"([\w.-]+)>=([\d.]+)", requirement.split(";")[0].strip()).groups()
    listed = subprocess.run([sys.argv[1], "index", "versions", name], capture_output=True, text=True).stdout
    versions = re.search(r"Available versions: (.*)", listed).group(1).split(", ")
    final = [v for v in versions if re.fullmatch(r"[\d.]+", v) and numbers(v) >= numbers(low)]
    print(f"{name}=={min(final, key=numbers)}")
PY
)
echo "oldest_stack_check: $("$python" --version) with" $pins >&2
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check $pins 2>&1 | grep -v "^WARNING: Location" || true
# The working tree as it is (tracked and new files), built outside the checkout so no build/ folder is left in it,
# into a wheel by this checkout's Python (a source build needs Python 3.9: setuptools 77 reads the SPDX licence),
# which the device's Python installs, as a device gets it.
git ls-files --cached --others --exclude-standard -z | xargs -0 tar -cf - | tar -xf - -C "$dir/src"
.venv/bin/pip wheel --quiet --disable-pip-version-check --no-deps -w "$dir/wheel" "$dir/src" 2>&1 \
  | grep -v "^WARNING: Location" || true
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$dir"/wheel/sdqes_edge-*.whl 2>&1 \
  | grep -v "^WARNING: Location" || true

old="$dir/venv/bin/sdqes-edge"
failures=0
check() {  # check WHAT COMMAND...: run it, keep its output, count a failure
  local what=$1; shift
  if "$@" > "$dir/last.txt" 2>&1; then echo "ok    $what" >&2
  else echo "FAIL  $what: $(tail -1 "$dir/last.txt")" >&2; failures=$((failures + 1)); return 1; fi
}
check "demo (fp32)" "$old" demo --out "$dir/demo" || true
check "demo (int8)" "$old" demo --out "$dir/demo-int8" --precision int8 || true
for kind in qrnn retnet st; do
  .venv/bin/sdqes-edge export --preset tiny --adapter "$kind" --precision fp32 fp16 int8 --out "$dir/$kind" \
    > "$dir/export-$kind.txt" 2>&1
  for precision in fp32 fp16 int8; do
    check "inspect $kind $precision" "$old" inspect "$dir/$kind" --precision "$precision" \
      && { grep -q "embedding norm 1.0000" "$dir/last.txt" \
           || { echo "FAIL  inspect $kind $precision: $(grep 'ran ' "$dir/last.txt")" >&2; failures=$((failures + 1)); }; }
  done
  check "run $kind" "$old" run "$dir/$kind" --source "$dir/demo/stream.avi" --query "Tell me when the lamp turns on." \
    || true
done
# This project's ONNX Runtime kernels, built from the sources the installed package carries, run in the fp16 graph
# (the one with ONNX Runtime's operators) by the oldest ONNX Runtime: the library asks for that release's C API.
library="$dir/ort_ops/libsdqes_ort_ops.so"
if check "build-ort-ops (CPU kernels)" "$old" build-ort-ops --cpu --out "$dir/ort_ops"; then
  check "inspect qrnn fp16 --ort-ops" "$old" inspect "$dir/qrnn" --precision fp16 --ort-ops "$library" \
    && { grep -q "QrnnPool" "$dir/last.txt" \
         || { echo "FAIL  inspect --ort-ops: no QrnnPool kernel ran" >&2; failures=$((failures + 1)); }; }
  check "run qrnn fp16 --ort-ops" "$old" run "$dir/qrnn" --precision fp16 --ort-ops "$library" \
    --source "$dir/demo/stream.avi" --query "Tell me when the lamp turns on." || true
  check "doctor (the library built here)" "$old" doctor --ort-ops "$library" || true
fi
# The rest of what a device runs: tokenizing, synthetic streams, scoring a corpus, and evaluating it.
check "tokenize" "$old" tokenize "Remind me to wash my hands when I start cooking" || true
check "synth" "$old" synth --out "$dir/synth" --train 0 --val 0 --test 2 --seconds 20 || true
check "score" "$old" score "$dir/qrnn" --videos "$dir/synth/videos" --annotations "$dir/synth/annotations.csv" \
  --split test --out "$dir/scored" --quiet || true
check "eval (oracle, random)" "$old" eval --annotations "$dir/synth/annotations.csv" --split test --fps 2 \
  --baseline oracle random --out "$dir/eval" || true
echo "oldest_stack_check: $failures failure(s); outputs under $dir" >&2
exit $((failures > 0))
