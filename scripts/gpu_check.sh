#!/usr/bin/env bash
# Runs ON the GPU machine of the workplace's `device` tool, in the repository copy a `run` call gets, with
# what scripts/gpu_stage.sh staged here and the call carried. Steps, done in the order given:
#   stage    keep the onnxruntime-gpu parts carried this call (in /root/stage, which outlives the call
#            while the machine stays warm)
#   site     install the carried project wheel and pure dependencies into /tmp/site (afresh), and put the
#            carried kernel library where the tests look for it (build/ort_ops/)
#   install  re-join the parts, check the wheel's sha256, install it into /tmp/ortgpu, and check that
#            ONNX Runtime offers the CUDA execution provider
#   tests    nvidia-smi and sdqes-edge doctor, then the GPU tests (TESTS, default the device-step, provider, lean-step, multi-stream, fused-queries, fused-ops, fused-retention, doctor, corpus-format tests)
#   bench    sdqes-edge bench --device cuda (BENCH_ARGS, default --device-only --no-int8), in $OUT/bench, with
#            --ort-ops where the kernel library was carried (and again without it if that run fails)
# Logs go to $OUT (what a `run` call brings back). Example: scripts/gpu_check.sh stage site install tests
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=/root/stage
SITE=/tmp/site
ORT_SITE=/tmp/ortgpu
OUT=${OUT:-/tmp/gpu-out}
TESTS=${TESTS:-"tests/test_device_step.py tests/test_provider_checks.py tests/test_lean_step.py tests/test_multi_stream.py tests/test_fused_queries.py tests/test_fused_ops.py tests/test_fused_retention.py tests/test_doctor.py tests/test_corpus_formats.py"}
KERNELS=build/ort_ops/libsdqes_ort_ops.so  # where site puts the carried kernel library (tests/test_fused_ops.py)
BENCH_ARGS=${BENCH_ARGS:-"--device-only --no-int8"}
mkdir -p "$STAGE" "$OUT"
# The GPU build first, so it shadows the CPU onnxruntime the machine has; then the project.
export PYTHONPATH="$ORT_SITE:$SITE${PYTHONPATH:+:$PYTHONPATH}"
# No working directory on sys.path (python -P, inherited by the tests' subprocesses), so `sdqes_edge` is
# the installed wheel, not this tree's sdqes_edge/ folder (the wheel maps other folders of the tree into it).
export PYTHONSAFEPATH=1

fail() { echo "gpu_check: $*" >&2; exit 1; }

do_stage() {
  local carried=(.gpu/parts/ort.*)
  [ -e "${carried[0]}" ] || fail "no .gpu/parts/ort.* carried in this call; carry the parts gpu_stage.sh printed"
  cp "${carried[@]}" "$STAGE/"
  echo "gpu_check: staged $(ls "$STAGE" | grep -c '^ort\.') part(s) in $STAGE: $(cd "$STAGE" && ls ort.* | tr '\n' ' ')"
}

do_site() {
  ls .gpu/w/*.whl >/dev/null 2>&1 || fail "no wheels in .gpu/w; carry \".gpu/w\" (made by scripts/gpu_stage.sh)"
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/w/*.whl
  cp .gpu/w/onnxruntime-gpu.sha256 "$STAGE/" 2>/dev/null || true
  echo "gpu_check: installed $(ls .gpu/w/*.whl | wc -l) wheels into $SITE"
  if [ -f .gpu/w/libsdqes_ort_ops.so ]; then
    mkdir -p "$(dirname "$KERNELS")" && cp .gpu/w/libsdqes_ort_ops.so "$KERNELS"
    echo "gpu_check: kernel library in $KERNELS"
  fi
}

do_install() {
  [ -f "$STAGE/onnxruntime-gpu.sha256" ] || fail "no checksum staged; run the 'site' step with .gpu/w carried"
  local wheel
  wheel=$(awk '{print $2}' "$STAGE/onnxruntime-gpu.sha256")
  cat "$STAGE"/ort.* > "$STAGE/$wheel"
  (cd "$STAGE" && sha256sum --quiet -c onnxruntime-gpu.sha256) \
    || fail "the re-joined $wheel does not match its checksum: a part is missing ($(cd "$STAGE" && ls ort.* | tr '\n' ' ')); carry them all again"
  rm -rf "$ORT_SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$ORT_SITE" "$STAGE/$wheel"
  rm -f "$STAGE/$wheel"
  python3 -c "import onnxruntime as o, sys; p = o.get_available_providers(); print('gpu_check: onnxruntime', o.__version__, p); sys.exit('CUDAExecutionProvider' not in p)" \
    || fail "onnxruntime from $ORT_SITE offers no CUDAExecutionProvider"
}

do_tests() {
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "gpu_check: nvidia-smi failed (see $OUT/nvidia-smi.txt)" >&2
  # What the machine has, as a user's `sdqes-edge doctor` sees it (the CUDA session, the kernel library's readiness).
  python3 -m sdqes_edge.cli doctor --ort-ops "$KERNELS" > "$OUT/doctor.txt" 2>&1 \
    || echo "gpu_check: doctor found something broken (see $OUT/doctor.txt)" >&2
  # In this one process: one GPU to share, and the machine has no pytest-xdist for pyproject's `-n auto` (its
  # addopts set aside, -rs given here).
  # shellcheck disable=SC2086  # TESTS is a list of paths
  python3 -m pytest -q -rs -p no:xdist -o addopts= $TESTS 2>&1 | tee "$OUT/pytest.txt"
  return "${PIPESTATUS[0]}"
}

bench_once() {  # bench_once LOG [ARGS...]: the bench with BENCH_ARGS and ARGS, its output also in $OUT/LOG
  local log=$1
  shift
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  python3 -m sdqes_edge.cli bench --device cuda $BENCH_ARGS "$@" --out "$OUT/bench" 2>&1 | tee "$OUT/$log"
  return "${PIPESTATUS[0]}"
}

do_bench() {
  [ -f "$KERNELS" ] || { bench_once bench.txt; return; }
  # The fp16 steps timed with the kernel library too. Its CUDA kernels are this project's own: where they fail
  # (a CUDA error poisons the whole process), the bench runs again without them, so that one broken kernel
  # does not cost the device's other rows.
  bench_once bench.txt --ort-ops "$KERNELS" && return
  mv "$OUT/bench.txt" "$OUT/bench-with-ort-ops.txt"
  # What it measured before failing, kept apart: the bench writes beside a folder holding a run (bench-2/) rather
  # than over it, and the run without the library belongs in bench/.
  [ ! -d "$OUT/bench" ] || mv "$OUT/bench" "$OUT/bench-with-ort-ops"
  echo "gpu_check: the bench failed with --ort-ops $KERNELS (log: $OUT/bench-with-ort-ops.txt); again without it" >&2
  bench_once bench.txt
  return 1  # the library's rows are missing: say so in the exit status
}

[ $# -gt 0 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
failed=()  # a failing test run does not keep the bench from running; the exit status says it failed
for step in "$@"; do
  case "$step" in
    stage) do_stage ;;
    site) do_site ;;
    install) do_install ;;
    tests) do_tests || failed+=(tests) ;;
    bench) do_bench || failed+=(bench) ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown step '$step'; steps are: stage site install tests bench" ;;
  esac
done
[ ${#failed[@]} -eq 0 ] || fail "failed: ${failed[*]} (logs in $OUT)"
