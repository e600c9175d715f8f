#!/usr/bin/env bash
# tools/format_check.sh [--fix] — the C, C++ and CUDA sources of the folders
# in FORMATTED, checked against .clang-format (clang-format 14, Debian 12's;
# installed here as root where missing, as tools/setup.sh does, so that CI
# runs it before the builds): each file that would change is named with
# clang-format's first differences, and the check exits 1. --fix formats
# them in place instead. A folder joins FORMATTED once it is formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
FORMATTED=(plugins/gloo plugins/mpi plugins/nccl strategies
           engine/bench engine/blas engine/config engine/core engine/io engine/launch engine/plan engine/models
           engine/train engine/host engine/main.cpp plugins/include)
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null && [ "$(id -u)" -eq 0 ] && [ "$clang_format" = clang-format ]; then
  echo "format_check: installing clang-format (Debian's, as tools/setup.sh does)"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang-format
fi
if ! command -v "$clang_format" >/dev/null; then
  echo "format_check: $clang_format not found: install Debian's clang-format (tools/setup.sh does, as root)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files -- "${FORMATTED[@]}" | grep -E '\.(h|hpp|c|cpp|cu|cuh)$')
if [ "${1:-}" = --fix ]; then
  "$clang_format" -i "${files[@]}"
  echo "format_check: formatted ${#files[@]} files of ${FORMATTED[*]}"
  exit 0
fi
failed=()
for f in "${files[@]}"; do
  if ! out=$("$clang_format" --dry-run --Werror "$f" 2>&1); then
    failed+=("$f")
    printf '%s\n' "$out" | head -n 6 >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "format_check: ${#failed[@]} of ${#files[@]} files of ${FORMATTED[*]} differ from .clang-format:" \
       "${failed[*]} (tools/format_check.sh --fix formats them)" >&2
  exit 1
fi
echo "format_check: ${#files[@]} files of ${FORMATTED[*]} follow .clang-format"
