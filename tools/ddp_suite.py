#!/usr/bin/python3
"""tools/ddp_suite.py — the batch runner: runs every variant of a suite with `ddp run`, then
tables and plots their summary.json files.

usage: tools/ddp_suite.py SUITE.toml [--out DIR] [--ddp BIN] [--only NAME...] [--keep-weights]
  SUITE.toml      the suite (format below; configs/suites/ has the shipped ones)
  --out DIR       where results go (default runs/suites/<suite name>, in the repository)
  --ddp BIN       the launcher (default build/bin/ddp; build it with tools/setup.sh)
  --only NAME...  run only these variants (shell globs over names: 'strategies-lm/*')
  --keep-weights  keep each variant's weights.safetensors (removed by default)
Exit status: 0 when every variant succeeded; 1 when any failed (the table marks it, the
error's last lines are printed); 2 for a bad suite or command line (the message names the
file and key).

Suite format (TOML):
  description = "..."        # optional: the heading of results.md
  base = "../mlp.toml"       # the ddp config the variants start from: relative to this
                             # file, else to the repository root
  warmup = 2                 # steps left out of every mean (default 2); run.steps must exceed it
  include = ["a.toml"]       # optional: run these suites' variants too, as they are, their
                             # names prefixed "<suite name>/"
  [set]                      # optional: overrides for every variant of this file
  run.steps = 6              #   section.key = TOML value, as `ddp run --set section.key=value`
  [[variant]]                # one per run (names: letters, digits, '_', '-', '.'; unique)
  name = "bucketed-1"
  base = "../lm-cpu.toml"    # optional: this variant's own base config
  strategy = "bucketed"      # short for set.strategy.plugin; likewise world_size
  world_size = 2             # (run.world_size), steps (run.steps), preset (model.preset)
  set.strategy.bucket_mb = 1 # any other section.key (wins over the file's [set])
Each variant runs `ddp run BASE --set section.key=value ... --set run.output_dir=<out>/<name>`
from the repository root (so paths given in `set` are relative to it). A variant that names
a strategy (or transport) plugin starts from that plugin's defaults: the base's other keys of
that section are dropped, and ddp runs on a copy of the base without them (<name>/base.toml).

Outputs in DIR: <name>/ (ddp.log, summary.json), results.csv (every figure, seconds and
bytes), results.md (the table below, ready to paste), step_breakdown.png (forward, backward,
optimizer, exposed communication and the rest of each step, per variant, one panel per model)
and, when variants differ only in strategy.bucket_mb, bucket_sweep.png (step time and exposed
communication against bucket size, log x; the suite's other strategies on the same model as
horizontal lines). Each file is written to a temporary name and renamed. Every time is the
mean over the steps after warm-up; "exposed comm" is the time the training thread was blocked
on communication (comm_blocked_s), "total comm" the time the collectives ran (comm_busy_s);
comm % is exposed / step; speed-up is the step time of the `naive` variant of the same suite
file, model, data, optimizer and world size divided by this one's; memory columns are the
peak bytes per category of the rank that peaked highest.
e.g. tools/ddp_suite.py configs/suites/strategies-mlp.toml --only naive overlap
"""
import argparse
import csv
import datetime
import fnmatch
import io
import json
import math
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

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ["parameters", "gradients", "optimizer_state", "comm_buffers", "activations"]
PHASES = ["after_setup", "before_optimizer_step", "after_optimizer_step"]
SHORTHANDS = {"strategy": "strategy.plugin", "world_size": "run.world_size",
              "steps": "run.steps", "preset": "model.preset"}
PLUGIN_SECTIONS = ("strategy", "transport")
FILE_RELATIVE_KEYS = [("data", "path"), ("model", "init_from")]  # relative to the config file
VARIANT_OWN_KEYS = ("name", "base", "set")
SUITE_KEYS = {"description", "base", "warmup", "include", "set", "variant"}
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
# Keys that do not change what a step computes: left out when deciding which runs compare.
RUN_ONLY_KEYS = {"steps", "log_every", "output_dir", "timeout_s"}


class SuiteError(Exception):
    """A bad suite file; the message names the file and the key."""


@dataclass
class Variant:
    name: str
    base: Path                  # the ddp config, absolute
    overrides: dict             # "section.key" -> value (Python, from TOML)
    warmup: int
    suite: str                  # the file that declares it: runs compare within their suite
    base_config: dict = field(default_factory=dict, repr=False)  # as the variant sees it
    rewrite_base: bool = False  # base keys were dropped: run a rewritten copy (base_text)

    def setting(self, key, default=None):
        """The effective value of section.key: the override, else the base config's."""
        if key in self.overrides:
            return self.overrides[key]
        section, name = key.split(".", 1)
        return self.base_config.get(section, {}).get(name, default)


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
    """A `set` table, {section: {key: v}} or {"section.key": v} -> {"section.key": v}; `where`
    names the file (and variant) in errors."""
    prefix = "set"
    if not isinstance(table, dict):
        raise SuiteError(f"{where}: key '{prefix}' must be a table of section.key = value")
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, dict):
                    raise SuiteError(f"{where}: key '{prefix}.{k}.{k2}' is a table "
                                     "(keys are section.key)")
                out[f"{k}.{k2}"] = v2
        elif k.count(".") == 1 and all(k.split(".")):
            out[k] = v
        else:
            raise SuiteError(f"{where}: key '{prefix}.{k}': expected section.key = value")
    if "run.output_dir" in out:
        raise SuiteError(f"{where}: key '{prefix}.run.output_dir': set by the runner "
                         "(<out>/<variant name>)")
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


def suite_header(doc, path):
    """The suite-wide keys of a suite file -> (description, warmup, common overrides, tables, includes)."""
    for k in doc:
        if k not in SUITE_KEYS:
            raise SuiteError(f"{path}: unknown key '{k}' (known: {', '.join(sorted(SUITE_KEYS))})")
    description = doc.get("description", path.stem)
    if not isinstance(description, str):
        raise SuiteError(f"{path}: key 'description' must be a string")
    warmup = doc.get("warmup", 2)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise SuiteError(f"{path}: key 'warmup' must be an integer >= 0 (got {warmup!r})")
    common = flatten_overrides(doc.get("set", {}), path)
    tables = doc.get("variant", [])
    includes = doc.get("include", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SuiteError(f"{path}: key 'variant' must be an array of tables ([[variant]])")
    if not isinstance(includes, list):
        raise SuiteError(f"{path}: key 'include' must be an array of file names")
    if not tables and not includes:
        raise SuiteError(f"{path}: no [[variant]] and no 'include': nothing to run")
    return description, warmup, common, tables, includes


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


def load_suite(path, root=ROOT, _stack=()):
    """Reads and checks a suite file (and its includes) -> (description, [Variant])."""
    path = Path(path).resolve()
    if path in _stack:
        raise SuiteError(f"{_stack[-1]}: key 'include': '{path}' includes itself")
    doc = read_toml(path, "suite")
    description, warmup, common, tables, includes = suite_header(doc, path)
    variants = []
    bases = {}  # path -> parsed config

    def base_of(text, where):
        base = resolve(text, path, root, "base", where)
        if base not in bases:
            bases[base] = read_toml(base, "base config")
        return base, bases[base]

    if "base" in doc:
        base_of(doc["base"], None)  # checked even when every variant has its own
    for i, t in enumerate(tables):
        where = f"{path}: variant[{i}]"
        name = t.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise SuiteError(f"{where}: key 'name' must be a string of letters, digits, '_', '-', '.' "
                             f"(got {name!r})")
        where = f"{path}: variant '{name}'"
        if "base" in t:
            base, base_config = base_of(t["base"], where)
        elif "base" in doc:
            base, base_config = base_of(doc["base"], None)
        else:
            raise SuiteError(f"{where}: no 'base' (the ddp config it starts from): set it for the "
                             f"suite or the variant")
        overrides = variant_overrides(t, common, where)
        mine_base, rewrite = plugin_defaults(base_config, overrides)
        v = Variant(name, base, overrides, warmup, str(path), mine_base, rewrite)
        steps = v.setting("run.steps")
        if isinstance(steps, int) and steps <= warmup:
            raise SuiteError(f"{where}: run.steps = {steps} leaves no step after warmup = {warmup}")
        variants.append(v)

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


def plugin_defaults(base_config, overrides):
    """A variant that names a strategy (transport) plugin starts from that plugin's defaults:
    the base's keys directly under that section, which belonged to the base's plugin, are
    dropped; plugins' own tables ([strategy.bucketed]) stay, read only by their plugin.
    -> (base config as the variant sees it, whether anything was dropped)."""
    config, dropped = dict(base_config), False
    for section in PLUGIN_SECTIONS:
        table = base_config.get(section, {})
        if not isinstance(table, dict) or f"{section}.plugin" not in overrides:
            continue
        keep = {k: v for k, v in table.items() if k == "plugin" or isinstance(v, dict)}
        if keep != table:
            config[section] = keep
            dropped = True
    return config, dropped


def base_text(variant):
    """TOML text of the variant's base config after plugin_defaults, to be written somewhere
    else: the paths the engine reads relative to the config file are made absolute."""
    lines = [f"# {variant.base} as variant '{variant.name}' starts from it "
             "(written by tools/ddp_suite.py)"]
    config = {s: dict(t) if isinstance(t, dict) else t for s, t in variant.base_config.items()}
    for section, key in FILE_RELATIVE_KEYS:
        value = config.get(section, {}).get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            config[section][key] = os.path.normpath(variant.base.parent / value)
    for k, v in config.items():
        if not isinstance(v, dict):
            lines.append(f"{json.dumps(k)} = {toml_value(v, str(variant.base))}")
    for k, v in config.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(k2)} = {toml_value(v2, str(variant.base))}" for k2, v2 in v.items()
                      if not isinstance(v2, dict)]
            for k2, v2 in v.items():  # a plugin's own table
                if isinstance(v2, dict):
                    lines.append(f"[{json.dumps(k)}.{json.dumps(k2)}]")
                    lines += [f"{json.dumps(k3)} = {toml_value(v3, str(variant.base))}" for k3, v3 in v2.items()]
    return "\n".join(lines) + "\n"


def select(variants, patterns):
    """Variants whose name matches one of the globs (all when there are none)."""
    if not patterns:
        return variants
    for p in patterns:
        if not any(fnmatch.fnmatchcase(v.name, p) for v in variants):
            names = ", ".join(v.name for v in variants)
            raise SuiteError(f"--only {p}: no such variant (variants: {names})")
    return [v for v in variants if any(fnmatch.fnmatchcase(v.name, p) for p in patterns)]


def ddp_command(ddp, variant, out_dir, base=None):
    cmd = [str(ddp), "run", str(base or variant.base)]
    for k, v in variant.overrides.items():
        cmd += ["--set", f"{k}={toml_value(v)}"]
    return cmd + ["--set", f"run.output_dir={toml_value(str(out_dir))}"]


# ---------------------------------------------------------------- summaries -> rows

def mean_after(summary, key, warmup):
    values = summary.get(key)
    if not isinstance(values, list) or not values:
        raise ValueError(f"summary.json has no per-step '{key}'")
    if len(values) <= warmup:
        raise ValueError(f"summary.json has {len(values)} steps of '{key}', "
                         f"not more than warmup = {warmup}")
    return statistics.fmean(values[warmup:])


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


def row_from_summary(summary, warmup):
    """One table row (numbers in seconds and bytes) from a parsed summary.json; ValueError if
    a field is missing."""
    try:
        config = tomllib.loads(summary.get("config", ""))
    except tomllib.TOMLDecodeError:
        config = {}
    world = summary.get("world_size")
    if not isinstance(world, int):
        raise ValueError("summary.json has no 'world_size'")
    r = {"status": "ok", "strategy": summary.get("strategy", "?"), "world": world,
         "model": model_label(config), "timed_steps": len(summary.get("step_time_s", [])) - warmup}
    for col, key in [("step_s", "step_time_s"), ("forward_s", "forward_s"), ("backward_s", "backward_s"),
                     ("optimizer_s", "optimizer_s"), ("exposed_comm_s", "comm_blocked_s"),
                     ("total_comm_s", "comm_busy_s"), ("collectives", "collectives"),
                     ("comm_bytes", "comm_bytes")]:
        r[col] = mean_after(summary, key, warmup)
    r["comm_fraction"] = r["exposed_comm_s"] / r["step_s"] if r["step_s"] > 0 else float("nan")
    ranks = summary.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise ValueError("summary.json has no 'ranks'")
    for c in CATEGORIES:
        try:
            r[f"peak_{c}_bytes"] = max(rk["peak_bytes"][c] for rk in ranks)
        except (KeyError, TypeError):
            raise ValueError(f"summary.json: ranks[].peak_bytes has no '{c}'")
    for p in PHASES:
        try:
            r[f"rank0_{p}_bytes"] = summary["peak_bytes"][p]["total"]
        except (KeyError, TypeError):
            raise ValueError(f"summary.json: peak_bytes has no '{p}.total'")
    keys = {k: v for k, v in config.get("strategy", {}).items() if k != "plugin"}
    r["strategy_keys"] = " ".join(f"{k}={v if isinstance(v, str) else toml_value(v)}"
                                  for k, v in keys.items())
    r["bucket_mb"] = keys.get("bucket_mb")
    auto = (summary.get("strategy_stats") or {}).get("auto")  # bucket_mb = "auto": its choice
    r["chosen_bucket_mb"] = auto.get("chosen_bucket_mb") if isinstance(auto, dict) else None
    r["_key"] = comparison_key(config, world)
    strategy = {k: v for k, v in config.get("strategy", {}).items() if k != "bucket_mb"}
    r["_sweep_key"] = r["_key"] + json.dumps(strategy, sort_keys=True, default=str)
    return r


def add_speedups(rows):
    """speedup = step time of the `naive` row of the same suite file and comparison key / this
    row's."""
    naive = {}
    for r in rows:
        if r["status"] == "ok" and r["strategy"] == "naive":
            naive.setdefault((r.get("suite"), r["_key"]), r["step_s"])
    for r in rows:
        ref = naive.get((r.get("suite"), r.get("_key"))) if r["status"] == "ok" else None
        r["speedup"] = ref / r["step_s"] if ref and r["step_s"] > 0 else None
    return rows


def bucket_sweeps(rows):
    """Groups of ok rows of one suite file that differ only in a numeric strategy.bucket_mb
    (>= 2 sizes): [(label, [rows by bucket_mb], [references])]. References, drawn as
    horizontal lines: the group's rows with another bucket_mb (such as "auto") and the suite's
    other rows of the same model, data, optimizer and world (naive, overlap, ...)."""
    groups = {}
    for r in rows:
        if r["status"] == "ok" and r.get("bucket_mb") is not None:
            groups.setdefault((r.get("suite"), r["_sweep_key"]), []).append(r)
    out = []
    for members in groups.values():
        numeric = [r for r in members if isinstance(r["bucket_mb"], (int, float))
                   and not isinstance(r["bucket_mb"], bool)]
        if len({r["bucket_mb"] for r in numeric}) < 2:
            continue
        first = numeric[0]
        points = {id(r) for r in numeric}
        refs = [r for r in rows if r["status"] == "ok" and id(r) not in points
                and r.get("suite") == first.get("suite") and r["_key"] == first["_key"]]
        out.append((f"{first['model']}, {first['strategy']}, world {first['world']}",
                    sorted(numeric, key=lambda r: r["bucket_mb"]), refs))
    return out


# ---------------------------------------------------------------- output files

def sig(x, digits=3):
    """x with `digits` significant digits, never in exponent notation; '—' for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{min(decimals, 6)}f}"


MIB = 1024 * 1024
CSV_COLUMNS = (["variant", "status", "strategy", "strategy_keys", "world", "model", "timed_steps",
                "step_s", "forward_s", "backward_s", "optimizer_s", "exposed_comm_s", "total_comm_s",
                "comm_fraction", "speedup", "collectives", "comm_bytes", "bucket_mb", "chosen_bucket_mb"]
               + [f"peak_{c}_bytes" for c in CATEGORIES] + [f"rank0_{p}_bytes" for p in PHASES]
               + ["seconds", "error"])


def csv_text(rows):
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()


def markdown(rows, title, note, command, plots):
    """results.md: a table ready to paste."""
    head = ["variant", "strategy (keys)", "world", "step ms", "forward ms", "backward ms",
            "optimizer ms", "exposed comm ms", "total comm ms", "comm %", "speed-up vs naive",
            "params MiB", "grads MiB", "opt state MiB", "comm buf MiB", "activations MiB"]
    lines = [f"### {title}", "", f"`{command}` — {note}", "",
             "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["variant"], r["strategy"], str(r["world"]), "**failed**"]
            cells += ["—"] * (len(head) - len(cells))
        else:
            ms = lambda k: sig(r[k] * 1e3)
            keys = r["strategy_keys"]
            if r.get("chosen_bucket_mb") is not None:
                keys += f" → {sig(r['chosen_bucket_mb'])}"
            strategy = r["strategy"] + (f" ({keys})" if keys else "")
            cells = [r["variant"], strategy, str(r["world"]), ms("step_s"), ms("forward_s"),
                     ms("backward_s"), ms("optimizer_s"), ms("exposed_comm_s"), ms("total_comm_s"),
                     f"{100 * r['comm_fraction']:.1f}",
                     "—" if r["speedup"] is None else f"{r['speedup']:.2f}"] + \
                    [sig(r[f"peak_{c}_bytes"] / MIB) for c in CATEGORIES]
        lines.append("| " + " | ".join(cells) + " |")
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        lines += ["", "Peak memory of rank 0, all categories (MiB): after set-up, before and after the "
                  "optimizer step.", "", "| variant | after set-up | before optimizer step | "
                  "after optimizer step |", "|---|---:|---:|---:|"]
        for r in ok:
            cells = [r["variant"]] + [sig(r[f"rank0_{p}_bytes"] / MIB) for p in PHASES]
            lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "Failed:", ""] + [f"- `{r['variant']}`: {r['error']}" for r in failed]
    if plots:
        lines += [""] + [f"![{alt}]({name})" for name, alt in plots]
    return "\n".join(lines) + "\n"


def write_atomically(path, data):
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def save_figure(fig, path):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomically(path, buf.getvalue())


def plot_breakdown(plt, rows, path):
    """Stacked bars of each ok row's step, one panel per model."""
    ok = [r for r in rows if r["status"] == "ok"]
    models = list(dict.fromkeys(r["model"] for r in ok))
    most = max(sum(r["model"] == m for r in ok) for m in models)
    fig, axes = plt.subplots(len(models), 1, figsize=(min(16, 3 + 0.8 * max(most, 4)), 4 * len(models)),
                             squeeze=False, layout="constrained")
    parts = [("forward_s", "forward", "#4c72b0"), ("backward_s", "backward", "#55a868"),
             ("optimizer_s", "optimizer", "#8172b2"), ("exposed_comm_s", "exposed comm", "#c44e52")]
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in ok if r["model"] == model]
        x = range(len(mine))
        bottom = [0.0] * len(mine)
        for key, label, color in parts + [(None, "rest of the step", "#bbbbbb")]:
            if key:
                h = [r[key] * 1e3 for r in mine]
            else:
                h = [max(0.0, r["step_s"] * 1e3 - b) for r, b in zip(mine, bottom)]
            ax.bar(x, h, bottom=bottom, label=label, color=color)
            bottom = [b + v for b, v in zip(bottom, h)]
        worlds = len({r["world"] for r in mine}) > 1
        names = [r["variant"] + (f" (world {r['world']})" if worlds else "") for r in mine]
        tilt = len(mine) > 5
        ax.set_xticks(list(x), names, fontsize=8, rotation=30 if tilt else 0,
                      ha="right" if tilt else "center")
        ax.set_ylabel("ms per step")
        world = "" if worlds else f", world {mine[0]['world']}"
        ax.set_title(f"{model}{world}: where a step goes")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)
    plt.close(fig)


def plot_sweeps(plt, sweeps, path):
    """Step time and exposed communication against bucket_mb, one row of panels per sweep."""
    fig, axes = plt.subplots(len(sweeps), 2, figsize=(11, 3.8 * len(sweeps)), squeeze=False,
                             layout="constrained")
    styles = ["--", ":", "-."]
    for (label, rows, refs), (ax_t, ax_c) in zip(sweeps, axes):
        xs = [r["bucket_mb"] for r in rows]
        for ax, key, what in [(ax_t, "step_s", "step time"), (ax_c, "exposed_comm_s", "exposed comm")]:
            ax.plot(xs, [r[key] * 1e3 for r in rows], "o-", label="bucket_mb")
            for i, ref in enumerate(refs):
                chose = ref.get("chosen_bucket_mb")
                name = ref["variant"] + (f" (chose {sig(chose)})" if chose else "")
                ax.axhline(ref[key] * 1e3, linestyle=styles[i % len(styles)], color=f"C{i + 1}",
                           label=name)
                if chose:  # bucket_mb = "auto": a star at the size it chose
                    ax.plot([chose], [ref[key] * 1e3], "*", color=f"C{i + 1}", ms=12)
            ax.set_xscale("log")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
            ax.set_xlabel("bucket_mb (MiB)")
            ax.set_ylabel(f"{what}, ms")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{label}: {what}", fontsize=10)
            ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


# ---------------------------------------------------------------- running

def error_tail(log_path, lines=12):
    """The last lines of a variant's log."""
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


def run_variant(ddp, v, out, keep_weights):
    """Runs one variant; returns its row (status ok or failed)."""
    vdir = out / v.name
    vdir.mkdir(parents=True, exist_ok=True)
    summary_path = vdir / "summary.json"
    summary_path.unlink(missing_ok=True)  # never collect a previous run's
    log = vdir / "ddp.log"
    base = None
    if v.rewrite_base:
        base = vdir / "base.toml"
        write_atomically(base, base_text(v))
    cmd = ddp_command(ddp, v, vdir, base)
    row = {"variant": v.name, "suite": v.suite, "status": "failed", "error": "",
           "strategy": str(v.setting("strategy.plugin", "naive")),
           "world": v.setting("run.world_size", 1)}
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    row["seconds"] = time.monotonic() - t0
    if rc != 0:
        tail = error_tail(log)
        row.update(error=f"exit {rc}: {error_summary(tail)}", tail=tail)
        return row
    try:
        summary = json.loads(summary_path.read_text())
        row.update(row_from_summary(summary, v.warmup))
    except (OSError, ValueError) as e:
        msg = f"{summary_path}: {e.strerror}" if isinstance(e, OSError) else f"{summary_path}: {e}"
        row.update(status="failed", error=msg, tail=[msg])
        return row
    if not keep_weights:
        (vdir / "weights.safetensors").unlink(missing_ok=True)
    return row


def result_line(r):
    if r["status"] != "ok":
        return f"FAILED ({r['error']}) in {r['seconds']:.1f} s"
    up = "" if r["speedup"] is None else f", {r['speedup']:.2f}x naive"
    return (f"step {sig(r['step_s'] * 1e3)} ms (forward {sig(r['forward_s'] * 1e3)}, backward "
            f"{sig(r['backward_s'] * 1e3)}, optimizer {sig(r['optimizer_s'] * 1e3)}), exposed comm "
            f"{sig(r['exposed_comm_s'] * 1e3)} ms ({100 * r['comm_fraction']:.1f} %){up}; "
            f"{r['seconds']:.1f} s")


def main(argv):
    ap = argparse.ArgumentParser(prog="tools/ddp_suite.py", add_help=False)
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    ap.add_argument("suite")
    ap.add_argument("--out")
    ap.add_argument("--ddp", default=str(ROOT / "build" / "bin" / "ddp"))
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--keep-weights", action="store_true")
    args = ap.parse_args(argv)

    def die(msg):
        print(f"ddp_suite: error: {msg}", file=sys.stderr)
        return 2

    try:
        title, variants = load_suite(args.suite)
        variants = select(variants, args.only)
    except SuiteError as e:
        return die(str(e))
    ddp = Path(args.ddp).resolve()
    if not (ddp.is_file() and os.access(ddp, os.X_OK)):
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

    rows, n = [], len(variants)
    print(f"ddp_suite: {n} variant(s) of {args.suite} into {out}", flush=True)
    for i, v in enumerate(variants, 1):
        print(f"[{i}/{n}] {v.name} ({v.setting('strategy.plugin', 'naive')}, world "
              f"{v.setting('run.world_size', 1)}) ...", flush=True)
        try:
            row = run_variant(ddp, v, out, args.keep_weights)
        except KeyboardInterrupt:
            print("ddp_suite: interrupted; no results written", file=sys.stderr)
            return 130
        rows.append(row)
        add_speedups(rows)
        print(f"[{i}/{n}] {v.name}: {result_line(row)}", flush=True)
        for line in row.get("tail", []):
            print(f"    {line}", file=sys.stderr)
        sys.stderr.flush()

    warmups = "/".join(map(str, sorted({v.warmup for v in variants})))
    note = (f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs; means over each run's steps "
            f"after the first {warmups} (warm-up); memory: peak per rank, the highest rank.")
    suite = Path(args.suite).resolve()
    command = f"tools/ddp_suite.py {suite.relative_to(ROOT) if suite.is_relative_to(ROOT) else suite}"
    command += " --only " + " ".join(map(shlex.quote, args.only)) if args.only else ""
    plots = []
    for name, alt, make, data in [
            ("step_breakdown.png", "step time breakdown per variant", plot_breakdown,
             rows if any(r["status"] == "ok" for r in rows) else None),
            ("bucket_sweep.png", "step time and exposed communication vs bucket size", plot_sweeps,
             bucket_sweeps(rows) or None)]:
        if data:
            make(plt, data, out / name)
            plots.append((name, alt))
        else:
            (out / name).unlink(missing_ok=True)  # a previous run's would not match the table
    write_atomically(out / "results.csv", csv_text(rows))
    write_atomically(out / "results.md", markdown(rows, title, note, command, plots))
    failed = [r["variant"] for r in rows if r["status"] != "ok"]
    print(f"ddp_suite: {len(rows) - len(failed)} ok, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else "")
          + f"; results: {out / 'results.md'}, results.csv" + "".join(f", {p}" for p, _ in plots),
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
