#!/usr/bin/env bash
# tools/setup.sh [PRESET] [--no-build] — everything a fresh Debian 12
# machine needs, as root: installs the Debian packages ddp builds against
# (only those missing), configures PRESET (default `release`; `sanitize`:
# Clang with ASan, UBSan and the libFuzzer targets, in build-sanitize/) and
# builds (not with --no-build: `cmake --build --preset PRESET` then does).
# Safe to run again: it then only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
build=1
if [ "${2:-}" = --no-build ]; then build=0; elif [ -n "${2:-}" ]; then
  echo "setup: unknown argument '$2' (--no-build)" >&2; exit 2
fi
case "$preset" in
  release | debug | sanitize) ;;
  *) echo "setup: unknown preset '$preset' (release, debug or sanitize)" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake pkg-config
  libgloo-dev libhiredis-dev libibverbs-dev   # Gloo (CPU collectives over TCP) and what its headers include
  libtomlplusplus-dev                         # TOML++ (config)
  libboost-dev libboost-filesystem-dev        # Boost.DLL (plugin loading)
  libopenblas-dev                             # cblas_sgemm
  nlohmann-json3-dev libcli11-dev             # summary.json / safetensors headers; the command line
  libxxhash-dev python3-xxhash                # checkpoint checksums (XXH3), in C++ and tools/checkpoint_torch.py
  libgtest-dev libgmock-dev                   # tests
  binutils                                    # nm, for the one-exported-symbol test
  clang-format                                # tools/format_check.sh (.clang-format)
  python3-matplotlib                          # plots of tools/ddp_suite.py (Debian's python3: tomllib)
  python3-torch                               # PyTorch fixtures, tools/checkpoint_torch.py and its test
  redis-server                                # the Redis rendezvous store's test
  libopenmpi-dev openmpi-bin libpmix-dev      # the mpi transport (plugins/mpi), mpirun, PMIx (rendezvous.h)
  iproute2                                    # tools/netns_cluster.sh (the multihost test)
  slurmctld slurmd slurm-client munge         # srun, and the one-node cluster of the slurm test
)
if [ "$preset" = sanitize ]; then
  packages+=(clang libclang-rt-14-dev)        # ASan, UBSan and libFuzzer's runtimes
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "setup: run as root (or install: ${missing[*]})" >&2; exit 1; fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

dir=build
[ "$preset" = release ] || dir=build-$preset
[ -f "$dir/CMakeCache.txt" ] || cmake --preset "$preset"
[ "$build" = 0 ] || cmake --build --preset "$preset" -j "$(nproc)"
