#!/usr/bin/env bash
# Set up (or refresh) .venv with sdqes-edge installed in editable mode.
#   scripts/setup.sh         the export, runtime and eval extras (what the main job needs)
#   scripts/setup.sh --dev   the same plus the test tools
# torch is pinned to 2.13.0: on these machines that is the CPU build kept on disk;
# a looser requirement would download a multi-gigabyte CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3.11}
extras="export,runtime,eval"
if [ "${1:-}" = "--dev" ]; then extras="$extras,dev"; fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $python_bin" >&2
  "$python_bin" -m venv .venv
fi
echo "setup: installing sdqes-edge[$extras] into .venv (torch==2.13.0)" >&2
# pip's notes about local index folders this machine lacks are noise; everything else is shown.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[$extras]" 2>&1 \
  | { grep -v '^WARNING: Location .* is ignored' || true; }
