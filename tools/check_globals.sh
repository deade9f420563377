#!/usr/bin/env bash
# The project's mutable process-wide state, listed: every variable the built libraries keep in
# writable static storage (.data, .bss, and their thread-local twins: file-scope and function-scope
# statics alike), read from the object files, against tools/globals_allowed.txt. Each entry there
# says why the variable is process-wide; everything else belongs in the runtime (core/runtime.h).
# Fails on a variable not listed, and on a listed one that no longer exists in an object the build
# has (the list stays true; a build without CUDA does not judge the CUDA objects' entries).
#   bash tools/check_globals.sh BUILD_DIR     (ctest's `globals`, label `source`)
set -euo pipefail
build=${1:?usage: tools/check_globals.sh BUILD_DIR}
root="$(cd "$(dirname "$0")/.." && pwd)"
allowed="$root/tools/globals_allowed.txt"
found=$(mktemp)
listed=$(mktemp)
objects=$(mktemp)
trap 'rm -f "$found" "$listed" "$objects"' EXIT

for lib in "$build/libdetr.a" "$build/libdetr_train.a"; do
  [ -f "$lib" ] || { echo "check_globals: $lib is missing (build first)" >&2; exit 2; }
  ar t "$lib" | sed 's/\.o$//' >>"$objects"
  # objdump -t: "VALUE FLAGS SECTION SIZE NAME"; section symbols (flag d) and functions (F) are not variables.
  objdump -t "$lib" | awk '
    /\.o:[ \t]+file format/ { obj = $1; sub(/:$/, "", obj); next }
    $0 ~ /[ \t]\.(data|bss|tdata|tbss)[ \t]/ && $0 !~ /[ \t]d[ \t]/ && $0 !~ /[ \t]F[ \t]/ {
      name = $NF
      # nvcc-generated: kernel launch stubs, the fat binary handle, exception personality
      if (name ~ /__device_stub|__cudaFatCubinHandle|__fatDeviceText|__nv_|gxx_personality|^_ZGV/) next
      sub(/\.o$/, "", obj)
      sub(/\.[0-9]+$/, "", name)   # a function-scope static: name.N
      print obj, name
    }'
done | sort -u >"$found"

# A build without CUDA has no .cu objects, nor the variables a C object keeps only for CUDA (marked cuda).
cuda=$(grep -q '\.cu$' "$objects" && echo 1 || echo 0)
{ grep -v '^\s*#' "$allowed" || true; } | { grep -v '^\s*$' || true; } |
  awk -v cuda="$cuda" '$3 != "cuda" || cuda { print $1, $2 }' | sort -u >"$listed"
# A build without CUDA (or oneDNN) has no such objects: their entries are not judged.
awk 'NR == FNR { built[$1] = 1; next } built[$1]' "$objects" "$listed" >"$listed.built"
mv "$listed.built" "$listed"

status=0
unlisted=$(comm -23 "$found" "$listed")
if [ -n "$unlisted" ]; then
  echo "check_globals: mutable process-wide variables not in tools/globals_allowed.txt (move them into the"
  echo "runtime, core/runtime.h, or a struct the caller owns; or list them there with why they are process-wide):"
  echo "$unlisted" | sed 's/^/  /'
  status=1
fi
stale=$(comm -13 "$found" "$listed")
if [ -n "$stale" ]; then
  echo "check_globals: listed in tools/globals_allowed.txt but no longer in the libraries (remove them):"
  echo "$stale" | sed 's/^/  /'
  status=1
fi
[ $status -eq 0 ] && echo "check_globals: $(wc -l <"$found") process-wide variables, each listed with its reason"
exit $status
