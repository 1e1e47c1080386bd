#!/usr/bin/env bash
# Set up (or refresh) .venv with sdqes-edge installed in editable mode.
#   scripts/setup.sh         the export, runtime and eval extras (what the main job needs)
#   scripts/setup.sh --dev   the same plus the test tools and Ray (the tests run `score --ray` on a local instance)
# torch is pinned to 2.13.0: on these machines that is the CPU build kept on disk;
# a looser requirement would download a multi-gigabyte CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3.11}
extras="export,runtime,eval"
dev=0
if [ "${1:-}" = "--dev" ]; then extras="$extras,dev,ray"; dev=1; fi

# The native (C++) runtime's build and tests need these from the system's packages; where they cannot be
# installed (not root, no apt) the native tests are skipped with the reason.
if [ "$dev" = 1 ]; then
  need=()
  for pkg in cmake gcc g++ pkg-config libopencv-dev nlohmann-json3-dev libssl-dev libgtest-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "setup: installing native build dependencies: ${need[*]}" >&2
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
          "${need[@]}"; } >/dev/null 2>&1 \
        || echo "setup: warning: could not install ${need[*]}; the native tests will be skipped" >&2
    else
      echo "setup: note: the native tests need ${need[*]} (apt-get as root); they will be skipped" >&2
    fi
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $python_bin" >&2
  "$python_bin" -m venv .venv
fi
echo "setup: installing sdqes-edge[$extras] into .venv (torch==2.13.0)" >&2
# pip's notes about local index folders this machine lacks are noise; everything else is shown.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[$extras]" 2>&1 \
  | { grep -v '^WARNING: Location .* is ignored' || true; }
