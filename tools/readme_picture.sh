#!/usr/bin/env bash
# The README's picture, docs/images/main_job.png: the main job's chart (loss and AP by epoch) beside
# its detections on two val images, from a finished run of tools/main.sh.
#   bash tools/readme_picture.sh [RUN_DIR]      (default runs/main)
# Uses ImageMagick from Debian (installed here when missing: it is needed for nothing else).
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-runs/main}
chart=$run/chart.png
preds=("$run"/predict/000000000001.png "$run"/predict/000000000003.png)
for f in "$chart" "${preds[@]}"; do
  [ -f "$f" ] || { echo "readme_picture: $f is missing: run bash tools/main.sh first" >&2; exit 1; }
done
# Debian's binary by its own name: another `convert` may come first on PATH.
im=/usr/bin/convert-im6.q16
if [ ! -x "$im" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends imagemagick
fi
out=docs/images/main_job.png
# Side by side at one height, each with a white margin.
"$im" "$chart" "${preds[@]}" -resize x300 -bordercolor white -border 6 +append -strip "$out"
echo "readme_picture: wrote $out from $run"
