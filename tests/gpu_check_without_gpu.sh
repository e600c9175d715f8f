#!/usr/bin/env bash
# tests/gpu_check_without_gpu.sh ROOT — `tools/gpu_check.sh run` on a machine without a GPU
# says so in one line and exits 2, before it looks for .gpu/. Exit 77 (skipped) where
# nvidia-smi lists a GPU.
set -u
root=${1:?usage: gpu_check_without_gpu.sh ROOT}
if (nvidia-smi -L 2>/dev/null || true) | grep -q "^GPU"; then
  echo "a GPU is here: gpu_check.sh run would run"
  exit 77
fi
out=$(mktemp -d)
err=$(cd "$root" && tools/gpu_check.sh run --out "$out/gc" 2>&1 >/dev/null)
rc=$?
rm -rf "$out"
want="gpu_check: error: no GPU on this machine (nvidia-smi lists none): 'run' checks the GPU path where there is one; 'pack' is what runs here"
if [ $rc -ne 2 ] || [ "$err" != "$want" ]; then
  echo "expected exit 2 and one line:"
  echo "  $want"
  echo "got exit $rc and:"
  echo "$err"
  exit 1
fi
echo "ok: exit 2, one line"
