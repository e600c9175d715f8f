#!/usr/bin/python3
"""tools/ddp_suite.py — the batch runner: runs every variant of a suite N times with `ddp run`
(or, for a `pytorch` variant, PyTorch's DDP on the same work), interleaved round by round, then
tables and plots the medians and 95 % intervals of their per-run figures.

usage: tools/ddp_suite.py SUITE.toml [--out DIR] [--ddp BIN] [--only NAME...] [--repeats N]
                          [--python PY] [--keep-weights]
  SUITE.toml      the suite (format below; configs/suites/ has the shipped ones)
  --out DIR       where results go (default runs/suites/<suite name>, in the repository)
  --ddp BIN       the launcher (default build/bin/ddp; build it with tools/setup.sh)
  --only NAME...  run only these variants (shell globs over names: 'strategies-lm/*')
  --repeats N     runs per variant, overriding every suite file's `repeats`
  --python PY     the Python that runs `pytorch` variants (default /usr/bin/python3: Debian's,
                  with python3-torch)
  --keep-weights  keep each run's weights.safetensors (removed by default)
Exit status: 0 when every run succeeded; 1 when any failed (its variant is marked failed,
naming the run; the error's last lines are printed); 2 for a bad suite or command line (the
message names the file and key).

Suite format (TOML):
  description = "..."        # optional: the heading of results.md
  base = "../mlp.toml"       # the ddp config the variants start from: relative to this
                             # file, else to the repository root
  warmup = 2                 # steps left out of every mean (default 2); run.steps must exceed it
  repeats = 3                # runs per variant (default 3), interleaved: round k runs every
                             # variant once (the order rotated by one each round)
  include = ["a.toml"]       # optional: run these suites' variants too, as they are, their
                             # names prefixed "<suite name>/"
  [set]                      # optional: overrides for every variant of this file
  run.steps = 6              #   section.key = TOML value, as `ddp run --set section.key=value`
  [[variant]]                # one per run (names: letters, digits, '_', '-', '.'; unique)
  name = "bucketed-1"
  base = "../lm-cpu.toml"    # optional: this variant's own base config
  strategy = "bucketed"      # short for set.strategy.plugin; likewise world_size
  world_size = 2             # (run.world_size), steps (run.steps), preset (model.preset)
  set.strategy.bucket_mb = 1 # any other section.key (wins over the file's [set]), or a
                             # plugin's own key: set.strategy.bucketed.bucket_mb = 1
  kind = "pytorch"           # optional: "ddp" (default) or "pytorch": PyTorch's DDP on the
                             # variant's model, batch, optimizer, steps and warm-up
                             # (tools/pytorch_ddp_bench.py); a config it cannot reproduce is
                             # refused by name
Run k of a variant runs `ddp run BASE --set section.key=value ... --set
run.output_dir=<out>/<name>/r<k>` from the repository root (paths given in `set` are relative
to it). Keep each plugin's keys in a table of its own in the base ([strategy.bucketed]
bucket_mb = 8): a variant that names another plugin then swaps cleanly.

Outputs in DIR: <name>/r<k>/ per run (ddp.log and summary.json, or pytorch.log and
pytorch.json), results.md (tables ready to paste), results.csv (per variant: median, low and
high of every figure, n), runs.csv (every run's figures), step_breakdown.png,
loss_vs_step.png, when variants differ only in strategy.bucket_mb, bucket_sweep.png and, when
runs evaluate held-out loss ([eval] every), val_loss_vs_bytes.png; each written to a temporary
name and renamed. Every figure is first the mean over a run's steps
after warm-up (loss: the last step's); across runs it is the median with the 95 % Student-t
interval of the mean (tools/suite_stats.py). Speed-ups pair run k with run k of the reference
(the `naive` or `pytorch` variant of the same suite file, model, data, optimizer and world):
median ratio, interval exp(t-interval of the log ratios). docs/batch-runs.md has every column.
e.g. tools/ddp_suite.py configs/suites/strategies-mlp.toml --only naive overlap --repeats 1
"""
import argparse
import copy
import fnmatch
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite_pytorch  # noqa: E402
import suite_report  # noqa: E402
from suite_stats import fmt_stat, ratio_stat, scaled, sig, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = suite_report.CATEGORIES
PHASES = suite_report.PHASES
SHORTHANDS = {"strategy": "strategy.plugin", "world_size": "run.world_size",
              "steps": "run.steps", "preset": "model.preset"}
PLUGIN_SECTIONS = ("strategy", "transport")
FILE_RELATIVE_KEYS = [("data", "path"), ("model", "init_from")]  # relative to the config file
VARIANT_OWN_KEYS = ("name", "base", "set", "kind")
KINDS = ("ddp", "pytorch")
SUITE_KEYS = {"description", "base", "warmup", "repeats", "include", "set", "variant"}
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
# Keys that do not change what a step computes: left out when deciding which runs compare.
RUN_ONLY_KEYS = {"steps", "log_every", "output_dir", "timeout_s"}
DEFAULT_REPEATS = 3


class SuiteError(Exception):
    """A bad suite file; the message names the file and the key."""


@dataclass
class Variant:
    name: str
    base: Path                  # the ddp config, absolute
    overrides: dict             # "section.key" (or "section.plugin.key") -> value (from TOML)
    warmup: int
    suite: str                  # the file that declares it: runs compare within their suite
    base_config: dict = field(default_factory=dict, repr=False)
    kind: str = "ddp"           # or "pytorch"
    repeats: int = DEFAULT_REPEATS

    def setting(self, key, default=None):
        """The effective value of section.key (or section.plugin.key): the override, else the
        base config's."""
        if key in self.overrides:
            return self.overrides[key]
        value = self.base_config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return value

    def config(self):
        """The config as ddp runs it: the base with the overrides applied, paths absolute."""
        return effective_config(self.base_config, self.base, self.overrides)


# ---------------------------------------------------------------- suite files

def toml_value(value, where="value"):
    """Python value (as tomllib returns it) -> TOML text for `ddp run --set`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, where) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)} = {toml_value(v, where)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise SuiteError(f"{where}: a {type(value).__name__} cannot be passed to ddp --set")


def flatten_overrides(table, where):
    """A `set` table, {section: {key: v}} or {"section.key": v} -> {"section.key": v}; in a
    plugin section also {section: {plugin: {key: v}}} -> {"section.plugin.key": v}. `where`
    names the file (and variant) in errors."""
    prefix = "set"
    if not isinstance(table, dict):
        raise SuiteError(f"{where}: key '{prefix}' must be a table of section.key = value")
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, dict) and k in PLUGIN_SECTIONS:
                    for k3, v3 in v2.items():
                        if isinstance(v3, dict):
                            raise SuiteError(f"{where}: key '{prefix}.{k}.{k2}.{k3}' is a table")
                        out[f"{k}.{k2}.{k3}"] = v3
                elif isinstance(v2, dict):
                    raise SuiteError(f"{where}: key '{prefix}.{k}.{k2}' is a table "
                                     "(keys are section.key, or section.plugin.key in "
                                     f"{' and '.join(PLUGIN_SECTIONS)})")
                else:
                    out[f"{k}.{k2}"] = v2
        elif all(k.split(".")) and (k.count(".") == 1 or
                                    (k.count(".") == 2 and k.split(".")[0] in PLUGIN_SECTIONS)):
            out[k] = v
        else:
            raise SuiteError(f"{where}: key '{prefix}.{k}': expected section.key = value")
    if "run.output_dir" in out:
        raise SuiteError(f"{where}: key '{prefix}.run.output_dir': set by the runner "
                         "(<out>/<variant name>/r<k>)")
    return out


def resolve(path_text, suite_file, root, key, where=None):
    """A path relative to the suite file, else to the repository root."""
    where = where or str(suite_file)
    if not isinstance(path_text, str) or not path_text:
        raise SuiteError(f"{where}: key '{key}' must be a non-empty string")
    candidates = [suite_file.parent / path_text, root / path_text]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise SuiteError(f"{where}: key '{key}': '{path_text}' not found "
                     f"(looked in {candidates[0].parent} and {root})")


def read_toml(path, what):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise SuiteError(f"{path}: cannot read {what}: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(f"{path}: {e}")


def positive_int(doc, key, default, path, least):
    value = doc.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise SuiteError(f"{path}: key '{key}' must be an integer >= {least} (got {value!r})")
    return value


def suite_header(doc, path):
    """The suite-wide keys of a suite file -> (description, warmup, repeats, common overrides,
    tables, includes)."""
    for k in doc:
        if k not in SUITE_KEYS:
            raise SuiteError(f"{path}: unknown key '{k}' (known: {', '.join(sorted(SUITE_KEYS))})")
    description = doc.get("description", path.stem)
    if not isinstance(description, str):
        raise SuiteError(f"{path}: key 'description' must be a string")
    warmup = positive_int(doc, "warmup", 2, path, 0)
    repeats = positive_int(doc, "repeats", DEFAULT_REPEATS, path, 1)
    common = flatten_overrides(doc.get("set", {}), path)
    tables = doc.get("variant", [])
    includes = doc.get("include", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SuiteError(f"{path}: key 'variant' must be an array of tables ([[variant]])")
    if not isinstance(includes, list):
        raise SuiteError(f"{path}: key 'include' must be an array of file names")
    if not tables and not includes:
        raise SuiteError(f"{path}: no [[variant]] and no 'include': nothing to run")
    return description, warmup, repeats, common, tables, includes


def variant_overrides(t, common, where):
    """A [[variant]] table's overrides on top of the suite's `common` ones: short keys and set.*."""
    overrides = dict(common)
    mine = {}
    for k, v in t.items():
        if k in VARIANT_OWN_KEYS:
            continue
        if k not in SHORTHANDS:
            raise SuiteError(f"{where}: unknown key '{k}' (known: {', '.join(VARIANT_OWN_KEYS)}, "
                             f"{', '.join(SHORTHANDS)})")
        mine[SHORTHANDS[k]] = v
    for k, v in flatten_overrides(t.get("set", {}), where).items():
        if k in mine:
            raise SuiteError(f"{where}: '{k}' is set twice (by a short key and by 'set')")
        mine[k] = v
    overrides.update(mine)
    for k, v in overrides.items():
        toml_value(v, f"{where}: key '{k}'")
    return overrides


def make_variant(t, i, doc, path, common, header, base_of):
    """One [[variant]] table -> Variant (checked)."""
    warmup, repeats = header
    where = f"{path}: variant[{i}]"
    name = t.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise SuiteError(f"{where}: key 'name' must be a string of letters, digits, '_', '-', '.' "
                         f"(got {name!r})")
    where = f"{path}: variant '{name}'"
    kind = t.get("kind", "ddp")
    if kind not in KINDS:
        raise SuiteError(f"{where}: key 'kind' must be one of {', '.join(KINDS)} (got {kind!r})")
    if "base" in t:
        base, base_config = base_of(t["base"], where)
    elif "base" in doc:
        base, base_config = base_of(doc["base"], None)
    else:
        raise SuiteError(f"{where}: no 'base' (the ddp config it starts from): set it for the "
                         f"suite or the variant")
    v = Variant(name, base, variant_overrides(t, common, where), warmup, str(path), base_config,
                kind, repeats)
    steps = v.setting("run.steps")
    if isinstance(steps, int) and steps <= warmup:
        raise SuiteError(f"{where}: run.steps = {steps} leaves no step after warmup = {warmup}")
    if kind == "pytorch":
        pytorch_args(v, where)  # refuses what it cannot reproduce, before anything runs
    return v


def load_suite(path, root=ROOT, _stack=()):
    """Reads and checks a suite file (and its includes) -> (description, [Variant])."""
    path = Path(path).resolve()
    if path in _stack:
        raise SuiteError(f"{_stack[-1]}: key 'include': '{path}' includes itself")
    doc = read_toml(path, "suite")
    description, warmup, repeats, common, tables, includes = suite_header(doc, path)
    bases = {}  # path -> parsed config

    def base_of(text, where):
        base = resolve(text, path, root, "base", where)
        if base not in bases:
            bases[base] = read_toml(base, "base config")
        return base, bases[base]

    if "base" in doc:
        base_of(doc["base"], None)  # checked even when every variant has its own
    variants = [make_variant(t, i, doc, path, common, (warmup, repeats), base_of)
                for i, t in enumerate(tables)]
    for i, inc in enumerate(includes):
        sub = resolve(inc, path, root, f"include[{i}]")
        _, sub_variants = load_suite(sub, root, _stack + (path,))
        for v in sub_variants:
            v.name = f"{sub.stem}/{v.name}"
            variants.append(v)

    seen = set()
    for v in variants:
        if v.name in seen:
            raise SuiteError(f"{path}: variant name '{v.name}' is used twice")
        seen.add(v.name)
    return description, variants


def effective_config(base_config, base_path, overrides):
    """The base config with the overrides applied (section.key, section.plugin.key); the paths
    the engine reads relative to the config file made absolute (those of overrides: relative to
    the repository root, where ddp runs)."""
    config = copy.deepcopy(base_config)
    for section, key in FILE_RELATIVE_KEYS:
        value = config.get(section, {}).get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            config[section][key] = os.path.normpath(Path(base_path).parent / value)
    for k, v in overrides.items():
        *parents, last = k.split(".")
        table = config
        for p in parents:
            if not isinstance(table.get(p), dict):
                table[p] = {}
            table = table[p]
        table[last] = v
        if tuple(k.split(".")) in FILE_RELATIVE_KEYS and isinstance(v, str) and v and not os.path.isabs(v):
            table[last] = os.path.normpath(ROOT / v)
    return config


def plugin_name(config, section, default):
    """The plugin a config chooses in `section`, as its table is named: a path
    (.../libddp_strategy_mine.so) gives 'mine'."""
    plugin = (config.get(section) or {}).get("plugin", default)
    if not isinstance(plugin, str):
        return str(plugin)
    base = os.path.basename(plugin)
    if base.endswith(".so"):
        return re.sub(rf"^(lib)?(ddp_{section}_)?", "", base[:-3])
    return plugin


def plugin_keys(config, section, default, overrides=()):
    """The keys the chosen plugin of `section` reads: its own table's, then those directly under
    the section (which go to whichever plugin is chosen); a key given by `overrides` (--set)
    wins over the file's."""
    table = config.get(section) or {}
    name = plugin_name(config, section, default)
    own = table.get(name) if isinstance(table.get(name), dict) else {}
    direct = {k: v for k, v in table.items() if k != "plugin" and not isinstance(v, dict)}
    keys = {**own, **direct}
    for k, v in overrides:
        if k.startswith(f"{section}.{name}."):
            keys[k.split(".")[-1]] = v
    return keys


def select(variants, patterns):
    """Variants whose name matches one of the globs (all when there are none)."""
    if not patterns:
        return variants
    for p in patterns:
        if not any(fnmatch.fnmatchcase(v.name, p) for v in variants):
            names = ", ".join(v.name for v in variants)
            raise SuiteError(f"--only {p}: no such variant (variants: {names})")
    return [v for v in variants if any(fnmatch.fnmatchcase(v.name, p) for p in patterns)]


def ddp_command(ddp, variant, out_dir):
    cmd = [str(ddp), "run", str(variant.base)]
    for k, v in variant.overrides.items():
        cmd += ["--set", f"{k}={toml_value(v)}"]
    return cmd + ["--set", f"run.output_dir={toml_value(str(out_dir))}"]


# ---------------------------------------------------------------- pytorch variants

def pytorch_args(v, where=None):
    """tools/pytorch_ddp_bench.py's options for pytorch variant v (tools/suite_pytorch.py);
    SuiteError naming the key it cannot reproduce."""
    try:
        return suite_pytorch.pytorch_args(v.config(), v.overrides, v.warmup,
                                          where or f"variant '{v.name}'")
    except suite_pytorch.Unreproducible as e:
        raise SuiteError(str(e))


def pytorch_command(python, v):
    return suite_pytorch.bench_command(python, pytorch_args(v))


# ---------------------------------------------------------------- runs -> figures

def mean_after(data, key, warmup, required=True):
    values = data.get(key)
    if not isinstance(values, list) or not values or any(x is None for x in values):
        if required:
            raise ValueError(f"no per-step '{key}'")
        return None
    if len(values) <= warmup:
        raise ValueError(f"{len(values)} steps of '{key}', not more than warmup = {warmup}")
    return statistics.fmean(values[warmup:])


PER_STEP = [("step_s", "step_time_s"), ("forward_s", "forward_s"), ("backward_s", "backward_s"),
            ("optimizer_s", "optimizer_s"), ("exposed_comm_s", "comm_blocked_s"),
            ("total_comm_s", "comm_busy_s"), ("collectives", "collectives"),
            ("comm_bytes", "comm_bytes"), ("bus_bytes", "bus_bytes")]


def memory_figures(summary):
    m = {}
    ranks = summary.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise ValueError("no 'ranks'")
    for c in CATEGORIES:
        try:
            m[f"peak_{c}_bytes"] = max(rk["peak_bytes"][c] for rk in ranks)
        except (KeyError, TypeError):
            raise ValueError(f"ranks[].peak_bytes has no '{c}'")
    for p in PHASES:
        try:
            m[f"rank0_{p}_bytes"] = summary["peak_bytes"][p]["total"]
        except (KeyError, TypeError):
            raise ValueError(f"peak_bytes has no '{p}.total'")
    return m


def units_per_step(data):
    """(unit, global samples or tokens per step): pytorch_ddp_bench.py says; a summary.json's
    rate times its mean step time gives it."""
    if "units_per_step" in data:
        return data.get("unit", "samples"), data["units_per_step"]
    for unit in ("tokens", "samples"):
        rate, mean = data.get(f"{unit}_per_s"), data.get("mean_step_time_s")
        if isinstance(rate, (int, float)) and isinstance(mean, (int, float)):
            return unit, round(rate * mean)
    return None, None


def measure(data, warmup, kind="ddp"):
    """One run's figures from its summary.json (kind ddp) or pytorch_ddp_bench.py's JSON: each
    per-step figure's mean after warm-up, the last step's loss (and every step's), throughput,
    MB sent per rank; memory (ddp); every step's bus_bytes and the held-out losses of [eval]
    (val_loss: the last). ValueError naming what is missing; figures a pytorch run does not
    measure are None."""
    ddp = kind == "ddp"
    m = {col: mean_after(data, key, warmup, required=ddp or col == "step_s") for col, key in PER_STEP}
    loss = data.get("loss")
    if not isinstance(loss, list) or not loss or not all(isinstance(x, (int, float)) for x in loss):
        raise ValueError("no per-step 'loss'")
    m["loss"], m["loss_curve"] = float(loss[-1]), [float(x) for x in loss]
    m["timed_steps"] = len(data["step_time_s"]) - warmup
    m["comm_fraction"] = (m["exposed_comm_s"] / m["step_s"]
                          if m["exposed_comm_s"] is not None and m["step_s"] > 0 else None)
    m["mb_sent"] = None if m["bus_bytes"] is None else m["bus_bytes"] / 1e6
    m["unit"], units = units_per_step(data)
    m["throughput"] = units / m["step_s"] if units and m["step_s"] > 0 else None
    if ddp:
        m.update(memory_figures(data))
    auto = (data.get("strategy_stats") or {}).get("auto")  # bucket_mb = "auto": its choice
    m["chosen_bucket_mb"] = auto.get("chosen_bucket_mb") if isinstance(auto, dict) else None
    m["torch"] = data.get("torch")  # a pytorch run: torch's version
    m["bus_curve"] = data.get("bus_bytes") if ddp else None  # every step's, for the eval plot
    m["eval_steps"], m["val_curve"] = eval_points(data)
    m["val_loss"] = m["val_curve"][-1] if m["val_curve"] else None
    return m


def eval_points(data):
    """summary.json's `eval` -> (steps evaluated after, held-out losses); ([], []) without."""
    ev = data.get("eval")
    steps = ev.get("after_steps") if isinstance(ev, dict) else None
    losses = ev.get("val_loss") if isinstance(ev, dict) else None
    if not isinstance(steps, list) or not isinstance(losses, list) or len(steps) != len(losses):
        return [], []
    return [int(s) for s in steps], [float(x) for x in losses]


# ---------------------------------------------------------------- variants -> rows

def model_label(config):
    m = config.get("model", {})
    name = m.get("name", "?")
    if name == "lm":
        return f"lm {m.get('preset', 'lm-tiny')}"
    if name == "mlp":
        return f"mlp {m.get('width', 1024)}x{m.get('depth', 8)}"
    return name


def comparison_key(config, world):
    """What must match for two runs to compare: everything but the strategy and run-only keys."""
    c = {s: dict(t) if isinstance(t, dict) else t for s, t in config.items() if s != "strategy"}
    run = {k: v for k, v in c.get("run", {}).items() if k not in RUN_ONLY_KEYS}
    run["world_size"] = world
    c["run"] = run
    return json.dumps(c, sort_keys=True, default=str)


def keys_text(keys):
    """bucket_mb=25 variant=allgather: as the table shows a plugin's keys."""
    text = lambda v: v if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else toml_value(v)
    return " ".join(f"{k}={text(v)}" for k, v in keys.items())


def variant_row(v):
    """The row of a variant before it runs: what it is (strategy and its keys, world, model,
    what it compares with); figures come from its runs (aggregate)."""
    c = v.config()
    world = v.setting("run.world_size", 1)
    if v.kind == "pytorch":
        strategy = "pytorch"
        keys = {"bucket_cap_mb": pytorch_args(v)["bucket-cap-mb"]} if world > 1 else {}
        bucket = None
    else:
        strategy = plugin_name(c, "strategy", "naive")
        keys = plugin_keys(c, "strategy", "naive", v.overrides.items())
        bucket = keys.get("bucket_mb")
    key = comparison_key(c, world)
    sweep = {k: val for k, val in keys.items() if k != "bucket_mb"}
    return {"variant": v.name, "suite": v.suite, "kind": v.kind, "status": "ok", "error": "",
            "strategy": strategy, "strategy_keys": keys_text(keys), "bucket_mb": bucket,
            "world": world, "model": model_label(c), "warmup": v.warmup, "repeats": v.repeats,
            "runs": {}, "seconds": 0.0, "_key": key,
            "_sweep_key": key + strategy + json.dumps(sweep, sort_keys=True, default=str)}


FIGURES = (["step_s", "forward_s", "backward_s", "optimizer_s", "exposed_comm_s", "total_comm_s",
            "comm_fraction", "throughput", "loss", "val_loss", "collectives", "mb_sent", "comm_bytes",
            "bus_bytes", "chosen_bucket_mb"]
           + [f"peak_{c}_bytes" for c in CATEGORIES] + [f"rank0_{p}_bytes" for p in PHASES])


def aggregate(row):
    """Every figure of the row's ok runs -> row["stats"][figure] (a Stat, or None)."""
    runs = [row["runs"][k] for k in sorted(row["runs"])]
    row["n"] = len(runs)
    row["stats"] = {f: summarize([r.get(f) for r in runs]) for f in FIGURES}
    row["unit"] = next((r["unit"] for r in runs if r.get("unit")), None)
    row["timed_steps"] = runs[0]["timed_steps"] if runs else None
    row["torch"] = next((r["torch"] for r in runs if r.get("torch")), None)
    return row


def paired_speedup(ref, row):
    """Stat of ref's step time / row's, run k against run k (the same round); None without
    common runs."""
    if ref is None or row["status"] != "ok":
        return None
    common = sorted(set(ref["runs"]) & set(row["runs"]))
    return ratio_stat([ref["runs"][k]["step_s"] / row["runs"][k]["step_s"] for k in common
                       if row["runs"][k]["step_s"] > 0])


def add_speedups(rows):
    """speedup: against the `naive` ddp row of the same suite file and comparison key;
    speedup_pytorch: against its `pytorch` row. Stats of paired ratios, or None."""
    naive, torch_ref = {}, {}
    for r in rows:
        if r["status"] == "ok" and r["runs"]:
            if r["kind"] == "ddp" and r["strategy"] == "naive":
                naive.setdefault((r["suite"], r["_key"]), r)
            if r["kind"] == "pytorch":
                torch_ref.setdefault((r["suite"], r["_key"]), r)
    for r in rows:
        r["speedup"] = paired_speedup(naive.get((r["suite"], r["_key"])), r)
        r["speedup_pytorch"] = paired_speedup(torch_ref.get((r["suite"], r["_key"])), r)
    return rows


def bucket_sweeps(rows):
    """Groups of ok rows of one suite file that differ only in a numeric strategy.bucket_mb
    (>= 2 sizes): [(label, [rows by bucket_mb], [references])]. References, drawn as
    horizontal lines: the group's rows with another bucket_mb (such as "auto") and the suite's
    other rows of the same model, data, optimizer and world (naive, overlap, pytorch, ...)."""
    groups = {}
    for r in rows:
        if r["status"] == "ok" and r["n"] and r.get("bucket_mb") is not None:
            groups.setdefault((r["suite"], r["_sweep_key"]), []).append(r)
    out = []
    for members in groups.values():
        numeric = [r for r in members if isinstance(r["bucket_mb"], (int, float))
                   and not isinstance(r["bucket_mb"], bool)]
        if len({r["bucket_mb"] for r in numeric}) < 2:
            continue
        first = numeric[0]
        points = {id(r) for r in numeric}
        refs = [r for r in rows if r["status"] == "ok" and r["n"] and id(r) not in points
                and r["suite"] == first["suite"] and r["_key"] == first["_key"]]
        out.append((f"{first['model']}, {first['strategy']}, world {first['world']}",
                    sorted(numeric, key=lambda r: r["bucket_mb"]), refs))
    return out


# ---------------------------------------------------------------- running

def error_tail(log_path, lines=12):
    """The last lines of a run's log."""
    try:
        text = Path(log_path).read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return []
    return text[-lines:]


def error_summary(tail):
    """One line for the table: the log's last lines that are not progress or the command."""
    lines = [l.strip() for l in tail if l.strip() and not re.match(r"(step \d+/\d+ |\$ )", l)]
    text = "; ".join(lines[-4:]) or "no output"
    return text if len(text) <= 400 else "…" + text[-399:]


def run_once(v, rdir, tools):
    """Runs variant v once into rdir -> (figures, seconds); RuntimeError(error, tail) when the
    run fails. tools: {"ddp": launcher, "python": for pytorch, "keep_weights": bool}."""
    rdir.mkdir(parents=True, exist_ok=True)
    if v.kind == "pytorch":
        cmd, log, result = pytorch_command(tools["python"], v), rdir / "pytorch.log", rdir / "pytorch.json"
    else:
        cmd, log, result = ddp_command(tools["ddp"], v, rdir), rdir / "ddp.log", rdir / "summary.json"
    result.unlink(missing_ok=True)  # never collect a previous run's
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        out = subprocess.PIPE if v.kind == "pytorch" else f
        p = subprocess.run(cmd, stdout=out, stderr=f, cwd=ROOT, text=True)
    seconds = time.monotonic() - t0
    if v.kind == "pytorch" and p.returncode == 0:
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        suite_report.write_atomically(result, (lines[-1] if lines else "") + "\n")
    if p.returncode != 0:
        tail = error_tail(log)
        raise RuntimeError(f"exit {p.returncode}: {error_summary(tail)}", tail)
    try:
        figures = measure(json.loads(result.read_text()), v.warmup, v.kind)
    except (OSError, ValueError) as e:
        msg = f"{result}: {e.strerror if isinstance(e, OSError) else e}"
        raise RuntimeError(msg, [msg])
    if not tools["keep_weights"]:
        (rdir / "weights.safetensors").unlink(missing_ok=True)
    return figures, seconds


def run_line(m, seconds):
    ms = lambda k: sig(m[k] * 1e3) if m.get(k) is not None else "—"
    comm = (f", exposed comm {ms('exposed_comm_s')} ms ({100 * m['comm_fraction']:.1f} %)"
            if m.get("comm_fraction") is not None else "")
    return (f"step {ms('step_s')} ms (forward {ms('forward_s')}, backward {ms('backward_s')}, "
            f"optimizer {ms('optimizer_s')}){comm}, loss {sig(m['loss'], 5)}; {seconds:.1f} s")


def variant_line(r):
    if r["status"] != "ok":
        return f"{r['variant']}: FAILED ({r['error']})"
    up = "".join(f", {fmt_stat(r[k])}x {ref}" for k, ref in [("speedup", "naive"),
                                                             ("speedup_pytorch", "pytorch")] if r[k])
    return (f"{r['variant']}: step {fmt_stat(scaled(r['stats']['step_s'], 1e3))} ms{up} "
            f"(n = {r['n']})")


def schedule(variants, repeats_override=None):
    """[(k, variant)]: round k (from 1) runs every variant with at least k repeats once, the
    order rotated by one each round so that no variant always runs first or after the same one."""
    reps = [repeats_override or v.repeats for v in variants]
    order = []
    for k in range(1, max(reps, default=0) + 1):
        todo = [v for v, n in zip(variants, reps) if n >= k]
        shift = (k - 1) % len(todo)
        order += [(k, v) for v in todo[shift:] + todo[:shift]]
    return order


def run_all(variants, out, tools, repeats_override):
    """Runs the schedule; returns the rows (in the suite's order). A failed run marks its
    variant failed (naming the run) and its later runs are skipped."""
    rows = {v.name: variant_row(v) for v in variants}
    order = schedule(variants, repeats_override)
    for i, (k, v) in enumerate(order, 1):
        row = rows[v.name]
        reps = repeats_override or v.repeats
        tag = f"[{i}/{len(order)}] {v.name}, run {k}/{reps}"
        if row["status"] != "ok":
            print(f"{tag}: skipped (failed in an earlier run)", flush=True)
            continue
        what = "pytorch" if v.kind == "pytorch" else v.setting("strategy.plugin", "naive")
        print(f"{tag} ({what}, world {row['world']}) ...", flush=True)
        try:
            figures, seconds = run_once(v, out / v.name / f"r{k}", tools)
            row["runs"][k] = dict(figures, seconds=seconds)
            row["seconds"] += seconds
            print(f"{tag}: {run_line(figures, seconds)}", flush=True)
        except RuntimeError as e:
            error, tail = e.args
            row.update(status="failed", error=f"run {k}/{reps}: {error}", failed_run=k)
            print(f"{tag}: FAILED ({error})", flush=True)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
            sys.stderr.flush()
    return [aggregate(rows[v.name]) for v in variants]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="tools/ddp_suite.py", add_help=False)
    ap.add_argument("suite")
    ap.add_argument("--out")
    ap.add_argument("--ddp", default=str(ROOT / "build" / "bin" / "ddp"))
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--keep-weights", action="store_true")
    return ap.parse_args(argv)


def command_text(args):
    """The command line that made the results, as results.md quotes it."""
    suite = Path(args.suite).resolve()
    text = f"tools/ddp_suite.py {suite.relative_to(ROOT) if suite.is_relative_to(ROOT) else suite}"
    if args.only:
        text += " --only " + " ".join(map(shlex.quote, args.only))
    if args.repeats:
        text += f" --repeats {args.repeats}"
    return text


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    args = parse_args(argv)

    def die(msg):
        print(f"ddp_suite: error: {msg}", file=sys.stderr)
        return 2

    if args.repeats is not None and args.repeats < 1:
        return die(f"--repeats must be >= 1 (got {args.repeats})")
    try:
        title, variants = load_suite(args.suite)
        variants = select(variants, args.only)
    except SuiteError as e:
        return die(str(e))
    ddp = Path(args.ddp).resolve()
    if any(v.kind == "ddp" for v in variants) and not (ddp.is_file() and os.access(ddp, os.X_OK)):
        return die(f"--ddp: '{args.ddp}' is not an executable (build it: tools/setup.sh)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return die("matplotlib is missing (Debian: apt-get install python3-matplotlib; "
                   "tools/setup.sh does)")
    out = Path(args.out).resolve() if args.out else ROOT / "runs" / "suites" / Path(args.suite).stem
    out.mkdir(parents=True, exist_ok=True)

    runs = len(schedule(variants, args.repeats))
    print(f"ddp_suite: {len(variants)} variant(s) of {args.suite}, {runs} run(s), into {out}", flush=True)
    tools = {"ddp": ddp, "python": args.python, "keep_weights": args.keep_weights}
    try:
        rows = add_speedups(run_all(variants, out, tools, args.repeats))
    except KeyboardInterrupt:
        print("ddp_suite: interrupted; no results written", file=sys.stderr)
        return 130
    for r in rows:
        print(variant_line(r), flush=True)
    plots = suite_report.write_results(plt, out, rows, title, command_text(args), bucket_sweeps(rows))
    failed = [r["variant"] for r in rows if r["status"] != "ok"]
    print(f"ddp_suite: {len(rows) - len(failed)} ok, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else "")
          + f"; results: {out / 'results.md'}, results.csv, runs.csv" + "".join(f", {p}" for p in plots),
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
