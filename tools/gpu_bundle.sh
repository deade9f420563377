#!/usr/bin/env bash
# Downloads the Debian packages that detr-c's build needs besides a C compiler, CMake and the CUDA
# toolkit - OpenBLAS (OpenMP), Check and subunit, YAJL, zlib, stb, oneDNN and pkgconf, with their
# dependencies - as .deb files into gpu-bundle/ (git-ignored), for tools/gpu_check.sh on a GPU
# machine that may be bare and offline: it unpacks them into a private prefix (dpkg -x) when the
# system lacks them. Nothing is installed here.
#
#   bash tools/gpu_bundle.sh [--out DIR] [--no-update] [--no-onednn]
#
# Run it on a machine with the package registries and the same distribution and release as the GPU
# machine (a container of its image will do): the libraries are built against that release's C
# library. gpu-bundle/MANIFEST records the release, the architecture and every package's version
# and sha256; gpu_check.sh warns when the GPU machine's release differs. Copy gpu-bundle/ (about
# 25 MB) next to the checkout on the GPU machine, or point DETR_GPU_BUNDLE at it.
#
# Left out: what every system with a C compiler has (the C library and its headers, libgcc,
# libstdc++, libgomp) - unpacked into a prefix on the library path they would shadow the system's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${DETR_GPU_BUNDLE:-$root/gpu-bundle}
update=1
packages=(pkgconf libopenblas-openmp-dev check libsubunit-dev zlib1g-dev libyajl-dev libstb-dev libdnnl-dev)
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --no-update) update=0; shift ;;
    --no-onednn) packages=("${packages[@]:0:${#packages[@]}-1}"); shift ;;  # libdnnl-dev is last
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v apt-get >/dev/null && command -v apt-cache >/dev/null && command -v dpkg >/dev/null || {
  echo "gpu_bundle: needs apt-get, apt-cache and dpkg (a Debian or Ubuntu machine)" >&2
  exit 1
}
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
if [ "$update" = 1 ]; then
  echo "gpu_bundle: apt-get update"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
fi

# The packages and everything they depend on (not what they recommend), minus the compiler's own.
skip='^(libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt[0-9]*|libcrypt-dev|libnsl[0-9]*|libnsl-dev|libtirpc[0-9]*|libtirpc-common|libtirpc-dev|rpcsvc-proto|libgssapi-krb5-[0-9]+|libk5crypto[0-9]+|libkeyutils[0-9]+|libkrb5-[0-9]+|libkrb5support[0-9]+|libcom-err[0-9]+|libssl[0-9.]+|libgcc-s[0-9]+|gcc-[0-9]+-base|libstdc\+\+6|libgomp[0-9]+|mawk|debconf|dpkg|tar|perl-base|libselinux[0-9]+|libpcre2-[0-9a-z-]+)$'
mapfile -t all < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
                     --no-replaces --no-enhances "${packages[@]}" | grep -E '^[a-z0-9]' | sort -u)
wanted=()
for p in "${all[@]}"; do
  [[ $p =~ $skip ]] || wanted+=("$p")
done

mkdir -p "$out/debs"
rm -f "$out"/debs/*.deb
echo "gpu_bundle: downloading ${#wanted[@]} packages into $out/debs"
# apt-get download writes into the current directory; as root it warns that the _apt user cannot
# write there (the download is then unsandboxed): harmless.
(cd "$out/debs" && apt-get download "${wanted[@]}" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true)
n=$(ls "$out"/debs/*.deb 2>/dev/null | wc -l)
if [ "$n" -ne "${#wanted[@]}" ]; then
  echo "gpu_bundle: expected ${#wanted[@]} .deb files, got $n" >&2
  exit 1
fi

. /etc/os-release
{
  echo "# detr-c GPU build bundle: tools/gpu_bundle.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "distro=${ID}"
  echo "release=${VERSION_ID:-unknown}"
  echo "codename=${VERSION_CODENAME:-unknown}"
  echo "arch=$(dpkg --print-architecture)"
  echo "requested=${packages[*]}"
  echo "# package version sha256"
  for f in "$out"/debs/*.deb; do
    echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(sha256sum "$f" | cut -d' ' -f1)"
  done
} > "$out/MANIFEST"
echo "gpu_bundle: $n packages, $(du -sh "$out/debs" | cut -f1), for ${ID} ${VERSION_ID:-} ($(dpkg --print-architecture)):"
echo "  $(ls "$out"/debs | sed 's/_.*//' | tr '\n' ' ')"
echo "gpu_bundle: manifest in $out/MANIFEST; tools/gpu_check.sh uses the bundle when the system lacks a package"
