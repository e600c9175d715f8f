#!/usr/bin/env bash
# tools/gpu_check.sh — the GPU path checked on a machine with a GPU, in one go.
#
#   tools/gpu_check.sh pack [--build DIR]
#       Here, on any machine with the toolchain (no GPU needed): configures and
#       builds the GPU build (DIR, default build-gpu: Release, CUDA on, sm_90),
#       then packs its programs, plugins and the shared libraries a bare GPU
#       machine lacks (OpenBLAS, Gloo, Boost, libstdc++...: everything but
#       glibc and CUDA's own) into .gpu/ (ignored by git, under 64 MiB).
#   tools/gpu_check.sh run [--out DIR] [--only STAGES]
#       There, on the GPU machine, from the repository root with .gpu/ beside
#       it: unpacks, then runs the stages (--only: a comma list of them;
#       default all, in this order)
#         tests      the GPU tests: device (CUDA streams, events, memory),
#                    cuda_ops (update kernels bitwise against the CPU),
#                    cuda_kernels (every model kernel against the CPU), golden
#                    (lm-tiny and mlp on CUDA against PyTorch and the CPU),
#                    nccl transport, gloo on CUDA buffers, and the
#                    conformance protocol on device "cuda" with nccl and gloo
#                    for every shipped strategy;
#         sanitizer  compute-sanitizer memcheck over cuda_kernels_test and
#                    cuda_ops_test (out-of-bounds and misaligned accesses,
#                    CUDA API errors), where the machine has compute-sanitizer;
#         bench      ddp bench-comm --device cuda with nccl (world 1 per GPU
#                    present) and gloo (world 2 sharing a GPU), 1MB..1GB;
#         lm         configs/lm-gpu.toml (lm `small`) with each strategy,
#                    overlap again with transport.fail_streams = false (the
#                    cost of nccl's host function per collective), and the
#                    same model in PyTorch on the GPU (pytorch_ddp_bench.py);
#         precision  lm `small` (batch 8) and `large` (batch 32), world 1,
#                    `bucketed`, under [precision] compute fp32, bf16 and
#                    fp16, beside PyTorch's fp32 and its bf16 (autocast +
#                    scaled_dot_product_attention + fused AdamW) on the same
#                    GPU; a run that fails is listed with its exit status
#                    and its first line that says error; fp16's rows count
#                    the steps loss scaling skipped;
#       and writes DIR/gpu_check.md (the summary: GPUs, driver, the NCCL that
#       loads, test counts, skipped tests by reason, whether more than one
#       GPU was there to test on, tables),
#       DIR/tests.log, DIR/sanitizer.log, DIR/bench_{nccl,gloo}.json,
#       DIR/lm_gpu.csv and DIR/lm_gpu.log, DIR/precision.csv and
#       DIR/precision.log (what the device tool brings back). Exit status 1 when a test or run failed.
#
# With the device tool (a call runs at most 10 minutes; each stage's own caps
# add up to under 9, so give each stage a call of its own):
#   tools/gpu_check.sh pack      # here
#   run(command="bash tools/gpu_check.sh run --out $OUT --only tests", carry=[".gpu"], timeout_s=600)
#   ... the same with --only sanitizer, --only bench, --only lm and --only precision
# On a machine without a GPU, `run` says so in one line and exits 2.
# Shorter caps, to fit several stages into one call: GPU_CHECK_TESTS_CAP_S
# (the tests stage, default 540), GPU_CHECK_TEST_TIMEOUT_S (one test, 300),
# GPU_CHECK_JOBS (the tests run at once, default 8),
# GPU_CHECK_SANITIZER_CAP_S (each sanitized program, 270); GPU_CHECK_TESTS
# replaces the ctest regex (to rerun some tests), GPU_CHECK_TESTS_EXCLUDE
# leaves out those it matches (ctest -E). Calls into the same DIR add
# to one summary. Two calls may run at once into different DIRs (the tests
# beside the sanitizer): start the second once .gpu/unpacked exists, since
# the first call unpacks the archive and the second then leaves it be.
# (lm_gpu.csv gets a row per run as it ends, so a cut-off call still
# returns the finished rows.)
#
# Each stage appends to DIR/gpu_check.md as it ends, so a run stopped by a
# time limit still returns what it finished. The tests were compiled with
# this checkout's absolute paths (test data,
# plugin directories); `run` makes that path lead to the checkout there
# (a symbolic link) when it differs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { echo "gpu_check: $*" >&2; }
die() { say "error: $*"; exit 2; }

mode=${1:-}
[ -n "$mode" ] || die "usage: tools/gpu_check.sh pack [--build DIR] | run [--out DIR]"
shift
build=build-gpu out=runs/gpu_check only=tests,sanitizer,bench,lm,precision
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --only) only=${2:?--only needs stages}; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done

# ------------------------------------------------------------------ pack
if [ "$mode" = pack ]; then
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "pack needs nvcc (the CUDA toolkit)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDDP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build" -j"$(nproc)"
  rm -rf .gpu && mkdir -p .gpu/lib
  # Shared libraries the programs need, but not glibc's or CUDA's (the GPU
  # machine has its own driver, runtime, cuBLAS and NCCL).
  find "$build/bin" "$build/lib" -type f -perm -u+x -o -name '*.so*' -type f | while read -r f; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libcudart.so*|libcublas*|libnccl*|libnvidia*) ;;
      # The C++ runtime only where the machine's own is older (see run).
      libstdc++.so*|libgcc_s.so*) mkdir -p .gpu/lib/fallback && cp -L "$lib" .gpu/lib/fallback/ ;;
      *) cp -L "$lib" .gpu/lib/ ;;
    esac
  done
  # Compressed (OpenBLAS alone is 36 MB): the libraries travel in the archive.
  # xz -9's 64 MiB window spans several programs, each of which links the
  # same CUDA kernels (some 10 MB a program): 17 MiB where -6 makes 82.
  XZ_OPT='-9 -T1' tar -C "$root" -cJf .gpu/build.tar.xz "$build/bin" "$build/lib" "$build/tests" .gpu/lib
  rm -rf .gpu/lib
  printf 'root=%s\nbuild=%s\n' "$root" "$build" >.gpu/paths
  size=$(du -sm .gpu | cut -f1)
  [ "$size" -lt 60 ] || die ".gpu is ${size} MiB: over what the device tool carries"
  say "packed .gpu (${size} MiB): now run(command=\"bash tools/gpu_check.sh run --out \$OUT --only tests,sanitizer\", carry=[\".gpu\"]), then the same with --only bench,lm"
  exit 0
fi

[ "$mode" = run ] || die "unknown mode '$mode' (pack or run)"
gpu_list=$( (nvidia-smi -L 2>/dev/null || true) | grep "^GPU" || true)
if [ -z "$gpu_list" ]; then
  say "error: no GPU on this machine (nvidia-smi lists none): 'run' checks the GPU path where there is one; 'pack' is what runs here"
  exit 2
fi
gpus=$(echo "$gpu_list" | grep -c "^GPU")
for stage in ${only//,/ }; do
  case "$stage" in
    tests|sanitizer|bench|lm|precision) ;;
    *) die "unknown stage '$stage' in --only (tests, sanitizer, bench, lm, precision)" ;;
  esac
done
wanted() { [[ ",$only," == *",$1,"* ]]; }

# ------------------------------------------------------------------- run
[ -f .gpu/paths ] || die ".gpu/ is missing: run 'tools/gpu_check.sh pack' first and carry .gpu"
# shellcheck disable=SC1091
. .gpu/paths  # root= build= of the packing checkout
packed_root=$root
root=$PWD
if [ "$packed_root" != "$root" ]; then
  if [ ! -e "$packed_root" ]; then
    mkdir -p "$(dirname "$packed_root")"
    ln -s "$root" "$packed_root"
  fi
  [ "$(cd "$packed_root" && pwd -P)" = "$(pwd -P)" ] || die "$packed_root exists and is not this checkout"
fi
# Once per archive: a second call beside a running one (tests beside the
# sanitizer, say) must not rewrite the programs the first is running.
if [ ! .gpu/unpacked -nt .gpu/build.tar.xz ]; then
  tar -C "$root" -xJf .gpu/build.tar.xz
  touch .gpu/unpacked
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# CUDA's libraries where the machine has them: the toolkit, or the wheels of
# its Python (nvidia-*), or the loader's cache.
libdirs="$root/.gpu/lib"
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && !f {print $NF; f = 1}' || true)
  [ -n "$found" ] || found=$(find /usr/local/cuda*/ /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || echo /nonexistent)" \
                                -name "$name" 2>/dev/null | sed -n 1p || true)
  [ -n "$found" ] && libdirs="$libdirs:$(dirname "$found")" || say "warning: $name not found"
done
# GCC 12's C++ runtime (GLIBCXX_3.4.30) from the packing machine, only if
# this machine's is older: a newer one serves, and ours would need its glibc.
system_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && !f {print $NF; f = 1}' || true)
if [ -z "$system_cxx" ] || ! grep -aq GLIBCXX_3.4.30 "$system_cxx"; then
  libdirs="$libdirs:$root/.gpu/lib/fallback"
  say "using the packed libstdc++ (this machine's lacks GLIBCXX_3.4.30)"
fi
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$root/$build/bin"
missing=$(ldd "$bin/ddp" | grep "not found" || true)
[ -z "$missing" ] || say "warning: ddp misses libraries: $missing"

status=0
summary="$out/gpu_check.md"
# The NCCL the nccl plugin loads here, and its version (ncclGetVersion:
# major * 10000 + minor * 100 + patch since 2.9).
nccl_lib=$(ldd "$root/$build/lib/ddp/libddp_transport_nccl.so" 2>/dev/null | awk '/libnccl/ {print $3}' || true)
nccl_version=$(python3 -c 'import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100} ({v.value})")' "$nccl_lib" 2>&1 | tail -1 || true)
# A second call into the same DIR (one stage per call) appends to its summary.
[ -s "$summary" ] || {
  echo "# GPU check"
  echo
  echo '```'
  echo "$gpu_list"
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed -n 1p || echo unknown)"
  echo "NCCL: ${nccl_version:-unknown} from ${nccl_lib:-(not found)}"
  ldd --version 2>&1 | sed -n 1p || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo '```'
  if [ "$gpus" -lt 2 ]; then
    echo
    echo "**No multi-GPU coverage**: this machine has $gpus GPU; every test and run that needs two or"
    echo "more (nccl on 2 to 4 ranks, the cuda_nccl_* conformance above world 1) skipped (reasons below)."
  fi
} >"$summary"

# The tests that touch CUDA (ctest -R is case-sensitive: both spellings).
gpu_tests=${GPU_CHECK_TESTS:-'[Cc]uda|[Nn]ccl|Golden|MakeDevice|EventOnDeviceStreams|OnCuda'}

# 1. GPU tests, through ctest (compiled paths).
if wanted tests; then
  say "GPU tests"
  set +e
  # DDP_EXPECT_GPU: a test that finds no usable GPU fails here instead of
  # skipping (tests/gpu.h), so an unusable driver is no green run.
  junit=$(mktemp)
  (cd "$root/$build/tests" && DDP_EXPECT_GPU=1 timeout "${GPU_CHECK_TESTS_CAP_S:-540}" ctest -j"${GPU_CHECK_JOBS:-8}" \
     --timeout "${GPU_CHECK_TEST_TIMEOUT_S:-300}" --output-on-failure \
     --output-junit "$junit" -R "$gpu_tests" ${GPU_CHECK_TESTS_EXCLUDE:+-E "$GPU_CHECK_TESTS_EXCLUDE"}) >"$out/tests.log" 2>&1
  rc=$?
  set -e
  [ $rc -eq 0 ] || status=1
  {
    echo
    echo "## GPU tests (ctest -R '$gpu_tests'${GPU_CHECK_TESTS_EXCLUDE:+ -E '$GPU_CHECK_TESTS_EXCLUDE'}; exit $rc)"
    echo
    echo '```'
    grep -E "tests passed|tests failed|Total Test time" "$out/tests.log" || echo "ctest printed no result (see tests.log)"
    grep -E "\*\*\*Failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess aborted\)" "$out/tests.log" | head -40 || true
    echo '```'
    echo
    echo "Skipped, by reason:"
    echo
    echo '```'
    python3 tools/skip_reasons.py "$junit" 2>&1 || echo "skipped: $(grep -c '(Skipped)' "$out/tests.log" || true)"
    echo '```'
  } >>"$summary"
  rm -f "$junit"
fi

# 2. compute-sanitizer (memcheck) over the kernel tests.
if wanted sanitizer; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | sed -n 1p || true)
  {
    echo
    echo "## compute-sanitizer memcheck"
    echo
    echo '```'
  } >>"$summary"
  if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer not found: skipped" >>"$summary"
  else
    say "compute-sanitizer"
    : >"$out/sanitizer.log"
    for t in cuda_kernels_test cuda_ops_test; do
      set +e
      DDP_EXPECT_GPU=1 DDP_GPUS_IN_PROCESS=1 timeout "${GPU_CHECK_SANITIZER_CAP_S:-270}" "$sanitizer" --tool memcheck --error-exitcode 3 "$bin/$t" \
        >"$out/sanitizer.part" 2>&1
      rc=$?
      set -e
      cat "$out/sanitizer.part" >>"$out/sanitizer.log"
      # A GPU or driver compute-sanitizer does not support is a skip, not a failure.
      unsupported=$(grep -iE "not supported|unsupported" "$out/sanitizer.part" | sed -n 1p || true)
      if [ $rc -ne 0 ] && [ -n "$unsupported" ]; then
        echo "$t: skipped: compute-sanitizer cannot run here ($unsupported)" >>"$summary"
      else
        [ $rc -eq 0 ] || status=1
        echo "$t: exit $rc, $(grep -cE '^========= (Invalid|Program hit|Error)' "$out/sanitizer.log" || true) reports so far" >>"$summary"
      fi
    done
    rm -f "$out/sanitizer.part"
    grep -E "ERROR SUMMARY" "$out/sanitizer.log" >>"$summary" || true
  fi
  echo '```' >>"$summary"
fi

# 3. Collectives on GPU buffers.
if wanted bench; then
  say "bench-comm"
  tmp=$(mktemp -d)
  set +e
  timeout 240 "$bin/ddp" bench-comm --device cuda --transport nccl --world "$gpus" --sizes 1MB,10MB,100MB,1GB \
    --out "$tmp/nccl" >"$tmp/nccl.md" 2>>"$out/tests.log" || status=1
  timeout 240 "$bin/ddp" bench-comm --device cuda --transport gloo --world 2 --sizes 1MB,10MB,100MB \
    --ops all_reduce --out "$tmp/gloo" >"$tmp/gloo.md" 2>>"$out/tests.log" || status=1
  set -e
  {
    echo
    echo "## bench-comm --device cuda"
    echo
    for part in nccl gloo; do
      [ -f "$tmp/$part/bench_comm.json" ] && cp "$tmp/$part/bench_comm.json" "$out/bench_$part.json"
      if [ -s "$tmp/$part.md" ]; then cat "$tmp/$part.md"; else echo "($part: failed, see tests.log)"; fi
    done
  } >>"$summary"
  rm -rf "$tmp"
fi

# 4. lm `small` with every strategy, world 1 (nccl).
if wanted lm; then
  say "lm small"
  echo "strategy,mean_step_s,tokens_per_s,comm_blocked_s,collectives_per_step,peak_total_bytes,final_loss,status" >"$out/lm_gpu.csv"
  # (Each run's output, weights.safetensors included, outside DIR: a call
  # cut off returns DIR, which must stay small.)
  runs=$(mktemp -d)
  : >"$out/lm_gpu.log"
  # The last run repeats overlap (one collective per parameter) without the
  # nccl plugin's host function after each collective: the difference in
  # step time is that host function's cost, times the collectives.
  for variant in naive flat overlap bucketed sharded overlap+no_fail_streams; do
    strategy=${variant%%+*}
    extra=()
    [ "$variant" = "$strategy" ] || extra=(--set transport.fail_streams=false)
    dir="$runs/$variant"
    set +e
    (cd "$root" && timeout 75 "$bin/ddp" run configs/lm-gpu.toml --set "strategy.plugin=\"$strategy\"" \
       --set "run.output_dir=\"$dir\"" ${extra[@]+"${extra[@]}"}) >"$out/lm_gpu.part" 2>&1
    rc=$?
    { echo "== $variant (exit $rc)"; cat "$out/lm_gpu.part"; } >>"$out/lm_gpu.log"
    rm -f "$out/lm_gpu.part"
    set -e
    if [ $rc -ne 0 ]; then
      status=1
      echo "$variant,,,,,,,failed (exit $rc)" >>"$out/lm_gpu.csv"
      continue
    fi
    python3 - "$dir/summary.json" "$variant" >>"$out/lm_gpu.csv" <<'EOF' || { status=1; echo "$variant,,,,,,,summary.json unreadable" >>"$out/lm_gpu.csv"; }
import json, sys
s = json.load(open(sys.argv[1]))
steps = s["step_time_s"][3:] or s["step_time_s"]
mean = sum(steps) / len(steps)
blocked = s["comm_blocked_s"][3:] or s["comm_blocked_s"]
print(f'{sys.argv[2]},{mean:.5f},{s.get("tokens_per_s", 0):.0f},{sum(blocked) / len(blocked):.5f},'
      f'{s["collectives"][-1]},{s["peak_bytes"]["before_optimizer_step"]["total"]},{s["loss"][-1]:.4f},ok')
EOF
    rm -rf "$dir"
  done
  # The same model and steps in PyTorch on this GPU (float32, TF32 off), where
  # the machine's python3 has torch.
  set +e
  timeout 90 python3 tools/pytorch_ddp_bench.py --device cuda --world 1 --preset small --batch 8 \
    --warmup 3 --steps 17 >"$out/lm_gpu.part" 2>>"$out/lm_gpu.log"
  rc=$?
  set -e
  if [ $rc -eq 0 ]; then
    python3 - "$out/lm_gpu.part" >>"$out/lm_gpu.csv" <<'EOF' || { status=1; echo "pytorch-single,,,,,,,output unreadable" >>"$out/lm_gpu.csv"; }
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f'pytorch-single (torch {r["torch"]}),{r["step_s_mean"]:.5f},{8 * 256 / r["step_s_mean"]:.0f},,,,{r["final_loss"]:.4f},ok')
EOF
  elif tail -1 "$out/lm_gpu.log" | grep -q "No module named 'torch'"; then
    echo "pytorch-single,,,,,,,skipped (no torch)" >>"$out/lm_gpu.csv"
  else
    status=1
    echo "pytorch-single,,,,,,,failed (exit $rc)" >>"$out/lm_gpu.csv"
  fi
  rm -f "$out/lm_gpu.part"
  {
    echo
    echo "## lm small (configs/lm-gpu.toml), world 1, step time without the first 3 steps"
    echo
    echo '```'
    cat "$out/lm_gpu.csv"
    echo '```'
  } >>"$summary"
  rm -rf "$runs"
fi
# 5. [precision]: lm small (batch 8) and large (batch 32), world 1, ddp under
# each compute beside PyTorch fp32 and bf16 (its fast path) on this GPU.
# The stage's runs share one cap (GPU_CHECK_PRECISION_CAP_S, default 520):
# a run gets at most 150 s of what is left, and a row whose turn comes with
# under 20 s left is written "skipped (stage cap)".
if wanted precision; then
  say "precision"
  csv="$out/precision.csv" log="$out/precision.log"
  echo "model,batch,run,mean_step_s,mean_forward_s,mean_backward_s,mean_optimizer_s,final_loss,skipped_steps,activations_gb,peak_gb,status" >"$csv"
  : >"$log"
  runs=$(mktemp -d)
  deadline=$((SECONDS + ${GPU_CHECK_PRECISION_CAP_S:-520}))
  # The seconds the next run may take (0: the stage's cap is spent).
  run_cap() {
    local left=$((deadline - SECONDS))
    if [ $left -lt 20 ]; then echo 0; elif [ $left -lt 150 ]; then echo $left; else echo 150; fi
  }
  # A failed run's row: its exit status and the first line that says error;
  # a run the stage's cap stopped (given less than the 150 s a run may
  # take) says so instead, so that it does not read as a hang.
  failed_row() {
    local why
    if [ "$2" -eq 124 ] && [ "$3" -lt 150 ]; then
      echo "$1,,,,,,,,,cut (the stage's cap left it $3 s)" >>"$csv"
      return
    fi
    why=$(grep -m1 -i "error" "$out/precision.part" 2>/dev/null | tr ',' ';' | cut -c1-160 || true)
    echo "$1,,,,,,,,,failed (exit $2${why:+: $why})" >>"$csv"
  }
  for spec in small:8:20 large:32:12; do
    IFS=: read -r preset batch steps <<<"$spec"
    for compute in fp32 bf16 fp16; do
      dir="$runs/$preset-$compute"
      cap=$(run_cap)
      if [ "$cap" -eq 0 ]; then
        echo "$preset,$batch,ddp $compute,,,,,,,,,skipped (stage cap)" >>"$csv"
        continue
      fi
      set +e
      (cd "$root" && timeout "$cap" "$bin/ddp" run configs/lm-gpu.toml --set "model.preset=\"$preset\"" \
         --set "data.batch_size=$batch" --set "run.steps=$steps" --set "precision.compute=\"$compute\"" \
         --set "run.output_dir=\"$dir\"") >"$out/precision.part" 2>&1
      rc=$?
      set -e
      { echo "== ddp $preset $compute (exit $rc, cap ${cap}s)"; cat "$out/precision.part"; } >>"$log"
      if [ $rc -ne 0 ]; then
        status=1
        failed_row "$preset,$batch,ddp $compute" $rc "$cap"
        rm -rf "$dir"
        continue
      fi
      python3 - "$dir/summary.json" "$preset,$batch,ddp $compute" >>"$csv" <<'EOF' || { status=1; echo "$preset,$batch,ddp $compute,,,,,,,,,summary.json unreadable" >>"$csv"; }
import json, sys
s = json.load(open(sys.argv[1]))
steps = s["step_time_s"][3:] or s["step_time_s"]
forward = s["forward_s"][3:] or s["forward_s"]  # (ends with the loss on the host: GPU time)
backward = s["backward_s"][3:] or s["backward_s"]  # (ends with the compute stream synchronised)
optimizer = s["optimizer_s"][3:] or s["optimizer_s"]
mean = lambda xs: sum(xs) / len(xs)
peak = s["ranks"][0]["peak_bytes"]  # rank 0's peak per category over the run
loss = s["loss"][-1]  # (null where not finite)
skipped = sum(1 for k in s.get("step_skipped", []) if k)
print(f'{sys.argv[2]},{mean(steps):.5f},{mean(forward):.5f},{mean(backward):.5f},{mean(optimizer):.5f},'
      f'{"nan" if loss is None else f"{loss:.4f}"},{skipped},{peak["activations"] / 1e9:.2f},'
      f'{sum(peak.values()) / 1e9:.2f},ok')
EOF
      rm -rf "$dir"
    done
    for precision in fp32 bf16; do
      cap=$(run_cap)
      if [ "$cap" -eq 0 ]; then
        echo "$preset,$batch,pytorch $precision,,,,,,,,,skipped (stage cap)" >>"$csv"
        continue
      fi
      set +e
      timeout "$cap" python3 tools/pytorch_ddp_bench.py --device cuda --world 1 --preset "$preset" --batch "$batch" \
        --warmup 3 --steps $((steps - 3)) --precision "$precision" >"$out/precision.part" 2>>"$log"
      rc=$?
      set -e
      if [ $rc -eq 0 ]; then
        python3 - "$out/precision.part" "$preset,$batch" >>"$csv" <<'EOF' || { status=1; echo "$preset,$batch,pytorch,,,,,,,,,output unreadable" >>"$csv"; }
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
fast = " + sdpa" * r["sdpa"] + " + fused adamw" * ("fused" in r["optimizer"])
peak = f'{r["peak_bytes"] / 1e9:.2f}' if r.get("peak_bytes") else ""
print(f'{sys.argv[2]},pytorch {r["torch"]} {r["precision"]}{fast},{r["step_s_mean"]:.5f},,,,{r["final_loss"]:.4f},,,'
      f'{peak},ok')
EOF
      elif tail -1 "$log" | grep -q "No module named 'torch'"; then
        echo "$preset,$batch,pytorch $precision,,,,,,,,,skipped (no torch)" >>"$csv"
      else
        status=1
        failed_row "$preset,$batch,pytorch $precision" $rc "$cap"
      fi
    done
  done
  rm -f "$out/precision.part"
  rm -rf "$runs"
  {
    echo
    echo "## [precision]: lm small (batch 8) and large (batch 32), world 1, bucketed; step time without the first 3 steps"
    echo
    echo '```'
    cat "$csv"
    echo '```'
    echo
    echo "peak_gb: ddp's is rank 0's peak per memory category over the run, added (its own tracker: not"
    echo "cuBLAS's workspace nor the 16-bit GEMM operand buffers); PyTorch's is torch.cuda.max_memory_allocated()."
    echo "skipped_steps: fp16's loss scaling skips the steps whose gradients overflow (cheap steps, in the mean)."
  } >>"$summary"
fi
cat "$summary"
exit $status
