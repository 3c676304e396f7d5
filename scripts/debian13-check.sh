#!/usr/bin/env bash
# Prove that scripts/setup.sh passes on a fresh Debian 13 (trixie), from this Debian machine:
# debootstrap a trixie system into a chroot, copy the working tree in, run setup.sh there as root
# (it apt-installs MPICH and parallel HDF5 itself, as on a fresh machine), then the README's main
# example at 2 ranks and a small slice of the tests. Not part of the suite (CMakeLists.txt does
# not know it): it downloads a Debian system and the whole Python stack: 11 minutes on 2 cores from
# nothing (2026-11-26, an idle machine: base 1.7, set-up 5.3, example and tests 3.8).
#
#   scripts/debian13-check.sh [DIR]      (as root; DIR default /var/tmp/hpcevo-debian13)
#
# DIR/base is the pristine trixie system, made once and reused while DIR/base.stamp matches
# what it was made from. Each check runs in DIR/root, a fresh copy of it, so setup.sh meets a
# machine without MPI, HDF5 or a venv every time. HPCEVO_DEBIAN13_REUSE=1 keeps DIR/root from
# the previous check instead (its MPICH, .venv and pip cache): a quick rerun while fixing
# setup.sh, not a proof. HPCEVO_DEBIAN_MIRROR: the archive (default http://deb.debian.org/debian).
# Exit status: 0 only when set-up, example and tests all passed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-/var/tmp/hpcevo-debian13}
MIRROR=${HPCEVO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
# What a fresh Debian 13 machine has (debootstrap's default variant: the required and important
# packages, as a minimal install) plus what the README assumes a user brings: python3 with its
# venv module, git to clone with, CA certificates for pip's HTTPS. No compiler and no Python
# headers: whatever setup.sh needs beyond this, it must install itself.
INCLUDE=python3,python3-venv,git,ca-certificates
BASE=$DIR/base
WORK=$DIR/root
REPO=/root/hpcevo  # where the tree lies inside the chroot, as a root user's clone would

say() { echo "[debian13] $*" >&2; }
die() { echo "[debian13] error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
case "$DIR" in /*) ;; *) die "DIR must be an absolute path (got '$DIR')" ;; esac

# Mounts live in a mount namespace of this script's own: whatever happens to it (even SIGKILL,
# where no trap runs), the kernel drops them with it and the host's /dev, /proc, /sys are never
# left bound into a tree that a later 'rm -rf' would walk.
if [ -z "${HPCEVO_DEBIAN13_NS:-}" ]; then
  HPCEVO_DEBIAN13_NS=1 exec unshare --mount --propagation private -- bash "$0" "$@"
fi

mounted_under() { awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts; }
# Never delete a tree that still has something mounted in it (rm -rf would descend into the
# host's /dev or /sys).
safe_rm() {
  [ -z "$(mounted_under "$1")" ] || die "refusing to remove $1: still mounted: $(mounted_under "$1" | tr '\n' ' ')"
  rm -rf --one-file-system "$1"
}

T0=$(date +%s)
mkdir -p "$DIR"

# 1. The pristine trixie system (once) ----------------------------------------------------------
WANT="suite=$SUITE mirror=$MIRROR include=$INCLUDE"
if [ ! -f "$DIR/base.stamp" ] || [ "$(cat "$DIR/base.stamp")" != "$WANT" ]; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  rm -f "$DIR/base.stamp"  # written last: a half-made base is made again next time
  safe_rm "$BASE"
  say "debootstrap $SUITE into $BASE (a few minutes)"
  # The trixie keyring: the host's debian-archive-keyring (bookworm's carries trixie's keys).
  nice -n 10 debootstrap --include="$INCLUDE" "$SUITE" "$BASE" "$MIRROR" > "$DIR/debootstrap.log" 2>&1 \
    || { tail -30 "$DIR/debootstrap.log" >&2; die "debootstrap failed (log: $DIR/debootstrap.log)"; }
  # The archive as Debian's installer lays it out (the release, its updates, security), brought
  # up to date: a machine installed today. debootstrap alone knows only "trixie main".
  rm -f "$BASE/etc/apt/sources.list"
  printf '%s\n' "Types: deb" "URIs: $MIRROR" "Suites: $SUITE $SUITE-updates" "Components: main" \
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" "" \
    "Types: deb" "URIs: ${MIRROR%/debian}/debian-security" "Suites: $SUITE-security" \
    "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
    > "$BASE/etc/apt/sources.list.d/debian.sources"
  cp -L /etc/resolv.conf "$BASE/etc/resolv.conf"
  # apt's download cache is cleaned last: every copy of the base would carry it.
  nice -n 10 chroot "$BASE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive /bin/sh -c \
    'apt-get update -qq && apt-get -y -qq upgrade && apt-get clean' >> "$DIR/debootstrap.log" 2>&1 \
    || { tail -30 "$DIR/debootstrap.log" >&2; die "updating the base failed (log: $DIR/debootstrap.log)"; }
  echo "$WANT" > "$DIR/base.stamp"
fi
T_BASE=$(date +%s)

# 2. The machine this check runs on: a fresh copy of the base ----------------------------------
if [ -n "${HPCEVO_DEBIAN13_REUSE:-}" ] && [ -d "$WORK$REPO" ]; then
  say "reusing $WORK (HPCEVO_DEBIAN13_REUSE: not a fresh machine)"
  # Only the venv stays; the tree is laid anew below.
  find "$WORK$REPO" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf --one-file-system {} +
else
  safe_rm "$WORK"
  say "copying the base into $WORK"
  cp -a "$BASE" "$WORK"
fi
# The host's name resolution: the chroot shares its network.
cp -L /etc/resolv.conf "$WORK/etc/resolv.conf"
# The certificate authorities this host trusts beyond Debian's (a site's TLS-inspecting proxy,
# say): sharing its network, the chroot meets the same certificates on the way to PyPI, and pip
# (which reads the system's store) fails without them. Copied each run: they can change.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$WORK/usr/local/share/ca-certificates/"
  chroot "$WORK" /usr/sbin/update-ca-certificates >/dev/null 2>&1
fi

# The working tree as a commit of it would hold it (tracked files, modified or not, plus untracked
# files git does not ignore): never the host's .venv, build/ or runs/. The venvs are left out by
# name too: .gitignore's '.venv/' matches a directory only, so a .venv that is a symlink (to
# another checkout's venv) is "untracked" to git, and setup.sh would meet it dangling.
mkdir -p "$WORK$REPO"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do
      case "$f" in .venv|.venv/*|.venv-gpu|.venv-gpu/*) continue ;; esac
      [ -e "$f" ] && printf '%s\0' "$f"
    done \
  | tar --null -T - -cf -) | tar -xf - -C "$WORK$REPO"

# 3. Mounts, undone on exit ----------------------------------------------------------------------
MOUNTS=()
cleanup() {
  local rc=$? m
  for (( i=${#MOUNTS[@]}-1; i>=0; i-- )); do
    m=${MOUNTS[i]}
    umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || say "could not unmount $m"
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for d in proc sys dev; do
  mount --rbind "/$d" "$WORK/$d"
  MOUNTS+=("$WORK/$d")
  # Unmounting the copy's submounts must never reach the host's (/dev/pts, /dev/shm, cgroups).
  mount --make-rslave "$WORK/$d"
done

# 4. Inside: set-up, example, tests --------------------------------------------------------------
# A clean environment: the host's pip settings (its index mirrors, wheel folders, constraints)
# and its PATH must not help setup.sh; the chroot reaches PyPI and deb.debian.org as a fresh
# machine would.
inside() {
  nice -n 10 chroot "$WORK" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "set -euo pipefail; cd $REPO; $1"
}

say "scripts/setup.sh inside Debian $(cat "$WORK/etc/debian_version")"
T_SETUP0=$(date +%s)
inside 'bash scripts/setup.sh' || die "scripts/setup.sh failed on Debian 13"
T_SETUP=$(date +%s)

say "versions"
inside '
  echo "Debian $(cat /etc/debian_version)"
  echo "system $(python3 -V)"
  echo "MPICH $(dpkg-query -W -f="\${Version}" mpich) ($(mpichversion 2>/dev/null | sed -n "s/^MPICH Version:[[:space:]]*//p"))"
  echo "HDF5 (libhdf5-mpich-dev) $(dpkg-query -W -f="\${Version}" libhdf5-mpich-dev)"
  .venv/bin/python - <<"PY"
import sys, h5py, jax, jaxlib, mpi4jax, mpi4py, numpy
from mpi4py import MPI
print("venv Python", sys.version.split()[0])
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "numpy", numpy.__version__)
print("mpi4py", mpi4py.__version__, "mpi4jax", mpi4jax.__version__, "MPI:", MPI.Get_library_version().splitlines()[0])
print("h5py", h5py.__version__, "HDF5", h5py.version.hdf5_version, "mpi", h5py.get_config().mpi)
PY
' | sed 's/^/[debian13]   /' >&2

say "the main example at 2 ranks (README), 20 generations"
T_EX0=$(date +%s)
out=$(inside 'mpiexec -n 2 .venv/bin/python -m hpcevo run examples/cso.toml --set run.generations=20 --overwrite 2>&1') \
  || { echo "$out" >&2; die "the example failed"; }
echo "$out" | tail -5 >&2
grep -q "done: best fitness" <<<"$out" || die "the example did not print 'done: best fitness'"
T_EX=$(date +%s)

say "tests: pure slice (1 process)"
# test_cec2022's opfunu test: setup.sh installs opfunu past its Requires-Python (< 3.12) on 3.13;
# this runs its code there.
inside '.venv/bin/python -m pytest -q -x -p no:cacheprovider tests/test_config.py tests/test_checkpoint.py tests/test_cec2022.py::test_matches_opfunu_where_opfunu_follows_the_organisers' \
  || die "tests (1 process) failed"
say "tests: MPI slice at 2 ranks"
inside 'mpiexec -n 2 .venv/bin/python -m mpi4py -m pytest -q -x -p no:cacheprovider -m "not single_process and not slow" tests/test_checkpoint.py tests/test_parallel.py' \
  || die "tests (2 ranks) failed"
T_END=$(date +%s)

say "passed: Debian 13 base $(( T_BASE - T0 )) s, set-up $(( T_SETUP - T_SETUP0 )) s, example $(( T_EX - T_EX0 )) s, tests $(( T_END - T_EX )) s; $(( T_END - T0 )) s in all"
