#!/usr/bin/env bash
# Install pipelined-vec-env on a fresh Linux machine.
#   bash scripts/install.sh            # core + LIBERO + trainer (the main job)
#   bash scripts/install.sh dev        # everything the tests and docs need
# torch is installed first, pinned to 2.13.0. A torch 2.13.0 already installed (the CPU
# build the README has a machine without a GPU install first) satisfies the pin and stays;
# otherwise pip installs its default build, which on PyPI is the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-train,libero}"

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  # headless MuJoCo rendering (EGL, OSMesa fallback) for LIBERO cameras and eval videos
  if ! ldconfig -p | grep -q "libEGL.so.1" || ! ldconfig -p | grep -q "libOSMesa" \
    || ! ls /usr/lib/*/dri/swrast_dri.so >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libegl1 libgl1 libgl1-mesa-dri libosmesa6 >/dev/null
  fi
fi

python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[${extras}]"
