#!/usr/bin/env bash
# tools/build_example.sh — builds strategies/example (or another plugin
# folder: the kit's C plugins in tests/kit) the way a third party builds a
# plugin: installs the ddp build into a fresh prefix, copies the folder out
# of the source tree and configures and builds it there against that
# prefix alone (find_package(ddp)). Checks that the plugin exports exactly
# ddp_strategy_v1 and prints the path of the built .so on stdout
# (everything else goes to stderr). Optionally trains configs/toy.toml
# with it, loaded by path, with the installed `ddp`, and runs the
# conformance suite on it.
#
# usage: tools/build_example.sh [--build DIR] [--work DIR] [--source DIR] [--smoke WORLD_SIZE]...
#                               [--headers DIR] [--plan planned|unplanned] [--conformance]
#   --build DIR      the ddp build to install (default: build); must be built
#   --work DIR       where prefix/, src/, example-build/ and runs/ go
#                    (default: a new temporary directory); those are replaced
#   --source DIR     the plugin folder to build (default: strategies/example);
#                    the folder's name is the plugin's: libddp_strategy_<name>.so
#   --smoke N        run configs/toy.toml on N ranks with the example; checks
#                    that it succeeds, the loss decreases and each step is
#                    one collective (repeatable: --smoke 2 --smoke 4)
#   --headers DIR    build against DIR/ddp's headers instead of the installed
#                    ones, as if an older release had installed them
#                    (tests/abi_1_3: the ABI 1.3 headers as released)
#   --plan WHAT      `ddp plan configs/mlp.toml` with the example, loaded by
#                    path: "planned" checks that its plan entry planned one
#                    all-reduce a step and no plugin went unplanned (built
#                    against ABI 1.4 or newer); "unplanned" that the plan
#                    names it as not planned (built against older headers)
#   --conformance    run the installed bin/ddp-conformance --strategy <the .so>
# e.g. tools/build_example.sh --smoke 2 --smoke 4
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

say() { echo "build_example: $*" >&2; }
die() { say "error: $*"; exit 1; }

build=build work="" conformance=0 worlds=() headers="" plan="" source=strategies/example
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --work) work=${2:?--work needs a directory}; shift 2 ;;
    --source) source=${2:?--source needs a directory}; shift 2 ;;
    --smoke) worlds+=("${2:?--smoke needs a world size}"); shift 2 ;;
    --conformance) conformance=1; shift ;;
    --headers) headers=${2:?--headers needs a directory}; shift 2 ;;
    --plan) plan=${2:?--plan needs planned or unplanned}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[ -f "$build/CMakeCache.txt" ] || die "'$build' is not a configured ddp build (run tools/setup.sh first)"
build=$(cd "$build" && pwd)
[ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-example.XXXXXX")
mkdir -p "$work"
work=$(cd "$work" && pwd)
prefix=$work/prefix src=$work/src exbuild=$work/example-build
rm -rf "$prefix" "$src" "$exbuild" "$work/runs"

# 1. Install: bin/ddp, lib/ddp/*.so, include/ddp/plugin.h(pp), lib/cmake/ddp.
say "installing $build into $prefix"
cmake --install "$build" --prefix "$prefix" >&2
if [ -n "$headers" ]; then
  [ -f "$headers/ddp/plugin.h" ] || die "'$headers' has no ddp/plugin.h"
  say "replacing the installed headers by those of $headers"
  rm -rf "$prefix/include/ddp"
  cp -r "$headers/ddp" "$prefix/include/ddp"
fi

# 1b. The strategy kit installed (but where older headers replace the
#     installed ones): every header of include/ddp/strategy compiles alone
#     against the prefix, as a C++17 plugin includes it, and the package
#     exports it as ddp::strategy_common.
if [ -z "$headers" ]; then
  kit=("$prefix"/include/ddp/strategy/*.h)
  [ -f "${kit[0]}" ] || die "no strategy kit headers in $prefix/include/ddp/strategy"
  for h in "${kit[@]}"; do
    "${CXX:-c++}" -std=c++17 -fsyntax-only -I "$prefix/include" -x c++ - <<< "#include <ddp/strategy/$(basename "$h")>" \
      || die "the installed kit header $h does not compile alone"
  done
  grep -q "ddp::strategy_common" "$prefix/lib/cmake/ddp/ddpTargets.cmake" || die "the package exports no ddp::strategy_common"
fi
[ -x "$prefix/bin/ddp-mpirun-ranks" ] || die "bin/ddp-mpirun-ranks was not installed"

# 2. Configure and build the folder outside the tree, from a copy, so that
#    nothing but the installed package can be what it builds against.
case "$source" in /*) ;; *) source=$root/$source ;; esac
[ -f "$source/CMakeLists.txt" ] || die "'$source' is no plugin folder (no CMakeLists.txt)"
name=$(basename "$source")
cp -r "$source" "$src"
say "building $src in $exbuild against $prefix"
cmake -S "$src" -B "$exbuild" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >&2
cmake --build "$exbuild" -j 2 >&2
so=$exbuild/libddp_strategy_$name.so
[ -f "$so" ] || die "$so was not built"

# 3. Exactly one exported symbol: the entry descriptor.
exported=$(nm -D --defined-only "$so" | awk '{print $NF}')
[ "$exported" = "ddp_strategy_v1" ] || die "$so exports '$(echo $exported)', not exactly ddp_strategy_v1"
say "built $so (exports only ddp_strategy_v1)"
echo "$so"

# 4. Smoke runs: loaded by path from the TOML file, with the installed ddp.
for n in "${worlds[@]}"; do
  out=$work/runs/toy-world$n
  say "ddp run configs/toy.toml --set strategy.plugin=$so --set run.world_size=$n"
  log=$("$prefix/bin/ddp" run configs/toy.toml --set "strategy.plugin=$so" --set "run.world_size=$n" \
        --set "run.output_dir=$out" 2>&1) || { echo "$log" >&2; die "the run on $n ranks failed"; }
  echo "$log" >&2
  [ -f "$out/summary.json" ] || die "no $out/summary.json"
  grep -q "\"strategy\": \"$name\"" "$out/summary.json" || die "$out/summary.json is not from strategy $name"
  # Progress lines: "step 1/5  loss 1.049348  ...  (1 collectives, 0.003 MB)".
  echo "$log" | awk -v n="$n" '
    /^step [0-9]+\/[0-9]+ +loss / {
      steps++; loss = $4; if (steps == 1) first = loss
      if (!match($0, /\(([0-9]+) collectives/)) bad = bad " no collective count in: " $0
      else { c = substr($0, RSTART + 1, RLENGTH - 1) + 0; if (c != 1) bad = bad " step " steps ": " c " collectives;" }
    }
    END {
      if (steps == 0) { print "no progress lines"; exit 1 }
      if (!(loss < first)) { print "loss did not decrease: " first " -> " loss; exit 1 }
      if (bad != "") { print "expected one collective per step:" bad; exit 1 }
      printf "build_example: world %d: %d steps, loss %s -> %s, one collective each\n", n, steps, first, loss
    }' >&2 || die "the run on $n ranks is wrong (see above)"
done

# 5. `ddp plan` asks the plugin for its part, or names it as unplanned.
if [ -n "$plan" ]; then
  say "ddp plan configs/mlp.toml --set strategy.plugin=$so"
  json=$("$prefix/bin/ddp" plan configs/mlp.toml --set "strategy.plugin=$so" --json) || die "ddp plan failed"
  echo "$json" | /usr/bin/python3 -c '
import json, sys
run = json.load(sys.stdin)["run"]
want = sys.argv[1]
if want == "planned":
    assert "unplanned" not in run, run.get("unplanned")
    assert run["collectives_per_step"] == 1, run["collectives"]
    assert [c["op"] for c in run["collectives"]] == ["all_reduce"], run["collectives"]
else:
    assert any("strategy plugin \x27example\x27 has no plan entry" in u for u in run.get("unplanned", [])), run
    assert run["collectives_per_step"] == 0, run["collectives"]
print("build_example: ddp plan: " + want, file=sys.stderr)' "$plan" || die "ddp plan did not plan the example as $plan"
fi

# 6. The conformance suite every strategy passes, as the installed tool.
if [ "$conformance" = 1 ]; then
  [ -x "$prefix/bin/ddp-conformance" ] || die "$prefix/bin/ddp-conformance was not installed"
  say "ddp-conformance --strategy $so"
  "$prefix/bin/ddp-conformance" --strategy "$so" >&2 || die "the conformance suite failed"
fi
