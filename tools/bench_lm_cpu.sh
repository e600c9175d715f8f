#!/usr/bin/env bash
# tools/bench_lm_cpu.sh — the lm-cpu benchmark: our engine against PyTorch 1.13's own DDP on
# the same work, in one invocation.
#
# Work: model `lm`, preset lm-cpu (vocab 10000, context 128, d_model 256, d_ff 1024, 4 layers,
# 4 heads; about 9.3 M parameters), batch 8 rows per rank, random tokens, AdamW(lr 1e-3,
# weight_decay 0.01), 1 compute thread per rank, W warm-up steps then S timed steps.
# Implementations, run alternately (each round runs all of them once, the order rotated by
# one each round) so that they share the machine's noise fairly:
#   pytorch-single   tools/pytorch_ddp_bench.py --world 1 (one process, no DDP)
#   pytorch-ddp      tools/pytorch_ddp_bench.py --world 2 (DistributedDataParallel, gloo,
#                    its defaults: bucket_cap_mb 25)
#   ddp-<strategy>   build/bin/ddp run on a config written to a temporary directory:
#                    [run] world_size 2, steps W+S, log_every S, threads 1; [model] lm,
#                    preset lm-cpu; [data] random, batch_size 16 (8 per rank); [optimizer]
#                    adamw lr 1e-3 weight_decay 0.01; [strategy] plugin <strategy>.
#                    From its summary.json (rank 0's): step_time_s without the first W
#                    steps, and comm_blocked_s over the same steps.
# Step times are pooled over the rounds (R x S per implementation): mean and median.
# "comm blocked %" is sum(comm_blocked_s) / sum(step_time_s) over the timed steps (ours only;
# PyTorch does not report it). "ratio" is mean step time / PyTorch DDP's mean step time.
# The issue's target for ddp-bucketed: ratio <= 0.6 and comm blocked <= 3 %.
#
# Prints a Markdown table on stdout (progress on stderr) and writes the same as JSON to --out.
#
# usage: tools/bench_lm_cpu.sh [--steps S] [--warmup W] [--rounds R]
#                              [--strategies "bucketed overlap ..."] [--out FILE]
#                              [--ddp BIN] [--ddp-b BIN] [--python PY] [--keep]
#   --steps S        timed steps per run (default 20)
#   --warmup W       untimed steps first (default 3)
#   --rounds R       rounds of alternation (default 3)
#   --strategies L   our strategies, space-separated (default "bucketed"); each one is a
#                    plugin name, optionally with strategy keys: "bucketed:bucket_mb=25",
#                    "sharded:variant=allgather" (key=value, comma-separated; numbers
#                    and true/false as TOML values, anything else a string)
#   --out FILE       results JSON (default runs/bench_lm_cpu/results.json, in the repo)
#   --ddp BIN        our launcher (default build/bin/ddp; build it with tools/setup.sh)
#   --ddp-b BIN      a second launcher (e.g. an older build): each strategy runs with it too,
#                    as ddp-<strategy>@b, alternated with the rest in every round
#   --python PY      Python with torch 1.13 (default /usr/bin/python3, Debian's python3-torch)
#   --keep           keep the temporary directory (configs, logs, summary.json files)
# Exit status: 0 when every run succeeded; 1 when any failed (the table marks it).
# e.g. tools/bench_lm_cpu.sh --strategies "bucketed overlap flat" --rounds 2
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
root=$PWD

say() { echo "bench_lm_cpu: $*" >&2; }
die() { say "error: $*"; exit 2; }
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }

steps=20 warmup=3 rounds=3 strategies="bucketed" out="$root/runs/bench_lm_cpu/results.json"
ddp="$root/build/bin/ddp" ddp_b="" python=/usr/bin/python3 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --warmup) warmup=${2:?--warmup needs a number}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --strategies) strategies=${2?--strategies needs a list}; shift 2 ;;
    --out) out=$(abspath "${2:?--out needs a file}"); shift 2 ;;
    --ddp) ddp=$(abspath "${2:?--ddp needs a file}"); shift 2 ;;
    --ddp-b) ddp_b=$(abspath "${2:?--ddp-b needs a file}"); shift 2 ;;
    --python) python=${2:?--python needs a program}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for v in steps rounds; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer (got '${!v}')"; done
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer (got '$warmup')"
read -r -a strategy_list <<< "$strategies"
[ -x "$ddp" ] || [ ${#strategy_list[@]} -eq 0 ] || die "'$ddp' not found (build it: tools/setup.sh)"
[ -z "$ddp_b" ] || [ -x "$ddp_b" ] || die "--ddp-b: '$ddp_b' not found"
"$python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
  die "'$python' has no torch with gloo (Debian: apt-get install python3-torch)"

world=2 batch=8 preset=lm-cpu
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_lm_cpu.XXXXXX")
if [ "$keep" = 1 ]; then say "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
mkdir -p "$tmp/results"

# impls: pytorch-single pytorch-ddp ddp-<label>... [ddp-<label>@b...]; spec[<impl>] is the
# strategy spec, bin[<impl>] the launcher.
impls=(pytorch-single pytorch-ddp)
declare -A spec bin failed
nfailed=0
for s in "${strategy_list[@]}"; do
  label="ddp-${s//[^A-Za-z0-9_.=-]/_}"
  impls+=("$label"); spec[$label]=$s; bin[$label]=$ddp
  if [ -n "$ddp_b" ]; then impls+=("$label@b"); spec[$label@b]=$s; bin[$label@b]=$ddp_b; fi
done

write_config() {  # write_config SPEC DIR OUTPUT_DIR: DIR/config.toml
  "$python" - "$1" "$2/config.toml" "$3" "$warmup" "$steps" "$batch" "$world" "$preset" <<'EOF'
import re, sys
spec, path, out_dir, warmup, steps, batch, world, preset = sys.argv[1:]
name, _, rest = spec.partition(":")
def value(v):
    if re.fullmatch(r"[+-]?\d+", v) or v in ("true", "false"):
        return v
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", v):
        return v if any(c in v for c in ".eE") else v + ".0"
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
keys = []
for kv in filter(None, rest.split(",")):
    k, eq, v = kv.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
        sys.exit(f"bad strategy key '{kv}' in '{spec}' (expected key=value)")
    keys.append(f"{k} = {value(v)}")
steps_total = int(warmup) + int(steps)
with open(path, "w") as f:
    f.write(f"""# written by tools/bench_lm_cpu.sh
[run]
world_size = {world}
steps = {steps_total}
log_every = {steps}
threads = 1
seed = 0
timeout_s = 300.0
output_dir = "{out_dir}"

[model]
name = "lm"
preset = "{preset}"

[data]
kind = "random"
batch_size = {int(batch) * int(world)}

[optimizer]
name = "adamw"
lr = 1e-3
weight_decay = 0.01

[transport]
plugin = "gloo"

[strategy]
plugin = "{name}"
""" + "".join(k + "\n" for k in keys))
EOF
}

extract_summary() {  # extract_summary SUMMARY_JSON SPEC RESULT_JSON
  "$python" - "$@" "$warmup" "$steps" "$world" "$batch" <<'EOF'
import json, sys
summary_path, spec, result_path, warmup, steps, world, batch = sys.argv[1:]
warmup, steps = int(warmup), int(steps)
s = json.load(open(summary_path))
t, b = s["step_time_s"], s["comm_blocked_s"]
if len(t) != warmup + steps or len(b) != len(t):
    sys.exit(f"{summary_path}: {len(t)} step times, expected {warmup + steps}")
json.dump({"impl": "ddp", "strategy": spec, "plugin": s.get("strategy"), "world": s["world_size"],
           "batch_per_rank": int(batch), "step_s": t[warmup:], "comm_blocked_s": b[warmup:],
           "loss_first": s["loss"][0], "loss_last": s["loss"][-1]}, open(result_path, "w"))
EOF
}

run_one() {  # run_one IMPL ROUND: writes $tmp/results/IMPL.ROUND.json, or returns non-zero
  local impl=$1 r=$2 res="$tmp/results/$1.$2.json" log="$tmp/$1.$2.log"
  case "$impl" in
    pytorch-single | pytorch-ddp)
      local w=$world; [ "$impl" = pytorch-single ] && w=1
      if "$python" tools/pytorch_ddp_bench.py --preset "$preset" --world "$w" --batch "$batch" \
           --steps "$steps" --warmup "$warmup" --threads 1 > "$res.tmp" 2> "$log"; then
        tail -n 1 "$res.tmp" > "$res"
      else
        say "$impl failed (round $((r + 1))):"; tail -n 20 "$log" >&2; return 1
      fi ;;
    *)
      local dir="$tmp/$impl"
      mkdir -p "$dir"
      write_config "${spec[$impl]}" "$dir" "$dir/r$r" || return 1
      if "${bin[$impl]}" run "$dir/config.toml" > "$log" 2>&1 && extract_summary "$dir/r$r/summary.json" "${spec[$impl]}" "$res"; then
        :
      else
        say "$impl failed (round $((r + 1))):"; tail -n 20 "$log" >&2; return 1
      fi ;;
  esac
}

n=${#impls[@]}
say "lm-cpu, batch $batch per rank, world $world, $warmup warm-up + $steps timed steps, $rounds round(s): ${impls[*]}"
for ((r = 0; r < rounds; ++r)); do
  for ((i = 0; i < n; ++i)); do
    impl=${impls[$(((i + r) % n))]}
    [ -n "${failed[$impl]:-}" ] && continue
    say "round $((r + 1))/$rounds: $impl"
    run_one "$impl" "$r" || { failed[$impl]=1; nfailed=$((nfailed + 1)); }
  done
done

mkdir -p "$(dirname "$out")"
failed_list=""
for impl in "${impls[@]}"; do [ -z "${failed[$impl]:-}" ] || failed_list+="$impl "; done
"$python" - "$tmp/results" "$out" "$rounds" "$warmup" "$steps" "$world" "$batch" "$preset" "$failed_list" "${impls[@]}" <<'EOF'
import datetime, json, os, statistics, sys
rdir, out, rounds, warmup, steps, world, batch, preset, failed = sys.argv[1:10]
impls = sys.argv[10:]
failed = set(failed.split())
rows = []
for impl in impls:
    paths = [os.path.join(rdir, f"{impl}.{r}.json") for r in range(int(rounds))]
    runs = [json.load(open(p)) for p in paths if os.path.exists(p)]
    row = {"impl": impl, "world": 1 if impl == "pytorch-single" else int(world),
           "status": "failed" if impl in failed or not runs else "ok", "runs": len(runs)}
    if runs:
        t = [x for run in runs for x in run["step_s"]]
        row.update(step_s_mean=statistics.fmean(t), step_s_median=statistics.median(t),
                   round_means=[statistics.fmean(run["step_s"]) for run in runs])
        if impl.startswith("ddp-"):
            b = [x for run in runs for x in run["comm_blocked_s"]]
            row.update(strategy=runs[0]["strategy"], comm_blocked_frac=sum(b) / sum(t),
                       loss_first=runs[-1]["loss_first"], loss_last=runs[-1]["loss_last"])
        else:
            row.update(torch=runs[0].get("torch"), parameters=runs[0].get("parameters"))
    rows.append(row)
ref = next((r for r in rows if r["impl"] == "pytorch-ddp" and "step_s_mean" in r), None)
for r in rows:
    if ref and "step_s_mean" in r:
        r["ratio_to_pytorch_ddp"] = r["step_s_mean"] / ref["step_s_mean"]
        r["ratio_to_pytorch_ddp_median"] = r["step_s_median"] / ref["step_s_median"]
    if r["impl"].startswith("ddp-") and "ratio_to_pytorch_ddp" in r:
        r["meets_issue_target"] = r["ratio_to_pytorch_ddp"] <= 0.6 and r["comm_blocked_frac"] <= 0.03
result = {"benchmark": "lm_cpu", "model": "lm", "preset": preset, "world": int(world),
          "batch_per_rank": int(batch), "warmup": int(warmup), "steps": int(steps),
          "rounds": int(rounds), "threads_per_rank": 1, "optimizer": "adamw lr 1e-3 weight_decay 0.01",
          "cpus": os.cpu_count(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
          "target": "ddp-bucketed: ratio_to_pytorch_ddp <= 0.6 and comm_blocked_frac <= 0.03",
          "rows": rows}
with open(out + ".tmp", "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
os.replace(out + ".tmp", out)

def fmt(r, key, spec):
    return spec.format(r[key]) if key in r else "—"
print(f"lm-cpu (lm, {preset}), batch {batch} per rank, {warmup} warm-up + {steps} timed steps "
      f"x {rounds} round(s), 1 thread per rank, {os.cpu_count()} CPUs\n")
print("| impl | world | step s mean | step s median | comm blocked % | ratio to PyTorch DDP |")
print("|------|------:|------------:|--------------:|---------------:|---------------------:|")
for r in rows:
    if r["status"] != "ok":
        print(f"| {r['impl']} | {r['world']} | failed | failed | — | — |")
        continue
    comm = "{:.2f}".format(100 * r["comm_blocked_frac"]) if "comm_blocked_frac" in r else "—"
    print(f"| {r['impl']} | {r['world']} | {fmt(r, 'step_s_mean', '{:.4f}')} | "
          f"{fmt(r, 'step_s_median', '{:.4f}')} | {comm} | {fmt(r, 'ratio_to_pytorch_ddp', '{:.3f}')} |")
print(f"\nresults: {out}")
EOF
[ "$nfailed" -eq 0 ]
