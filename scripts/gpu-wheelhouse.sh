#!/usr/bin/env bash
# Gather, on a machine with a package registry, everything a GPU node without one needs to run
# hpcevo beside its image's JAX: requirements/gpu-node.txt as binary wheels for the node's Python
# (manylinux x86_64), and mpi4jax's source. scripts/gpu-node-setup.sh installs from the folder.
#
#   scripts/gpu-wheelhouse.sh [DIR]          # default <repo>/.whl/gpu
#
# Knobs: HPCEVO_NODE_PYTHON (the node's Python version, default 3.12), HPCEVO_WHEELHOUSE_MIB (the
# size the folder must fit, default 64: what travels to the lent GPU machines), HPCEVO_PYTHON
# (the interpreter whose pip downloads, default the repo's .venv, else python3),
# HPCEVO_WHEELHOUSE_FROM (a folder of wheels and sources to gather from instead of the registry,
# offline: the suite's gpu_kit tier gathers from the copy scripts/gpu-kit-cache.sh keeps).
# Writes DIR/MANIFEST (name, size, sha256 of each file) and prints the total size.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-$ROOT/.whl/gpu}
PYVER=${HPCEVO_NODE_PYTHON:-3.12}
LIMIT_MIB=${HPCEVO_WHEELHOUSE_MIB:-64}
REQS=$ROOT/requirements/gpu-node.txt
if [ -n "${HPCEVO_PYTHON:-}" ]; then PY=$HPCEVO_PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3; fi

say() { echo "[wheelhouse] $*" >&2; }
die() { echo "[wheelhouse] error: $*" >&2; exit 1; }

[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "HPCEVO_NODE_PYTHON='$PYVER': give a version like 3.12"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (set HPCEVO_PYTHON)"
mkdir -p "$DIR"

# Every pin of the list, split by kind: mpi4jax is source-only, the rest must be binary.
mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$REQS" | grep -v '^$')
binary=() source=()
for p in "${pins[@]}"; do
  case "$p" in mpi4jax==*) source+=("$p") ;; *) binary+=("$p") ;; esac
done

# pip matches manylinux tags exactly: name every glibc level a wheel may be tagged with.
platforms=()
for tag in manylinux1 manylinux2010 manylinux2014; do platforms+=(--platform "${tag}_x86_64"); done
for n in 5 12 17 24 26 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done

PIP=("$PY" -m pip --disable-pip-version-check -q)
FROM=()
if [ -n "${HPCEVO_WHEELHOUSE_FROM:-}" ]; then
  [ -d "$HPCEVO_WHEELHOUSE_FROM" ] || die "HPCEVO_WHEELHOUSE_FROM='$HPCEVO_WHEELHOUSE_FROM' is not a folder"
  FROM=(--no-index --find-links "$HPCEVO_WHEELHOUSE_FROM")
fi
say "binary wheels for CPython $PYVER, manylinux x86_64: ${binary[*]}"
"${PIP[@]}" download "${FROM[@]}" --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$DIR" "${binary[@]}"
say "sources: ${source[*]}"
# --no-build-isolation: reading an sdist's metadata must not reach for build tools it lists.
"${PIP[@]}" download "${FROM[@]}" --no-deps --no-binary=:all: --no-build-isolation -d "$DIR" "${source[@]}"

# One version of each: a folder reused across pin changes would otherwise hold two, and the
# node's install takes every file in it.
for f in "$DIR"/*.whl "$DIR"/*.tar.gz; do
  [ -e "$f" ] || continue
  base=$(basename "$f")
  name=$(echo "${base%%-[0-9]*}" | tr 'A-Z_.' 'a-z--')
  version=$(echo "$base" | sed -E 's/^[^-]+-([^-]+)(-.*)?\.(whl|tar\.gz)$/\1/')
  want=$(printf '%s\n' "${pins[@]}" | tr 'A-Z_.' 'a-z--' | awk -F'==' -v n="$name" '$1 == n {print $2}' \
         | tr '-' '.')
  if [ -z "$want" ] || [ "$(echo "$version" | tr '_-' '..')" != "$want" ]; then
    say "removing $base (not in $REQS)"; rm -f "$f"
  fi
done

(cd "$DIR" && for f in *.whl *.tar.gz; do
  [ -e "$f" ] && printf '%s %s %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
done) > "$DIR/MANIFEST"
count=$(wc -l < "$DIR/MANIFEST")
[ "$count" -eq "${#pins[@]}" ] || die "$count files in $DIR, but $REQS pins ${#pins[@]}: see $DIR/MANIFEST"
bytes=$(awk '{s += $2} END {print s}' "$DIR/MANIFEST")
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
say "$count files, $mib MiB in $DIR (limit $LIMIT_MIB MiB)"
awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN {exit !(b <= l * 1048576)}' \
  || die "the wheelhouse is $mib MiB, over the $LIMIT_MIB MiB that can be carried"
echo "$DIR"
