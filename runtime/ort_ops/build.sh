#!/usr/bin/env bash
# Build libsdqes_ort_ops.so, this project's ONNX Runtime kernels (this folder; runtime/fused_ops.py says what
# they are for). Run through `sdqes-edge build-ort-ops`, which passes these options on:
#   --cpu            CPU kernels only (else the CUDA provider's too, where nvcc is found)
#   --out DIR        build into DIR (default build/ort_ops, in the current folder)
#   --print-archs    say which nvcc and GPU architectures a build would use, and stop
#   CUDA_ARCHS="80 87 90"    the GPU architectures to compile for (default below)
#
# Needs g++ (C++17), and nvcc for the CUDA kernels. ONNX Runtime's C API headers come from Debian's
# libonnxruntime-dev package (pinned by sha256, fetched once into the output folder); the library links to no
# ONNX Runtime (the runtime hands it its API when it registers it) and works with ONNX Runtime 1.17 and newer.
set -euo pipefail
sources=$(cd "$(dirname "$0")" && pwd)
headers_deb="libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
headers_url="http://deb.debian.org/debian/pool/main/o/onnxruntime/$headers_deb"
headers_sha256="14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
# The GPUs compiled for unless CUDA_ARCHS says: V100 (sm_70), Jetson Xavier (72), Turing (75), A100 (80),
# Ampere (86), Jetson Orin (87), Ada (89), Hopper (90), as far as the nvcc at hand compiles for them (CUDA 13
# dropped 70 and 72; JetPack 5's CUDA 11.4 predates 89 and 90). PTX for the newest kept lets later GPUs JIT it.
preferred_archs="70 72 75 80 86 87 89 90"
with_cuda=1
print_archs=0
out=build/ort_ops
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) with_cuda=0 ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --print-archs) print_archs=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-ort-ops: unknown argument $1 (--cpu, --out DIR, --print-archs)" >&2; exit 2 ;;
  esac
  shift
done

# nvcc on PATH, else CUDA_HOME's, else /usr/local/cuda's (JetPack installs CUDA there and leaves it off PATH).
nvcc=$(command -v nvcc || true)
for candidate in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} /usr/local/cuda/bin/nvcc; do
  if [ -z "$nvcc" ] && [ -x "$candidate" ]; then nvcc=$candidate; fi
done
if [ "$with_cuda" = 1 ] && [ -z "$nvcc" ]; then
  with_cuda=0
  [ "$print_archs" = 1 ] || echo "build-ort-ops: no nvcc (on PATH, in \$CUDA_HOME/bin or /usr/local/cuda/bin): CPU" \
    "kernels only (the library will refuse CUDA sessions)" >&2
fi
archs=${CUDA_ARCHS:-}
if [ "$with_cuda" = 1 ] && [ -z "$archs" ]; then
  # The architectures this nvcc compiles for (CUDA 11 and newer list them); an nvcc that cannot say gets them all.
  known=" $({ "$nvcc" --list-gpu-code 2>/dev/null || true; } | tr '\n' ' ') "
  left_out=()
  for a in $preferred_archs; do
    if [ "$known" = "  " ] || [[ "$known" == *" sm_$a "* ]]; then archs+="${archs:+ }$a"; else left_out+=("sm_$a"); fi
  done
  [ -n "$archs" ] || { echo "build-ort-ops: $nvcc compiles for none of sm_${preferred_archs// /, sm_}; set" \
    "CUDA_ARCHS to your GPU's (e.g. CUDA_ARCHS=\"90\")" >&2; exit 1; }
  [ ${#left_out[@]} -eq 0 ] || echo "build-ort-ops: $nvcc cannot compile for ${left_out[*]}; the library will not" \
    "run on those GPUs (another CUDA release's nvcc can; CUDA_ARCHS names what to build)" >&2
fi
if [ "$print_archs" = 1 ]; then
  if [ "$with_cuda" = 1 ]; then echo "nvcc: $nvcc"; echo "archs: $archs"; else echo "nvcc: none (CPU kernels only)"; fi
  exit 0
fi

for tool in g++ curl; do
  command -v "$tool" >/dev/null || { echo "build-ort-ops: no $tool here; install it (Debian, Ubuntu, JetPack:" \
    "sudo apt install $tool) and run again" >&2; exit 1; }
done
mkdir -p "$out"
include="$out/headers/usr/include/onnxruntime"
if [ ! -f "$include/onnxruntime_cxx_api.h" ]; then
  echo "build-ort-ops: fetching ONNX Runtime's C API headers ($headers_deb)" >&2
  curl -sfL --retry 3 -o "$out/$headers_deb" "$headers_url" \
    || { echo "build-ort-ops: cannot download $headers_url; place that file in $out/ and run again" >&2; exit 1; }
  echo "$headers_sha256  $out/$headers_deb" | sha256sum -c --quiet - \
    || { echo "build-ort-ops: $out/$headers_deb is not the pinned file (sha256 differs); delete it and retry" >&2; exit 1; }
  dpkg-deb -x "$out/$headers_deb" "$out/headers" 2>/dev/null \
    || (cd "$out" && ar x "$headers_deb" data.tar.xz && mkdir -p headers && tar -xJf data.tar.xz -C headers)
fi

# libstdc++ linked in too, so the library loads beside any ONNX Runtime build (only its C API crosses over).
# No contraction into fused multiply-adds (aarch64 would): the kernels round each operator as the ONNX body does.
flags=(-O3 -std=c++17 -ffp-contract=off -fPIC -Wall -Wextra -static-libstdc++ -static-libgcc -I"$include" -I"$sources")
objects=()
if [ "$with_cuda" = 1 ]; then
  gencode=()
  for a in $archs; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done
  last=${archs##* }
  gencode+=(-gencode "arch=compute_$last,code=compute_$last")
  echo "build-ort-ops: compiling the CUDA kernels (sm_${archs// /, sm_})" >&2
  for kernel in qrnn_pool retention_step; do
    "$nvcc" -O3 -std=c++17 -Xcompiler -fPIC -I"$sources" "${gencode[@]}" -c "$sources/${kernel}_cuda.cu" \
      -o "$out/${kernel}_cuda.o"
  done
  cuda_root=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc")")")}
  [ -f "$cuda_root/include/cuda_runtime.h" ] || cuda_root=/usr/local/cuda  # nvcc on PATH may be a wrapper script
  flags+=(-DSDQES_WITH_CUDA -I"$cuda_root/include")
  # The CUDA runtime linked in: the library loads before ONNX Runtime has loaded its own (which onnxruntime-gpu
  # may find in pip's nvidia packages, off the loader's path); both launch on the same driver context and stream.
  objects+=("$out/qrnn_pool_cuda.o" "$out/retention_step_cuda.o" -L"$cuda_root/lib64" -lcudart_static -lrt -lpthread -ldl)
fi
g++ "${flags[@]}" -shared "$sources/ort_ops.cc" "${objects[@]}" -o "$out/libsdqes_ort_ops.so.tmp"
mv "$out/libsdqes_ort_ops.so.tmp" "$out/libsdqes_ort_ops.so"
echo "build-ort-ops: built $out/libsdqes_ort_ops.so" >&2
