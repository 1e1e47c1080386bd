#!/usr/bin/env bash
# Stage sdqes-edge for a GPU machine lent by the workplace's `device` tool (../shared/GPU.md has the facts):
# that machine has Python 3.12, a CUDA build of torch and no network, and a `run` call carries at most
# 64 MiB. This downloads onnxruntime-gpu for it and splits the wheel into parts that fit, downloads the
# small pure dependencies it lacks, builds this project's wheel, and prints the `run` calls to make.
#
#   scripts/gpu_stage.sh          stage into .gpu/ (ignored by git)
#   scripts/gpu_stage.sh --wheel  rebuild only the project's wheel (after changing the code)
#
# On the machine, scripts/gpu_check.sh installs what was carried and runs the GPU tests and benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

ORT_GPU="onnxruntime-gpu==1.31.1"  # built for CUDA 13: loads the CUDA and cuDNN libraries of the machine's torch
# What that machine lacks (GPU.md), and two it had, in case a fresh image lacks them too.
PURE_DEPS="ftfy wcwidth jsonschema jsonschema-specifications referencing rpds-py regex attrs"
CARRY_LIMIT_MIB=64                  # what one `run` call carries: the working tree that travels and the carried paths
# The project's own environment where set up (scripts/setup.sh): it has the build tools the wheel needs.
default_python=python3
[ -x .venv/bin/python ] && default_python=.venv/bin/python
PYTHON=${PYTHON:-$default_python}
TARGET="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"

wheel_only=0
case "${1:-}" in
  --wheel) wheel_only=1 ;;
  "") ;;
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_stage: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

mkdir -p .gpu/w
rm -f .gpu/w/sdqes_edge-*.whl
echo "gpu_stage: building the project's wheel (the machine cannot build it)" >&2
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w .gpu/w . >/dev/null
# The kernel library with its CUDA kernels (nvcc here; the machine has no compiler we know of), carried in .gpu/w.
echo "gpu_stage: building the kernel library with its CUDA kernels (runtime/ort_ops/build.sh)" >&2
if runtime/ort_ops/build.sh --out .gpu/ort_ops >/dev/null 2>&1 && cp .gpu/ort_ops/libsdqes_ort_ops.so .gpu/w/; then
  "$PYTHON" -c "import ctypes, sys; sys.exit(not ctypes.CDLL('.gpu/w/libsdqes_ort_ops.so').sdqes_ort_ops_with_cuda())" \
    || echo "gpu_stage: warning: the kernel library has no CUDA kernels (no nvcc?): its GPU rows will be skipped" >&2
else
  rm -f .gpu/w/libsdqes_ort_ops.so
  echo "gpu_stage: warning: the kernel library did not build (run runtime/ort_ops/build.sh to see why)" >&2
fi
if [ "$wheel_only" = 1 ]; then
  echo "gpu_stage: .gpu/w is ready; on a warm machine: run carry [\".gpu/w\"] \"scripts/gpu_check.sh site tests\"" >&2
  exit 0
fi

echo "gpu_stage: downloading $ORT_GPU and $PURE_DEPS for Python 3.12" >&2
rm -rf .gpu/dl .gpu/parts && mkdir -p .gpu/dl .gpu/parts
# shellcheck disable=SC2086  # TARGET and PURE_DEPS are lists of words
{ "$PYTHON" -m pip download --quiet $TARGET -d .gpu/dl "$ORT_GPU" \
  && "$PYTHON" -m pip download --quiet $TARGET -d .gpu/w $PURE_DEPS; } 2>&1 \
  | { grep -v '^WARNING: Location .* is ignored' || true; }  # notes about local index folders this machine lacks
wheel=$(ls .gpu/dl/onnxruntime_gpu-*.whl)
# Every call also sends the working tree (tracked files and untracked ones git does not ignore): 22 MB in
# November 2026, so a 55 MiB part no longer fitted beside it. Parts are sized to what is left, 3 MiB spare.
tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
tree_mib=$(( (tree_bytes + 1048575) / 1048576 ))
part_mib=$(( CARRY_LIMIT_MIB - tree_mib - 3 ))
[ "$part_mib" -ge 8 ] || { echo "gpu_stage: the working tree (${tree_mib} MiB) leaves no room in a call's" \
  "${CARRY_LIMIT_MIB} MiB for the wheel's parts; ignore or remove large untracked files" >&2; exit 1; }
split -b "${part_mib}M" -d "$wheel" .gpu/parts/ort.
# The name and checksum travel in .gpu/w with the last call, which re-joins and checks the wheel.
(cd .gpu/dl && sha256sum "$(basename "$wheel")") > .gpu/w/onnxruntime-gpu.sha256
rm -rf .gpu/dl

parts=(.gpu/parts/ort.*)
echo "gpu_stage: staged ${#parts[@]} parts of $(basename "$wheel") (${part_mib} MiB each, beside a" \
  "${tree_mib} MiB working tree) and $(ls .gpu/w | wc -l) files in .gpu/w" >&2
cat <<EOF

Now make these \`run\` calls back to back (a machine left idle for 30 s is given back, and what was
staged on it with it). Each returns in seconds but the last, which installs, tests and measures (on an
H200 in November 2026: install 40 s, GPU tests 40 s, bench --device-only 140 s).
EOF
n=0
for part in "${parts[@]}"; do
  n=$((n + 1))
  echo "  $n. carry [\"$part\"]  command: scripts/gpu_check.sh stage"
done
echo "  $((n + 1)). carry [\".gpu/w\"]  command: scripts/gpu_check.sh site install tests bench"
echo
echo "After changing the code, while the machine is warm: scripts/gpu_stage.sh --wheel, then carry [\".gpu/w\"]: scripts/gpu_check.sh site tests."
