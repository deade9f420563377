#!/usr/bin/env bash
# The C, CUDA and header files of the repository in the house layout (.clang-format):
#   bash tools/format.sh           rewrites every file that differs
#   bash tools/format.sh --check   lists the files that differ and exits 1 if there are any
#                                  (ctest's `format` entry; CI runs it through tools/test.sh)
# tests/fixtures/ is left alone: the function-length checker's fixture is laid out by hand and
# its test names a line number in it. Needs clang-format 14 (Debian 12's; tools/setup.sh installs it):
# another major version lays out some lines differently, so the check refuses to judge with one.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-write}
command -v clang-format >/dev/null || { echo "format: clang-format is not installed (apt-get install clang-format)" >&2; exit 2; }
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$major" != 14 ]; then
  echo "format: clang-format $major found; the layout is defined by version 14 (Debian 12's)" >&2
  [ "$mode" = --check ] && exit 2
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v '^tests/fixtures/')
if [ "$mode" = --check ]; then
  # shellcheck disable=SC2016
  mapfile -t bad < <(printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$(nproc)" sh -c \
    'for f; do clang-format --style=file "$f" | cmp -s - "$f" || echo "$f"; done' sh | sort)
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'format: %s is not laid out as .clang-format says\n' "${bad[@]}" >&2
    echo "format: ${#bad[@]} of ${#files[@]} files differ; run bash tools/format.sh to rewrite them" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files laid out as .clang-format says"
else
  clang-format --style=file -i "${files[@]}"
fi
