#!/bin/sh
# thread_annotations_check CLANGXX SRC: snippet.cc compiles under clang's
# -Wthread-safety -Werror, and fails with either violation switched on
# (BAD_LOCK, BAD_ROLE).
set -u
cxx=$1
src=$2
here=$(dirname "$0")
tsa() { "$cxx" -std=c++17 -fsyntax-only -Wthread-safety -Werror -I"$src" "$@" "$here/snippet.cc"; }
tsa || { echo "FAIL: snippet.cc does not compile"; exit 1; }
for v in BAD_LOCK BAD_ROLE; do
  if tsa -D"$v" 2>/dev/null; then
    echo "FAIL: $v compiled: the annotations check nothing"
    exit 1
  fi
done
echo "PASS: the thread annotations reject both violations"
