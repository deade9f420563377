#!/usr/bin/env bash
# The installed library as a user sees it: `cmake --install` into a temporary prefix (no root),
# examples/detect.c built with nothing but `pkg-config --cflags --libs detr` (PKG_CONFIG_PATH set to
# the prefix) against libdetr.so - and with `pkg-config --static` against libdetr.a - run on a
# synthetic image with a checkpoint that the installed `detr train` made, and with weights + an
# installed preset file: the same detections, to the printed digit, as the installed `detr predict`.
# Also: the installed files, the exported symbols, the man page.
# Usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR CC PKG_CONFIG
set -euo pipefail
cmake=$1 build=$2 src=$3 cc=$4 pkgconfig=$5
dir=$(mktemp -d /tmp/detr_install_test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
prefix=$dir/prefix
fail() { echo "FAILED: $*"; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$dir/install.log" || { cat "$dir/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name detr.pc)
[ -n "$pc" ] || fail "no detr.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in bin/detr include/detr.h share/detr/presets/tiny.conf share/detr/presets/detr-r50.conf \
         share/man/man1/detr.1 share/doc/detr/README.md share/doc/detr/library.md share/doc/detr/examples/detect.c; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
[ -e "$libdir/libdetr.a" ] && [ -e "$libdir/libdetr.so" ] || fail "libdetr.a / libdetr.so not in $libdir"
grep -q "^prefix=$prefix\$" "$pc" || fail "detr.pc does not name the prefix installed to: $(grep ^prefix= "$pc")"

# The shared library exports the public API only (every name detr_*, all declared in detr.h).
nm -D --defined-only "$libdir/libdetr.so" | awk '$2 == "T" {print $3}' | sort >"$dir/exports.txt"
grep -v '^detr_' "$dir/exports.txt" && fail "libdetr.so exports non-API symbols (above)"
while read -r sym; do
  grep -q "DETR_API.*[ *]$sym(" "$prefix/include/detr.h" || fail "libdetr.so exports $sym, which detr.h does not declare"
done <"$dir/exports.txt"
[ "$(wc -l <"$dir/exports.txt")" -ge 15 ] || fail "too few exports: $(cat "$dir/exports.txt")"

# The example, with pkg-config only (and the public header strict C99, warnings as errors).
export PKG_CONFIG_PATH=$libdir/pkgconfig
flags=$("$pkgconfig" --cflags --libs detr) || fail "pkg-config --cflags --libs detr"
echo "pkg-config --cflags --libs detr: $flags"
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror -o "$dir/detect" "$src/examples/detect.c" $flags \
  || fail "examples/detect.c does not build against the installed library"
static_flags=$("$pkgconfig" --cflags --static --libs detr | sed 's/-ldetr\b/-l:libdetr.a/')
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror -o "$dir/detect_static" "$src/examples/detect.c" $static_flags \
  || fail "examples/detect.c does not link statically with pkg-config --static ($static_flags)"
readelf -d "$dir/detect_static" | grep -q 'libdetr\.so' && fail "detect_static depends on libdetr.so"
export LD_LIBRARY_PATH=$libdir  # the temporary prefix is not in the loader's path

# Data and a checkpoint made by the installed tool: a synthetic dataset, one tiny training epoch.
detr=$prefix/bin/detr
"$detr" synth --out "$dir/syn" --train 2 --val 2 --min-side 64 --max-side 96 >/dev/null
"$detr" train --data "$dir/syn" --config tiny --set num_classes=14 --epochs 1 --batch 2 --threads 1 \
  --out "$dir/run" >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "detr train"; }
ckpt=$(ls "$dir"/run/ckpt-*.safetensors | head -1)
"$detr" info "$ckpt" | grep -q "crc32: *ok" || fail "the checkpoint does not verify"

# predict's JSON detection lines in the example's format: "NAME (label L): SCORE at [X0, Y0, X1, Y1]".
from_json() {
  sed -n 's/^  {"label": \([0-9]*\), "category_id": [0-9]*, "name": "\([^"]*\)", "score": \([^,]*\), "box": \[\([^,]*\), \([^,]*\), \([^,]*\), \([^]]*\)\], "query": [0-9]*},\{0,1\}$/\2 (label \1): \3 at [\4, \5, \6, \7]/p' "$1"
}
compare() {  # compare NAME EXAMPLE_OUTPUT PREDICT_JSON
  from_json "$3" >"$dir/$1.predict.txt"
  [ -s "$dir/$1.predict.txt" ] || fail "$1: no detections from detr predict"
  if ! diff "$2" "$dir/$1.predict.txt"; then fail "$1: examples/detect.c and detr predict disagree (above)"; fi
  echo "$1: $(wc -l <"$2") detections agree"
}
n=0
for img in "$dir"/syn/val/*.jpg; do
  n=$((n + 1))
  "$dir/detect" "$ckpt" "$img" 0 >"$dir/ckpt$n.txt" || fail "detect on $img"
  "$dir/detect_static" "$ckpt" "$img" 0 >"$dir/ckpt$n.static.txt" || fail "detect_static on $img"
  "$detr" predict --checkpoint "$ckpt" "$img" --out "$dir/p$n" --threshold 0 >/dev/null
  compare "checkpoint-$n" "$dir/ckpt$n.txt" "$dir/p$n/predictions.json"
  diff "$dir/ckpt$n.txt" "$dir/ckpt$n.static.txt" >/dev/null || fail "static and shared builds of the example differ"
  grep -q "^rectangle \|^ellipse \|^triangle \|^diamond \|^cross \|^ring \|^class " "$dir/ckpt$n.txt" || fail "no class names"
done
# A threshold; a checkpoint given as weights (refused: its optimizer moments are not model
# tensors); weights from step_compare with the installed preset file (plus an override) as the
# config: the same as predict with --config tiny --set num_classes=14.
th=$(sed -n '5s/.*: \([^ ]*\) at .*/\1/p' "$dir/ckpt1.txt")  # the fifth best score
"$dir/detect" "$ckpt" "$dir/syn/val/000000000001.jpg" "$th" >"$dir/th.txt"
"$detr" predict --checkpoint "$ckpt" "$dir/syn/val/000000000001.jpg" --out "$dir/pt" --threshold "$th" >/dev/null
compare threshold "$dir/th.txt" "$dir/pt/predictions.json"
cp "$prefix/share/detr/presets/tiny.conf" "$dir/model.conf"
echo "num_classes=14" >>"$dir/model.conf"
"$dir/detect" "$ckpt" "$dir/syn/val/000000000001.jpg" 0 "$dir/model.conf" >"$dir/w.txt" 2>&1 \
  && fail "a checkpoint opened as weights should be refused: $(cat "$dir/w.txt")"
grep -q "DETR_ERR_MISMATCH" "$dir/w.txt" || fail "checkpoint as weights: $(cat "$dir/w.txt")"
"$build/tests/step_compare" weights --config tiny --set num_classes=14 --seed 5 --out "$dir/w.safetensors" >/dev/null
"$dir/detect" "$dir/w.safetensors" "$dir/syn/val/000000000001.jpg" 0 "$dir/model.conf" >"$dir/w.txt"
"$detr" predict --weights "$dir/w.safetensors" --config tiny --set num_classes=14 "$dir/syn/val/000000000001.jpg" \
  --out "$dir/pw" --threshold 0 >/dev/null
compare weights "$dir/w.txt" "$dir/pw/predictions.json"
# Bad input: an error code and a message, exit 1 - never a crash.
set +e
"$dir/detect" "$dir/missing.safetensors" "$dir/syn/val/000000000001.jpg" >"$dir/bad.txt" 2>&1
rc=$?
set -e
[ $rc = 1 ] && grep -q "DETR_ERR_IO: .*missing.safetensors: cannot open" "$dir/bad.txt" || fail "missing file: exit $rc: $(cat "$dir/bad.txt")"

# The man page holds every verb's help text.
for verb in train eval predict synth info step cocoeval pretrain; do
  usage=$("$detr" help "$verb" | sed -n 1p)  # sed reads it all: head would end detr with SIGPIPE
  grep -qF "$usage" "$prefix/share/man/man1/detr.1" || fail "detr.1 lacks '$usage'"
done
echo "install_test: ok ($prefix)"
