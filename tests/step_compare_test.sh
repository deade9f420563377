#!/usr/bin/env bash
# Self-test of the comparison tools/gpu_check.sh runs between `detr step` on CUDA and on the CPU,
# with the CPU on both sides (no GPU needed): identical runs agree exactly; another dropout draw is
# a float difference over tolerance (exit 1); other targets change the matching (diverged, exit 3);
# the same images with other targets change the matching only (diverged, exit 3); a file with other
# tensors is a failure. Usage: step_compare_test.sh DETR STEP_COMPARE
set -euo pipefail
detr=$1 cmp=$2
dir=$(mktemp -d /tmp/step_compare_test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
expect() {  # expect STATUS command...
  local want=$1 got=0
  shift
  "$@" >"$dir/out.txt" 2>&1 || got=$?
  if [ "$got" != "$want" ]; then
    echo "FAILED: '$*' exited $got, expected $want:"
    cat "$dir/out.txt"
    exit 1
  fi
  cat "$dir/out.txt"
}
"$cmp" batch --out "$dir/b1.safetensors" --batch 2 --hw 64x96 --classes 7 --boxes 3 --seed 1
"$cmp" batch --out "$dir/b2.safetensors" --batch 2 --hw 64x96 --classes 7 --boxes 3 --seed 1 --target-seed 2
"$cmp" weights --config tiny --set enact=true --seed 3 --out "$dir/w.safetensors"
step() {  # step OUT BATCH SEED
  "$detr" step --config tiny --set enact=true --weights "$dir/w.safetensors" --batch "$2" --seed "$3" --out "$1" >/dev/null
}
step "$dir/a.safetensors" "$dir/b1.safetensors" 5
step "$dir/a2.safetensors" "$dir/b1.safetensors" 5
step "$dir/c.safetensors" "$dir/b1.safetensors" 6   # other dropout masks
step "$dir/d.safetensors" "$dir/b2.safetensors" 5   # the same images, other targets
expect 0 "$cmp" diff "$dir/a.safetensors" "$dir/a2.safetensors" --tol 0
grep -q "PASS" "$dir/out.txt"
expect 1 "$cmp" diff "$dir/a.safetensors" "$dir/c.safetensors" --tol 1e-3
grep -q "FAIL (outputs)" "$dir/out.txt"
expect 3 "$cmp" diff "$dir/a.safetensors" "$dir/d.safetensors" --tol 1e-3
grep -q "outputs .* max relative error 0 " "$dir/out.txt"
expect 1 "$cmp" diff "$dir/a.safetensors" "$dir/w.safetensors"
echo "step_compare_test: ok"
