#!/usr/bin/env bash
# The gloo backend compiled against another Gloo's headers is sound only while none of Gloo's
# code is ours. A pip wheel's LibTorch ships no Gloo headers, so the torch2 leg parses
# ProcessGroupGloo.hpp with Debian's (libgloo-dev), which are not those of the Gloo inside the
# wheel. That is safe exactly when our library neither defines a symbol of Gloo (an inline
# function, vtable or typeinfo instantiated from Debian's headers, which the dynamic linker
# could also bind LibTorch's own calls to) nor calls one (a Gloo function whose signature or
# layout may differ in the wheel's Gloo), and deletes no Gloo object (a shared_ptr control
# block made here would run Debian's destructor): every Gloo object is made, used and destroyed
# inside LibTorch, and ours only copies its shared_ptr (harness/comm/c10d_gloo.cpp). A
# std::vector of such shared_ptrs is Gloo-free code (its layout does not depend on the pointee)
# and is allowed.
#
#   ci/gloo_abi_check.sh LIBRARY       exit 0 if LIBRARY has no gloo:: symbol, 1 naming them
#   ci/gloo_abi_check.sh --self-test   a planted inline gloo:: function must be caught
set -euo pipefail

if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # What c10d_gloo.cpp does (a vector of shared_ptrs to an opaque device, pushed to): clean.
  cat >"$tmp/clean.cpp" <<'CPP'
#include <memory>
#include <vector>
namespace gloo { struct Device; }
void keep(std::vector<std::shared_ptr<gloo::Device>>& v, const std::shared_ptr<gloo::Device>& d) {
  v.push_back(d);
}
CPP
  # A Gloo class's inline code instantiated here: its vtable, typeinfo and functions.
  cat >"$tmp/planted.cpp" <<'CPP'
namespace gloo { struct Device { virtual ~Device() = default; virtual int rank() const { return 0; } }; }
gloo::Device* makeDevice() { return new gloo::Device(); }
CPP
  # A Gloo object deleted here: the shared_ptr's control block runs this header's destructor.
  cat >"$tmp/deleter.cpp" <<'CPP'
#include <memory>
namespace gloo { struct Pair { int fd = 0; }; }
std::shared_ptr<gloo::Pair> makePair() { return std::make_shared<gloo::Pair>(); }
CPP
  for f in clean planted deleter; do c++ -shared -fPIC -o "$tmp/lib$f.so" "$tmp/$f.cpp"; done
  out=$("$0" "$tmp/libclean.so" 2>&1) || { echo "self-test: a vector of shared_ptrs failed: $out"; exit 1; }
  for f in planted:gloo::Device deleter:gloo::Pair; do
    out=$("$0" "$tmp/lib${f%%:*}.so" 2>&1) && { echo "self-test: planted ${f#*:} (${f%%:*}) passed"; exit 1; }
    grep -q "${f#*:}" <<<"$out" || { echo "self-test: planted ${f%%:*} not named: $out"; exit 1; }
  done
  echo "self-test: Gloo code and a Gloo deleter planted are caught; a vector of shared_ptrs passes"
  exit 0
fi

lib=${1:?usage: ci/gloo_abi_check.sh LIBRARY | --self-test}
[ -f "$lib" ] || { echo "gloo_abi_check: no library '$lib'" >&2; exit 2; }
# Dynamic symbols, defined and undefined: a function of namespace gloo ("gloo::...::name("),
# a Gloo class's vtable, typeinfo or thunk, and a control block that deletes a Gloo object.
found=$(nm -DC "$lib" | grep -E \
  -e '(^|[ *&(<,])gloo::[A-Za-z0-9_:~]*(\(|operator)' \
  -e '(typeinfo|typeinfo name|vtable|VTT|construction vtable|guard variable) for gloo::' \
  -e 'virtual thunk to gloo::' -e '_Sp_counted_[A-Za-z_]*<gloo::' || true)
if [ -n "$found" ]; then
  echo "$lib uses Gloo's code directly (its headers need not be the wheel's Gloo's):"
  echo "$found"
  exit 1
fi
echo "$lib: no gloo:: symbol defined or called (Gloo's objects stay inside LibTorch)"
