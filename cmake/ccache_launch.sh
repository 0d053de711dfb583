#!/usr/bin/env bash
# The compiler launcher of stratbench's C++ compiles (CMakeLists.txt), so that a fresh clone
# elsewhere reuses what another checkout compiled:
#
#   cmake/ccache_launch.sh SOURCE_DIR CCACHE COMPILER ARGS...   (C++ and CUDA compiles)
#
# - base_dir SOURCE_DIR: paths inside the checkout are hashed relative to it; with
#   -fdebug-prefix-map (CMakeLists.txt) the working folder is not hashed either.
# - The precompiled header: GCC's .gch is not reproducible (two compiles of the same header in
#   the same folder differ in some 5 M bytes), and ccache hashes it into every object that uses
#   it, so without more every such object (some 180 of 217) missed in a fresh clone. With
#   pch_external_checksum ccache hashes X.gch.sum instead, which this launcher writes when it
#   compiles X.gch: the SHA-256 of the header's preprocessed text with its macro definitions
#   (-E -dD -P: what the .gch holds, without line markers, so no path of the checkout) and of
#   its command line with SOURCE_DIR spelled '.'. A stale sum is removed before the compile and
#   none is written if it cannot be computed (ccache then hashes the .gch itself, as before).
set -u
src=$1 ccache=$2
shift 2
export CCACHE_BASEDIR=$src
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_PCH_EXTSUM=1
# nvcc (kernels/*.cu): its debug info cannot be remapped as GCC's is, so the working folder is
# left out of the hash (an object from another checkout names that checkout's folder).
case "$(basename "$1")" in nvcc) export CCACHE_NOHASHDIR=1 ;; esac

out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
case "$out" in
  *.gch) ;;
  *) exec "$ccache" "$@" ;;
esac

rm -f "$out.sum"
"$ccache" "$@" || exit $?
# The same compile, preprocessed: drop the output, the dependency file and -c.
pre=()
skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in
    -o | -MF | -MT | -MQ) skip=1 ;;
    -c | -MD | -MMD) ;;
    *) pre+=("$a") ;;
  esac
done
tmp=$(mktemp)
if "${pre[@]}" -E -dD -P -o - >"$tmp" 2>/dev/null; then
  { printf '%s\n' "${pre[@]//$src/.}"; cat "$tmp"; } | sha256sum | cut -d' ' -f1 >"$out.sum.tmp" &&
    mv "$out.sum.tmp" "$out.sum"
fi
rm -f "$tmp" "$out.sum.tmp"
exit 0
