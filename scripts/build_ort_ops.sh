#!/usr/bin/env bash
# Build libsdqes_ort_ops.so, this project's ONNX Runtime kernels (native/ort_ops; runtime/fused_ops.py says
# what they are for), into build/ort_ops/.
#   scripts/build_ort_ops.sh           CPU kernels, and the CUDA provider's where nvcc is found
#   scripts/build_ort_ops.sh --cpu     CPU kernels only
#   scripts/build_ort_ops.sh --out DIR    build into DIR instead
#   CUDA_ARCHS="80 87 90" scripts/build_ort_ops.sh    the GPU architectures to compile for (default below)
# Then: sdqes-edge run BUNDLE --ort-device cuda --ort-ops build/ort_ops/libsdqes_ort_ops.so ...
#
# Needs g++ (C++17), and nvcc for the CUDA kernels. ONNX Runtime's C API headers come from Debian's
# libonnxruntime-dev package (pinned by sha256, fetched once into build/ort_ops/); the library links to no
# ONNX Runtime (the runtime hands it its API when it registers it) and works with ONNX Runtime 1.17 and newer.
set -euo pipefail
cd "$(dirname "$0")/.."
headers_deb="libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
headers_url="http://deb.debian.org/debian/pool/main/o/onnxruntime/$headers_deb"
headers_sha256="14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
# CUDA 13's nvcc compiles for Turing (sm_75) and newer; PTX for the newest listed lets later GPUs JIT it.
archs=${CUDA_ARCHS:-"75 80 86 87 89 90"}
with_cuda=1
out=build/ort_ops
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) with_cuda=0 ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build_ort_ops: unknown argument $1 (--cpu, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

mkdir -p "$out"
include="$out/headers/usr/include/onnxruntime"
if [ ! -f "$include/onnxruntime_cxx_api.h" ]; then
  echo "build_ort_ops: fetching ONNX Runtime's C API headers ($headers_deb)" >&2
  curl -sfL --retry 3 -o "$out/$headers_deb" "$headers_url" \
    || { echo "build_ort_ops: cannot download $headers_url; place that file in $out/ and run again" >&2; exit 1; }
  echo "$headers_sha256  $out/$headers_deb" | sha256sum -c --quiet - \
    || { echo "build_ort_ops: $out/$headers_deb is not the pinned file (sha256 differs); delete it and retry" >&2; exit 1; }
  dpkg-deb -x "$out/$headers_deb" "$out/headers" 2>/dev/null \
    || (cd "$out" && ar x "$headers_deb" data.tar.xz && mkdir -p headers && tar -xJf data.tar.xz -C headers)
fi

# libstdc++ linked in too, so the library loads beside any ONNX Runtime build (only its C API crosses over).
flags=(-O3 -std=c++17 -fPIC -Wall -Wextra -static-libstdc++ -static-libgcc -I"$include" -Inative/ort_ops)
objects=()
if [ "$with_cuda" = 1 ] && command -v nvcc >/dev/null; then
  gencode=()
  for a in $archs; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
  last=${archs##* }
  gencode+=(-gencode "arch=compute_$last,code=compute_$last")
  echo "build_ort_ops: compiling the CUDA kernels (sm_${archs// /, sm_})" >&2
  nvcc -O3 -std=c++17 -Xcompiler -fPIC -Inative/ort_ops "${gencode[@]}" -c native/ort_ops/qrnn_pool_cuda.cu \
    -o "$out/qrnn_pool_cuda.o"
  cuda_root=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  [ -f "$cuda_root/include/cuda_runtime.h" ] || cuda_root=/usr/local/cuda  # nvcc on PATH may be a wrapper script
  flags+=(-DSDQES_WITH_CUDA -I"$cuda_root/include")
  # The CUDA runtime linked in: the library loads before ONNX Runtime has loaded its own (which onnxruntime-gpu
  # may find in pip's nvidia packages, off the loader's path); both launch on the same driver context and stream.
  objects+=("$out/qrnn_pool_cuda.o" -L"$cuda_root/lib64" -lcudart_static -lrt -lpthread -ldl)
elif [ "$with_cuda" = 1 ]; then
  echo "build_ort_ops: no nvcc: CPU kernels only (the library will refuse CUDA sessions)" >&2
fi
g++ "${flags[@]}" -shared native/ort_ops/ort_ops.cc "${objects[@]}" -o "$out/libsdqes_ort_ops.so.tmp"
mv "$out/libsdqes_ort_ops.so.tmp" "$out/libsdqes_ort_ops.so"
echo "build_ort_ops: built $out/libsdqes_ort_ops.so" >&2
echo "next: sdqes-edge run BUNDLE --ort-device cuda --ort-ops $out/libsdqes_ort_ops.so (or --ort-device cpu)" >&2
