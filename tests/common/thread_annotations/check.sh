#!/bin/sh
# thread_annotations_check CLANGXX SRC: good.cc compiles under clang's
# -Wthread-safety -Werror; bad.cc compiles as it is and fails with either
# violation switched on (BAD_LOCK, BAD_ROLE).
set -u
cxx=$1
src=$2
here=$(dirname "$0")
tsa() { "$cxx" -std=c++17 -fsyntax-only -Wthread-safety -Werror -I"$src" "$@"; }
tsa "$here/good.cc" || { echo "FAIL: good.cc does not compile"; exit 1; }
tsa "$here/bad.cc" || { echo "FAIL: bad.cc does not compile without a violation"; exit 1; }
for v in BAD_LOCK BAD_ROLE; do
  if tsa -D"$v" "$here/bad.cc" 2>/dev/null; then
    echo "FAIL: $v compiled: the annotations check nothing"
    exit 1
  fi
done
echo "PASS: the thread annotations reject both violations"
