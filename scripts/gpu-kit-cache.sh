#!/usr/bin/env bash
# What the GPU kit's tests (tests/test_gpu_kit.py, CTest's gpu_kit) need from the package
# registry, fetched once into a cache that later suite runs reuse, so that the tier itself runs
# offline: scripts/test.sh calls this after the set-up. Each piece is keyed by what it is made
# from and fetched again only when that changes; when everything is in place this only prints.
#
#   scripts/gpu-kit-cache.sh          # fill what is missing, then print where each piece is
#
# Prints (one per line, NAME=PATH):
#   node=DIR    the wheelhouse for a GPU node's Python (3.12), as scripts/gpu-wheelhouse.sh
#               gathers it: the source the tests gather their own copies from, offline
#   here=DIR    the same for this venv's Python (the offline install is tried on this machine)
#   image=PY    a venv standing for a GPU node's image: JAX, numpy, a serial h5py, the build
#               tools, and no MPI (what the lent machines' image holds of hpcevo's needs)
# The cache is $XDG_CACHE_HOME/hpcevo/gpu-kit (default ~/.cache/hpcevo/gpu-kit); HPCEVO_VENV
# names the venv whose Python is "here" (default <repo>/.venv).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HPCEVO_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/hpcevo/gpu-kit
# What the lent GPU machines' image holds of hpcevo's needs (and a serial h5py: its pip wheel).
IMAGE_PACKAGES=(jax jaxlib numpy h5py matplotlib tqdm filelock nanobind setuptools)

say() { echo "[gpu-kit-cache] $*" >&2; }
[ -x "$PY" ] || { say "error: no $PY (run scripts/setup.sh first)"; exit 1; }
mkdir -p "$CACHE"

key() { { cat "$@"; } | sha256sum | cut -c1-16; }
HERE_VER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
NODE_VER=3.12
WH_KEY=$(key "$ROOT/requirements/gpu-node.txt")

wheelhouse() {  # python version -> folder (filled when missing)
  local dir=$CACHE/wheelhouse-$1-$WH_KEY
  if [ ! -f "$dir/.complete" ]; then
    say "gathering the GPU node's wheelhouse for Python $1 from the registry (once)"
    rm -rf "$dir"
    HPCEVO_NODE_PYTHON=$1 HPCEVO_PYTHON=$PY "$ROOT/scripts/gpu-wheelhouse.sh" "$dir" >/dev/null
    touch "$dir/.complete"
  fi
  echo "$dir"
}

image() {
  local base k dir
  base=$("$PY" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"))')
  k=$( { cat "$ROOT/requirements/stack.txt"; echo "${IMAGE_PACKAGES[*]}"; "$base" -c 'import sys; print(sys.version)'; } \
       | sha256sum | cut -c1-16)
  dir=$CACHE/image-$k
  if [ ! -f "$dir/ready" ]; then
    say "building the stand-in for a GPU node's image from the registry (once, about 150 MB)"
    rm -rf "$dir"
    "$base" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -c "$ROOT/requirements/stack.txt" \
      "${IMAGE_PACKAGES[@]}"
    touch "$dir/ready"
  fi
  echo "$dir/bin/python"
}

# Old keys' folders go: only the current ones are ever read.
node=$(wheelhouse "$NODE_VER")
here=$(wheelhouse "$HERE_VER")
img=$(image)
for d in "$CACHE"/wheelhouse-* "$CACHE"/image-*; do
  [ -e "$d" ] || continue
  case "$d" in "$node"|"$here"|"$(dirname "$(dirname "$img")")") ;; *) rm -rf "$d" ;; esac
done
rm -rf "$(dirname "$CACHE")"/gpu-kit-image-*  # where the tests kept the image before this script
echo "node=$node"
echo "here=$here"
echo "image=$img"
