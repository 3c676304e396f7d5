#!/usr/bin/env bash
# Install hpcevo on a GPU node with no package registry, beside the image's own JAX, from the
# folder scripts/gpu-wheelhouse.sh made (offline: pip never looks past that folder).
#
#   scripts/gpu-node-setup.sh [WHEELHOUSE]    # default <repo>/.whl/gpu
#   . .venv-gpu/bin/activate                   # then: mpiexec -n 2 python -m hpcevo run ...
#
# What it does, each step skipped when already done (a stamp records what was built from what):
#   1. a venv (default <repo>/.venv-gpu) that sees the image's packages (JAX and its CUDA plugin,
#      numpy, h5py, ...) behind its own: a .pth file adds the image interpreter's site
#      directories, which works where that interpreter is itself a venv (then `venv
#      --system-site-packages` would see only the Python below it);
#   2. every wheel of the folder, without dependencies (the folder holds one version of each);
#   4. hpcevo itself, editable;
#   5. the MPI: the image's own where its h5py was built with it (and its mpi4py runs it), else
#      the MPICH wheel (libmpi, mpicc, mpiexec) with mpi4py's binary wheel; mpi4jax built from
#      source with that MPI's mpicc, with its CUDA bridge when a CUDA toolkit is found
#      (CUDA_PATH, the nvcc on PATH, /usr/local/cuda, or the image's nvidia-* wheels, step 3);
#      a check that mpi4py and mpi4jax call one MPI library, and that prints the versions found.
#      h5py without MPI is reported (checkpoints of a job of several ranks are then written by
#      rank 0 alone), not an error.
#
# Knobs: HPCEVO_PYTHON (the image's interpreter that holds JAX, default python3), HPCEVO_VENV,
# HPCEVO_GPU (auto | cuda | off; default auto: cuda where a GPU and a toolkit are found),
# CUDA_PATH, HPCEVO_MPI (auto | wheel | system; default auto: the image's MPI where its h5py is
# built with it, else the MPICH wheel), HPCEVO_REBUILD=1 (everything again).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WH=$(cd "${1:-$ROOT/.whl/gpu}" 2>/dev/null && pwd) || { echo "[gpu-setup] error: no wheelhouse '${1:-$ROOT/.whl/gpu}' (make one with scripts/gpu-wheelhouse.sh)" >&2; exit 1; }
PY=${HPCEVO_PYTHON:-python3}
VENV=${HPCEVO_VENV:-$ROOT/.venv-gpu}
GPU=${HPCEVO_GPU:-auto}
MPI_CHOICE=${HPCEVO_MPI:-auto}

say() { echo "[gpu-setup] $*" >&2; }
die() { echo "[gpu-setup] error: $*" >&2; exit 1; }

case "$GPU" in auto|cuda|off) ;; *) die "HPCEVO_GPU='$GPU': allowed values are auto, cuda, off" ;; esac
case "$MPI_CHOICE" in auto|wheel|system) ;; *) die "HPCEVO_MPI='$MPI_CHOICE': allowed values are auto, wheel, system" ;; esac
[ -f "$WH/MANIFEST" ] || die "$WH has no MANIFEST: make the folder with scripts/gpu-wheelhouse.sh"
command -v "$PY" >/dev/null 2>&1 || die "no interpreter '$PY' (set HPCEVO_PYTHON to the image's python)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PY is $("$PY" -V 2>&1); hpcevo needs Python 3.11 or newer"
"$PY" -c 'import jax' 2>/dev/null \
  || die "$PY cannot import jax: point HPCEVO_PYTHON at the image's interpreter that holds JAX"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip"
PYV=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
tag=cp${PYV/./}
for f in "$WH"/*-cp3*.whl; do
  [ -e "$f" ] || continue
  case "$(basename "$f")" in *-"$tag"-*) ;; *) die "$(basename "$f") is not for Python $PYV ($PY): gather the folder for it (HPCEVO_NODE_PYTHON=$PYV scripts/gpu-wheelhouse.sh)" ;; esac
done
(cd "$WH" && while read -r f size sum; do
  [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sum" ] || { echo "$f"; exit 1; }
done < MANIFEST) >/dev/null || die "a file of $WH does not match its MANIFEST: gather it again"

# -- CUDA: where its headers and runtime library are ---------------------------------------------
# mpi4jax's CUDA bridge is C++ against cuda_runtime.h, linked with -lcudart. A toolkit may ship
# only the versioned library (libcudart.so.13), so the build gets a small prefix of links, and
# an rpath to the real library's folder.
cuda_candidates() {
  [ -n "${CUDA_PATH:-}" ] && echo "$CUDA_PATH"
  command -v nvcc >/dev/null 2>&1 && dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"
  echo /usr/local/cuda
  "$PY" - <<'PY' 2>/dev/null || true
import glob, os, site
for sp in site.getsitepackages():
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*"))) + [os.path.join(sp, "nvidia")]:
        print(d)
PY
}
find_cuda() {  # prints "include-dir lib-file" of the first candidate that has both
  local c inc lib
  while read -r c; do
    [ -d "$c" ] || continue
    inc=$(find -L "$c" -maxdepth 3 -name cuda_runtime.h -path '*include*' 2>/dev/null | head -1)
    lib=$(find -L "$c" -maxdepth 3 \( -name 'libcudart.so' -o -name 'libcudart.so.[0-9]*' \) 2>/dev/null | sort | head -1)
    if [ -n "$inc" ] && [ -n "$lib" ]; then echo "$(dirname "$inc") $lib"; return 0; fi
  done < <(cuda_candidates)
  return 1
}
gpu_present() { command -v nvidia-smi >/dev/null 2>&1 || ls /dev/nvidia[0-9]* >/dev/null 2>&1; }

CUDA=""
if [ "$GPU" != off ]; then
  if CUDA=$(find_cuda); then
    [ "$GPU" = auto ] && ! gpu_present && CUDA=""
  elif [ "$GPU" = cuda ]; then
    die "HPCEVO_GPU=cuda, but no CUDA toolkit was found (cuda_runtime.h and libcudart): set CUDA_PATH"
  fi
fi

# -- the stamp --------------------------------------------------------------------------------------
fingerprint() {
  { cat "$WH/MANIFEST" "$ROOT/scripts/gpu-node-setup.sh" "$ROOT/pyproject.toml"
    "$PY" -c 'import sys, jax; print(sys.executable, sys.version, jax.__version__)'
    echo "cuda: $CUDA mpi: $MPI_CHOICE"; command -v mpicc || true; } | sha256sum | cut -d' ' -f1
}
FP=$(fingerprint)
STAMP=$VENV/.hpcevo-gpu-setup
VPY=$VENV/bin/python
if [ -z "${HPCEVO_REBUILD:-}" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FP" ] \
   && "$VPY" -c 'import hpcevo, mpi4jax' 2>/dev/null; then
  say "environment up to date ($VENV)"
  exit 0
fi
[ -n "${HPCEVO_REBUILD:-}" ] && rm -rf "$VENV"
rm -f "$STAMP"

# -- 1. the venv, seeing the image's packages behind its own --------------------------------------
if [ ! -x "$VPY" ]; then
  say "creating $VENV (on $("$PY" -c 'import sys; print(sys.executable)'))"
  "$PY" -m venv --without-pip "$VENV"
fi
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" - "$SITE/_hpcevo_image.pth" <<'PY'
import site, sys
dirs = [d for d in dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()])]
# site.addsitedir also runs the image's own .pth files (plugins, namespace packages).
lines = [f"import site; site.addsitedir({d!r})" for d in dirs]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
PIP=("$PY" -m pip --python "$VPY" --disable-pip-version-check -q)
"$VPY" -c 'import jax' || die "the venv does not see the image's jax (see $SITE/_hpcevo_image.pth)"

# -- 2. the wheels (the MPI ones in step 5) -----------------------------------------------------------
mpi_wheels=() other_wheels=()
for f in "$WH"/*.whl; do
  case "$(basename "$f")" in mpich-*|mpi4py-*) mpi_wheels+=("$f") ;; *) other_wheels+=("$f") ;; esac
done
say "installing ${#other_wheels[@]} wheels from $WH (offline)"
"${PIP[@]}" install --no-index --no-deps --force-reinstall "${other_wheels[@]}"

# -- 3. mpi4jax --------------------------------------------------------------------------------------
# Its build needs nanobind (the image's, or ours) and, at build time, mpi4py and jax importable.
"$VPY" -c 'import nanobind' 2>/dev/null || die "nanobind is missing (neither the image nor $WH has it)"
build_mpi4jax() {  # mpicc, extra LDFLAGS
  local mpicc=$1 ldflags=$2
  if [ -n "$CUDA" ]; then
    read -r cuda_inc cuda_lib <<<"$CUDA"
    local link=$VENV/.cuda
    rm -rf "$link"; mkdir -p "$link/lib64"
    ln -s "$cuda_inc" "$link/include"
    ln -s "$cuda_lib" "$link/lib64/libcudart.so"
    say "building mpi4jax with $mpicc and its CUDA bridge (cuda_runtime.h in $cuda_inc, $cuda_lib)"
    env CUDA_PATH="$link" MPI4JAX_BUILD_MPICC="$mpicc" LDFLAGS="$ldflags -Wl,-rpath,$(dirname "$cuda_lib") ${LDFLAGS:-}" \
      "${PIP[@]}" install --no-index --no-deps --no-build-isolation --force-reinstall "$WH"/mpi4jax-*.tar.gz
  else
    say "building mpi4jax with $mpicc (a CUDA bridge only if mpi4jax finds a toolkit: no GPU here, or HPCEVO_GPU=off)"
    # mpi4jax builds a CUDA bridge whenever it sees nvcc, CUDA_PATH or /usr/local/cuda (its last
    # fallback: a login node or a CPU machine with a toolkit and no GPU got a bridge, and paid
    # for compiling it): nvcc hidden from PATH, and CUDA_PATH an empty folder, which it takes
    # as the toolkit and finds no headers in.
    local clean_path no_cuda
    clean_path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do
      [ -n "$d" ] && [ ! -e "$d/nvcc" ] && echo "$d"; done | paste -sd: -)
    no_cuda=$(mktemp -d)
    env -u CUDA_ROOT -u CUDA_HOME CUDA_PATH="$no_cuda" PATH="$clean_path" MPI4JAX_BUILD_MPICC="$mpicc" LDFLAGS="$ldflags ${LDFLAGS:-}" \
      "${PIP[@]}" install --no-index --no-deps --no-build-isolation --force-reinstall "$WH"/mpi4jax-*.tar.gz
    rmdir "$no_cuda"
  fi
  local so
  for so in "$SITE"/mpi4jax/_src/xla_bridge/mpi_xla_bridge_*.so; do
    say "$(basename "$so"): $(ldd "$so" | grep -E 'libmpi|libcudart' | tr -s ' \t' ' ' | paste -sd';' -)"
  done
}

check_stack() {
  "$VPY" - "$CUDA" <<'PY'
import sys

def mapped(after):  # which MPI libraries the process has loaded: what to look at when they differ
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libmpi" in l})
    print(f"[gpu-setup] after {after}: {', '.join(libs) or 'no libmpi'}", file=sys.stderr)

try:
    import h5py; mapped("h5py")
    import jax; jax.devices(); mapped("jax")
    from mpi4py import MPI; mapped("mpi4py")
    import mpi4jax; mapped("mpi4jax")
except Exception as e:
    print(f"[gpu-setup] error: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
import mpi4py, numpy
import hpcevo

from mpi4jax._src.xla_bridge import HAS_CUDA_EXT as bridge
say = lambda s: print(f"[gpu-setup] {s}", file=sys.stderr)
say(f"python {sys.version.split()[0]}, jax {jax.__version__}, numpy {numpy.__version__}, hpcevo {hpcevo.__version__}")
say(f"mpi4py {mpi4py.__version__} on {MPI.Get_library_version().splitlines()[0].strip()}; mpi4jax {mpi4jax.__version__} "
    f"(CUDA bridge: {'yes' if bridge else 'no'})")
say(f"JAX devices: {', '.join(str(d) for d in jax.devices())}")
mpi = bool(h5py.get_config().mpi)
say(f"h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}, MPI: {'yes' if mpi else 'no'}"
    + ("" if mpi else " -> a job of several ranks writes its checkpoints from rank 0 alone (the state is replicated)"))
if sys.argv[1] and not bridge:
    say("error: a CUDA toolkit was found but mpi4jax has no CUDA bridge")
    sys.exit(1)
PY
}

# -- 4. hpcevo ---------------------------------------------------------------------------------------
say "installing hpcevo (editable)"
"${PIP[@]}" install --no-index --no-deps --no-build-isolation -e "$ROOT"

# -- 5. MPI: the image's own, or the MPICH wheel; checked ------------------------------------------
# The image's MPI where its h5py was built with it (a parallel h5py must run on the MPI it was
# built for) and its mpi4py runs it; otherwise the MPICH wheel (an image with no MPI, or with one
# its Python packages do not use: the H200 image had Debian's Open MPI 4.1.6 and a serial h5py),
# and the image's MPI as the fallback when the wheel's does not check out.
sys_mpicc=$(command -v mpicc || true)
image_mpi() {  # the image's MPI, as its own mpi4py runs it (the venv's MPI wheels removed)
  "${PIP[@]}" uninstall -y mpich mpi4py >/dev/null 2>&1 || true
  "$VPY" -c 'from mpi4py import MPI; print("[gpu-setup] the image'"'"'s mpi4py runs", MPI.Get_library_version().splitlines()[0])' >&2
}
system_route() {
  build_mpi4jax "$sys_mpicc" ""
  local t real
  for t in mpiexec mpirun; do  # the launcher that goes with it, where the venv's users look
    real=$(PATH=${PATH#"$VENV/bin:"} command -v $t || true)
    # a script, not a link: hydra finds its proxy beside the path it was started by
    [ -n "$real" ] && printf '#!/bin/sh\nexec %s "$@"\n' "$real" > "$VENV/bin/$t" && chmod +x "$VENV/bin/$t"
  done
  check_stack
}
ROUTE=$MPI_CHOICE
if [ "$ROUTE" = auto ]; then
  ROUTE=wheel
  if [ -n "$sys_mpicc" ] && "$PY" -c 'import h5py, sys; sys.exit(not h5py.get_config().mpi)' 2>/dev/null \
     && "$PY" -c 'from mpi4py import MPI' 2>/dev/null; then
    ROUTE=system
  fi
fi
if [ "$ROUTE" = system ]; then
  [ -n "$sys_mpicc" ] || die "HPCEVO_MPI=system, but there is no mpicc on PATH (load the site's MPI module)"
  say "using the image's MPI ($sys_mpicc): its h5py and mpi4py run on it"
  image_mpi || die "the image's mpi4py does not load its MPI"
  system_route || die "the installed stack does not check out with the image's MPI (see above)"
else
  say "installing the MPICH wheel and mpi4py's binary wheel"
  "${PIP[@]}" install --no-index --no-deps --force-reinstall "${mpi_wheels[@]}"
  [ -x "$VENV/bin/mpicc" ] || die "the MPICH wheel gave no $VENV/bin/mpicc"
  export PATH=$VENV/bin:$PATH
  "$VPY" -c 'from mpi4py import MPI; print("[gpu-setup] MPI:", MPI.Get_library_version().splitlines()[0])' >&2 \
    || die "mpi4py cannot load the MPICH wheel's library"
  # The wheel's library first, at link time and at run time: the linker would otherwise take an
  # image's other libmpi.so (it did on the H200 image), and mpi4jax would call one MPI while
  # mpi4py runs another (mpi4jax's import refuses that).
  if ! CFLAGS="-I$VENV/include ${CFLAGS:-}" build_mpi4jax "$VENV/bin/mpicc" "-L$VENV/lib -Wl,-rpath,$VENV/lib" \
     || ! check_stack; then
    [ -n "$sys_mpicc" ] && [ "$MPI_CHOICE" = auto ] || die "the installed stack does not check out (see above)"
    say "the MPICH wheel does not work beside this image; trying the image's own MPI ($sys_mpicc)"
    ROUTE=system
    image_mpi || die "the image's mpi4py does not load its MPI either"
    system_route || die "the installed stack does not check out with the image's MPI either (see above)"
  fi
fi
echo "$FP" > "$STAMP"
say "ready ($ROUTE MPI): $VENV (activate it, or run $VPY; mpiexec is $VENV/bin/mpiexec)"
