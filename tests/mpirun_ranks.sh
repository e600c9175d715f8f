#!/usr/bin/env bash
# mpirun_ranks.sh WORLD PROGRAM [ARGS...] — runs a GoogleTest program as
# WORLD ranks launched by mpirun, the way a transport whose ranks only a
# launcher starts (mpi) is tested: each process is one rank, and
# tests/multirank.h's run_ranks runs each test's body once in it, as that
# rank. The ranks meet in a fresh directory (DDP_TEST_SHARED_DIR), removed
# at the end. Filter the program's tests to those of WORLD ranks
# (--gtest_filter); a test of another world fails, saying so.
# Exit status: mpirun's (non-zero when any rank failed).
set -u
if [ $# -lt 2 ]; then
  echo "usage: mpirun_ranks.sh WORLD PROGRAM [ARGS...]" >&2
  exit 2
fi
world=$1
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/ddp-mpirun-ranks.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
# Root may run it (CI does); no binding: every rank has two busy threads.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np "$world" --bind-to none --oversubscribe --tag-output -x DDP_TEST_SHARED_DIR="$dir" "$@"
