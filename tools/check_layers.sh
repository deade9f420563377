#!/usr/bin/env bash
# The layers of docs/architecture.md ("The layers"), checked: every #include "FOLDER/..." of a C,
# CUDA or header file in a layer's folder names that folder or one the table puts below it, so the
# dependencies point down only and have no cycles. Fails naming each include that points up or
# sideways, and a folder the table below does not know.
#   bash tools/check_layers.sh     (ctest's `layers`, label `source`)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each folder and what it may include besides itself: the table of docs/architecture.md, top down.
# datasets/ and nn/ sit side by side, as do eval/ and viz/: neither of a pair includes the other.
declare -A may_include=(
  [cli]="train eval viz dist api include nn datasets autograd tensor kernels core"
  [train]="eval viz dist api include nn datasets autograd tensor kernels core"
  [eval]="dist nn datasets autograd tensor kernels core"
  [viz]="datasets tensor kernels core"
  [dist]="nn autograd tensor kernels core"
  [api]="include nn datasets autograd tensor kernels core"
  [include]=""
  [nn]="autograd tensor kernels core"
  [datasets]="tensor kernels core"
  [autograd]="tensor kernels core"
  [tensor]="kernels core"
  [kernels]="core"
  [core]=""
)

status=0
checked=0
# The repository's sources (tracked, or new and not ignored), by top folder.
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' '*.cuh' | sort -u)
for file in "${files[@]}"; do
  layer=${file%%/*}
  [ "$layer" != "$file" ] || continue  # a file at the top (there is none) belongs to no layer
  case "$layer" in tests | bench | tools | fuzz | examples) continue ;; esac  # beside the layers: may use any
  if [ -z "${may_include[$layer]+known}" ]; then
    echo "check_layers: $file: $layer/ is not a layer of docs/architecture.md (add it there and here)"
    status=1
    continue
  fi
  checked=$((checked + 1))
  allowed=" $layer ${may_include[$layer]} "
  # "LINE:#include "FOLDER/..."": the folder is the include path's first component.
  while IFS=: read -r line text; do
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"/]*)\/.*/\1/' <<<"$text")
    if [ -z "${may_include[$target]+known}" ]; then
      echo "check_layers: $file:$line: includes $target/, which is not a layer of docs/architecture.md"
      status=1
    elif [[ $allowed != *" $target "* ]]; then
      echo "check_layers: $file:$line: $layer/ includes $target/, which is not below it"
      status=1
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*/' "$file" || true)
done
[ $status -eq 0 ] && echo "check_layers: the $checked files of ${#may_include[@]} layers include only their own layer and those below"
exit $status
