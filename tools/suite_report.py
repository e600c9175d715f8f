"""tools/suite_report.py — the output files of tools/ddp_suite.py from its rows: results.md,
results.csv, runs.csv and the plots (step_breakdown.png, bucket_sweep.png, loss_vs_step.png,
val_loss_vs_bytes.png).

A row is one variant: what it is (variant, kind, strategy, strategy_keys, world, model, ...),
its runs ({k: figures of run k}), n (ok runs), stats ({figure: suite_stats.Stat}) and the
speed-ups (speedup: against naive, speedup_pytorch: against the pytorch variant; Stats).
Every file is written to a temporary name and renamed.
"""
import csv
import datetime
import io
import os
import statistics

from suite_stats import fmt_stat, scaled, sig

CATEGORIES = ["parameters", "gradients", "optimizer_state", "comm_buffers", "activations"]
PHASES = ["after_setup", "before_optimizer_step", "after_optimizer_step"]
MIB = 1024 * 1024
# Figures of results.csv (each: median, _low, _high) in seconds, bytes, units per second.
CSV_FIGURES = (["step_s", "forward_s", "backward_s", "optimizer_s", "exposed_comm_s", "total_comm_s",
                "comm_fraction", "throughput", "loss", "val_loss", "collectives", "mb_sent", "comm_bytes",
                "bus_bytes", "chosen_bucket_mb"]
               + [f"peak_{c}_bytes" for c in CATEGORIES] + [f"rank0_{p}_bytes" for p in PHASES])
CSV_HEAD = ["variant", "status", "kind", "strategy", "strategy_keys", "world", "model", "n",
            "timed_steps", "throughput_unit", "bucket_mb"]
SPEEDUPS = [("speedup", "speedup_vs_naive"), ("speedup_pytorch", "speedup_vs_pytorch")]


def write_atomically(path, data):
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def stat(r, figure):
    return (r.get("stats") or {}).get(figure)


def median(r, figure, scale=1.0):
    s = stat(r, figure)
    return None if s is None else s.median * scale


def plain(x):
    return "" if x is None else x


# ---------------------------------------------------------------- CSV

def csv_columns():
    cols = list(CSV_HEAD)
    for f in CSV_FIGURES:
        cols += [f, f"{f}_low", f"{f}_high"]
    for _, name in SPEEDUPS:
        cols += [name, f"{name}_low", f"{name}_high"]
    return cols + ["seconds", "error"]


def csv_text(rows):
    """results.csv: one line per variant; every figure's median, low and high (empty: none)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(csv_columns())
    for r in rows:
        line = [r["variant"], r["status"], r["kind"], r["strategy"], r["strategy_keys"], r["world"],
                r["model"], r.get("n", 0), plain(r.get("timed_steps")), plain(r.get("unit")),
                plain(r.get("bucket_mb"))]
        for s in [stat(r, f) for f in CSV_FIGURES] + [r.get(k) for k, _ in SPEEDUPS]:
            line += ["", "", ""] if s is None else [s.median, plain(s.low), plain(s.high)]
        w.writerow(line + [f"{r.get('seconds', 0):.1f}", r.get("error", "")])
    return buf.getvalue()


RUN_FIGURES = [f for f in CSV_FIGURES if f != "chosen_bucket_mb"] + ["chosen_bucket_mb", "timed_steps"]


def runs_csv_text(rows):
    """runs.csv: one line per run (k from 1, the round it ran in), every figure of it."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "run", "status", "kind", "strategy", "world", "model"] + RUN_FIGURES
               + ["seconds", "error"])
    for r in rows:
        runs = [(k, m, "ok", "") for k, m in sorted(r["runs"].items())]
        if r.get("failed_run"):
            runs.append((r["failed_run"], {}, "failed", r["error"]))
        for k, m, status, error in runs:
            w.writerow([r["variant"], k, status, r["kind"], r["strategy"], r["world"], r["model"]]
                       + [plain(m.get(f)) for f in RUN_FIGURES]
                       + ["" if "seconds" not in m else f"{m['seconds']:.2f}", error])
    return buf.getvalue()


# ---------------------------------------------------------------- results.md

def strategy_cell(r):
    keys = r["strategy_keys"]
    chose = median(r, "chosen_bucket_mb")
    if chose is not None:
        keys += f" → {sig(chose)}"
    name = "PyTorch DDP" if r["kind"] == "pytorch" and r["world"] > 1 else \
        "PyTorch (one process)" if r["kind"] == "pytorch" else r["strategy"]
    return name + (f" ({keys})" if keys else "")


def table(head, body):
    return (["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
            + ["| " + " | ".join(cells) + " |" for cells in body])


def step_table(mine, with_torch):
    """Per variant: what it is, n, step time, speed-ups, throughput, loss, collectives, MB."""
    unit = next((r["unit"] for r in mine if r.get("unit")), "samples")
    head = ["variant", "strategy (keys)", "world", "n", "step ms", "speed-up vs naive"]
    head += ["speed-up vs PyTorch"] if with_torch else []
    head += [f"{unit}/s", "final loss", "collectives/step", "MB sent/rank/step"]
    body = []
    for r in mine:
        cells = [r["variant"], strategy_cell(r), str(r["world"]), str(r.get("n", 0))]
        if r["status"] != "ok":
            body.append(cells + ["**failed**"] + ["—"] * (len(head) - 5))
            continue
        cells += [fmt_stat(scaled(stat(r, "step_s"), 1e3)), fmt_stat(r["speedup"])]
        cells += [fmt_stat(r["speedup_pytorch"])] if with_torch else []
        same_unit = r.get("unit") == unit  # else its figure does not belong in this column
        cells += [fmt_stat(stat(r, "throughput")) if same_unit else "—", fmt_stat(stat(r, "loss"), 5),
                  fmt_stat(stat(r, "collectives"), integer=True), fmt_stat(stat(r, "mb_sent"))]
        body.append(cells)
    return table(head, body)


def breakdown_table(mine):
    head = ["variant", "forward ms", "backward ms", "optimizer ms", "exposed comm ms",
            "total comm ms", "comm %"]
    body = []
    for r in mine:
        if r["status"] != "ok":
            continue
        ms = [fmt_stat(scaled(stat(r, f), 1e3)) for f in
              ["forward_s", "backward_s", "optimizer_s", "exposed_comm_s", "total_comm_s"]]
        body.append([r["variant"]] + ms + [fmt_stat(scaled(stat(r, "comm_fraction"), 100))])
    return table(head, body)


def memory_table(rows):
    head = ["variant", "params", "grads", "opt state", "comm buf", "activations",
            "rank 0 after set-up", "before optimizer step", "after optimizer step"]
    body = [[r["variant"]] + [fmt_stat(scaled(stat(r, f), 1 / MIB)) for f in
                              [f"peak_{c}_bytes" for c in CATEGORIES] + [f"rank0_{p}_bytes" for p in PHASES]]
            for r in rows if r["status"] == "ok" and stat(r, "peak_parameters_bytes")]
    return table(head, body) if body else []


# ---------------------------------------------------------------- held-out loss against bytes

def first_run(r):
    """The figures of the row's first ok run (lowest k), or None: the held-out loss plot and
    table show it (bytes repeat exactly from run to run, losses too with the same seed)."""
    return r["runs"][min(r["runs"])] if r.get("runs") else None


def val_points(m):
    """One run's figures -> [(MB sent per rank up to and including step s, held-out loss after
    step s)] for each evaluated step s: the running sum of its per-step bus_bytes (1 MB = 10⁶
    bytes). [] without evaluations or per-step bytes."""
    curve = (m or {}).get("bus_curve") or []
    pairs = zip((m or {}).get("eval_steps") or [], (m or {}).get("val_curve") or [])
    return [(sum(curve[:s]) / 1e6, loss) for s, loss in pairs if 0 < s <= len(curve)]


def bytes_per_step(m):
    """Mean bytes sent per rank per step over every step of a run, warm-up included (a sync
    every `period` steps then counts once per period); None without per-step bytes."""
    curve = (m or {}).get("bus_curve")
    return sum(curve) / len(curve) if curve else None


def evaluated(rows):
    """The measured rows whose first run has held-out losses."""
    return [r for r in measured(rows) if val_points(first_run(r))]


def bytes_fractions(rows):
    """{variant: bytes_per_step of its first run / that of the first `bucketed` ddp row of the
    same suite file, model, data, optimizer and world (None: no such row, or no bytes)}."""
    ref = {}
    for r in measured(rows):
        if r["kind"] == "ddp" and r["strategy"] == "bucketed":
            ref.setdefault((r["suite"], r["_key"]), bytes_per_step(first_run(r)))
    out = {}
    for r in measured(rows):
        base, mine = ref.get((r["suite"], r["_key"])), bytes_per_step(first_run(r))
        out[r["variant"]] = mine / base if base and mine is not None else None
    return out


def fraction_text(f):
    """0.125 -> '0.125 (1/8)'."""
    if f is None:
        return "—"
    return sig(f) + (f" (1/{sig(1 / f)})" if 0 < f < 1 else "")


def eval_table(mine, fractions):
    """Per row with held-out losses (its first run): bytes sent per step as a fraction of the
    bucketed variant's, MB sent per rank in the whole run, the last held-out loss, the steps
    evaluated after."""
    head = ["variant", "strategy (keys)", "bytes/step vs bucketed", "MB sent/rank (run)",
            "final val loss", "evaluated after steps"]
    body = []
    for r in mine:
        m = first_run(r)
        steps = m["eval_steps"]
        shown = steps if len(steps) <= 4 else steps[:2] + ["…", steps[-1]]
        body.append([r["variant"], strategy_cell(r), fraction_text(fractions.get(r["variant"])),
                     sig(sum(m["bus_curve"]) / 1e6), f"{m['val_curve'][-1]:.4f}",
                     ", ".join(map(str, shown))])
    return table(head, body)


def note(rows):
    """What the numbers are, for the top of results.md."""
    ns = sorted({r.get("n", 0) for r in rows if r["status"] == "ok"})
    warmups = "/".join(map(str, sorted({r["warmup"] for r in rows})))
    runs = ("n = 1, no interval: one run per variant, its numbers alone." if ns == [1] else
            f"{'/'.join(map(str, ns))} runs per variant (n), interleaved round by round. Each cell "
            "is the median over the runs and, in brackets, the 95 % confidence interval of their "
            "mean (Student's t, n − 1 degrees of freedom; none when n = 1); a number alone: every "
            "run gave the same. Speed-ups pair run k with run k of the reference (the same "
            "round): the median ratio of the reference's step time to this one's, interval "
            "exp(t-interval of the log ratios).")
    text = (f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs. Each run's figure is its "
            f"mean over the steps after the first {warmups} (warm-up). {runs} Final loss: the last "
            "step's. MB sent: what each rank sends per step (summary.json's bus_bytes, counted as "
            "nccl-tests' bus bandwidth counts it), 1 MB = 10⁶ bytes. Exposed comm: the time the "
            "training thread waited on communication; total comm: the time the collectives ran; "
            "comm % = exposed / step. Memory: peak MiB per category of the rank that peaked "
            "highest, and rank 0's total.")
    torch = next((r for r in rows if r["kind"] == "pytorch" and r["status"] == "ok"), None)
    if torch:
        text += (f" PyTorch: torch {torch.get('torch') or '?'}'s DistributedDataParallel (gloo) on "
                 "the same model, batch, optimizer, steps and warm-up, with its own random data and "
                 "initialisation (its loss compares in level, not bit for bit); its backward "
                 "includes DDP's wait for its all-reduces; — where it measures nothing.")
    return text


def markdown(rows, title, command, plots):
    """results.md: per model a table of step times and one of where the step goes, then memory."""
    lines = [f"### {title}", "", f"`{command}`", "", note(rows)]
    with_torch = any(r.get("speedup_pytorch") for r in rows)
    fractions = bytes_fractions(rows)
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        lines += ["", f"**{model}**", ""] + step_table(mine, with_torch)
        if any(r["status"] == "ok" for r in mine):
            lines += ["", f"{model}: where a step goes", ""] + breakdown_table(mine)
        if evaluated(mine):
            lines += ["", f"{model}: bytes sent per step as a fraction of the bucketed variant's "
                      "(mean over every step, warm-up included) and held-out loss; each "
                      "variant's first run", ""] + eval_table(evaluated(mine), fractions)
    memory = memory_table(rows)
    if memory:
        lines += ["", "Peak memory (MiB): per category, the highest rank; rank 0's total after "
                  "set-up, before and after the optimizer step.", ""] + memory
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "Failed:", ""] + [f"- `{r['variant']}`: {r['error']}" for r in failed]
    if plots:
        lines += [""] + [f"![{alt}]({name})" for name, alt in plots]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- plots

def save_figure(fig, path):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomically(path, buf.getvalue())


def yerr(stats, scale=1e3):
    """matplotlib's asymmetric error bars ([below], [above]) around the medians; 0 without an
    interval."""
    below, above = [], []
    for s in stats:
        if s is None or s.low is None:
            below.append(0.0)
            above.append(0.0)
        else:
            below.append(max(0.0, (s.median - s.low) * scale))
            above.append(max(0.0, (s.high - s.median) * scale))
    return [below, above]


def measured(rows):
    return [r for r in rows if r["status"] == "ok" and r.get("n")]


def breakdown_panel(ax, mine):
    parts = [("forward_s", "forward", "#4c72b0"), ("backward_s", "backward", "#55a868"),
             ("optimizer_s", "optimizer", "#8172b2"), ("exposed_comm_s", "exposed comm", "#c44e52")]
    x = list(range(len(mine)))
    bottom = [0.0] * len(mine)
    torch = [r["kind"] == "pytorch" for r in mine]
    for key, label, color in parts + [(None, "rest of the step", "#bbbbbb")]:
        if key:
            h = [median(r, key, 1e3) or 0.0 for r in mine]
        else:
            h = [max(0.0, median(r, "step_s", 1e3) - b) for r, b in zip(mine, bottom)]
        bars = ax.bar(x, h, bottom=bottom, label=label, color=color)
        if key == "backward_s":
            for bar, t in zip(bars, torch):
                if t:  # PyTorch's backward includes DDP's wait for its all-reduces
                    bar.set_hatch("//")
        bottom = [b + v for b, v in zip(bottom, h)]
    steps = [stat(r, "step_s") for r in mine]
    ax.errorbar(x, [s.median * 1e3 for s in steps], yerr=yerr(steps), fmt="none", ecolor="black",
                capsize=4, label="step: 95 % interval")
    handles, _ = ax.get_legend_handles_labels()
    if any(torch):
        from matplotlib.patches import Patch
        handles.insert(2, Patch(facecolor="#55a868", hatch="//",
                                label="backward incl. DDP's comm wait (PyTorch)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def plot_breakdown(plt, rows, path):
    """Stacked bars of each measured row's step (medians), one panel per model; the step time's
    95 % interval as an error bar on top."""
    ok = measured(rows)
    models = list(dict.fromkeys(r["model"] for r in ok))
    most = max(sum(r["model"] == m for r in ok) for m in models)
    fig, axes = plt.subplots(len(models), 1, figsize=(min(16, 3 + 0.8 * max(most, 4)), 4 * len(models)),
                             squeeze=False, layout="constrained")
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in ok if r["model"] == model]
        breakdown_panel(ax, mine)
        worlds = len({r["world"] for r in mine}) > 1
        names = [r["variant"] + (f" (world {r['world']})" if worlds else "") for r in mine]
        tilt = len(mine) > 5
        ax.set_xticks(list(range(len(mine))), names, fontsize=8, rotation=30 if tilt else 0,
                      ha="right" if tilt else "center")
        ax.set_ylabel("ms per step (median)")
        world = "" if worlds else f", world {mine[0]['world']}"
        ax.set_title(f"{model}{world}: where a step goes (n = {'/'.join(sorted({str(r['n']) for r in mine}))})")
    save_figure(fig, path)
    plt.close(fig)


def sweep_panel(ax, rows, refs, key, what):
    xs = [r["bucket_mb"] for r in rows]
    stats = [stat(r, key) for r in rows]
    ax.errorbar(xs, [s.median * 1e3 for s in stats], yerr=yerr(stats), fmt="o-", capsize=4,
                label="bucket_mb")
    styles = ["--", ":", "-."]
    for i, ref in enumerate(refs):
        s = stat(ref, key)
        if s is None:
            continue
        chose = median(ref, "chosen_bucket_mb")
        name = ref["variant"] + (f" (chose {sig(chose)})" if chose else "")
        color = f"C{i + 1}"
        ax.axhline(s.median * 1e3, linestyle=styles[i % len(styles)], color=color, label=name)
        if s.low is not None:
            ax.axhspan(s.low * 1e3, s.high * 1e3, color=color, alpha=0.12)
        if chose:  # bucket_mb = "auto": a star at the size it chose
            ax.plot([chose], [s.median * 1e3], "*", color=color, ms=12)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("bucket_mb (MiB)")
    ax.set_ylabel(f"{what}, ms (median, 95 % interval)")
    ax.set_ylim(bottom=0)


def plot_sweeps(plt, sweeps, path):
    """Step time and exposed communication against bucket_mb, one row of panels per sweep;
    error bars and shaded bands: the 95 % intervals."""
    fig, axes = plt.subplots(len(sweeps), 2, figsize=(11, 3.8 * len(sweeps)), squeeze=False,
                             layout="constrained")
    for (label, rows, refs), (ax_t, ax_c) in zip(sweeps, axes):
        for ax, key, what in [(ax_t, "step_s", "step time"), (ax_c, "exposed_comm_s", "exposed comm")]:
            sweep_panel(ax, rows, refs, key, what)
            ax.set_title(f"{label}: {what}", fontsize=10)
            ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def median_curve(r):
    """The median over runs of each step's loss (steps every run has)."""
    curves = [m["loss_curve"] for _, m in sorted(r["runs"].items()) if m.get("loss_curve")]
    if not curves:
        return []
    return [statistics.median(c[i] for c in curves) for i in range(min(map(len, curves)))]


def plot_loss(plt, rows, path):
    """Loss against step, one line per variant (the median over its runs), one panel per model."""
    ok = measured(rows)
    models = list(dict.fromkeys(r["model"] for r in ok))
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 3.8 * len(models)), squeeze=False,
                             layout="constrained")
    styles, markers = ["-", "--", ":", "-."], "os^vDx+"
    for ax, model in zip(axes[:, 0], models):
        for i, r in enumerate(r for r in ok if r["model"] == model):
            curve = median_curve(r)  # equal losses (every strategy's) draw over one another:
            ax.plot(range(1, len(curve) + 1), curve, styles[i % len(styles)],  # styles tell them
                    marker=markers[i % len(markers)], ms=max(2, 9 - i), fillstyle="none",
                    color=f"C{i % 10}", label=f"{r['variant']} (world {r['world']})")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (median over runs)")
        ax.set_title(f"{model}: loss per step")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)
    plt.close(fig)


def plot_val_bytes(plt, rows, path):
    """Held-out loss against MB sent per rank so far, at each evaluated step (val_points of each
    variant's first run), one line per variant (line style by strategy), one panel per model;
    x on a log scale where every point is above 0."""
    ok = evaluated(rows)
    models = list(dict.fromkeys(r["model"] for r in ok))
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 4.2 * len(models)), squeeze=False,
                             layout="constrained")
    styles, markers = ["-", "--", ":", "-."], "os^vDxP*"
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in ok if r["model"] == model]
        strategies = list(dict.fromkeys(r["strategy"] for r in mine))
        xs_all = []
        for i, r in enumerate(mine):
            xs, ys = zip(*val_points(first_run(r)))
            xs_all += xs
            ax.plot(xs, ys, styles[strategies.index(r["strategy"]) % len(styles)],
                    marker=markers[i % len(markers)], ms=5, color=f"C{i % 10}", label=r["variant"])
        if min(xs_all) > 0:
            ax.set_xscale("log")
        worlds = "/".join(map(str, sorted({r["world"] for r in mine})))
        ax.set_xlabel("MB sent per rank so far" + (" (log scale)" if min(xs_all) > 0 else ""))
        ax.set_ylabel("held-out loss")
        ax.set_title(f"{model}, world {worlds}: held-out loss vs bytes sent (first run)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(fig, path)
    plt.close(fig)


def write_results(plt, out, rows, title, command, sweeps):
    """Every output file into the directory `out`; returns the plots' file names. A plot that
    has nothing to show is removed (a previous run's would not match the tables)."""
    plots = []
    have = bool(measured(rows))
    for name, alt, make, data in [
            ("step_breakdown.png", "step time breakdown per variant", plot_breakdown, rows if have else None),
            ("loss_vs_step.png", "loss per step per variant", plot_loss, rows if have else None),
            ("bucket_sweep.png", "step time and exposed communication vs bucket size", plot_sweeps,
             sweeps or None),
            ("val_loss_vs_bytes.png", "held-out loss vs MB sent per rank", plot_val_bytes,
             rows if evaluated(rows) else None)]:
        if data:
            make(plt, data, out / name)
            plots.append((name, alt))
        else:
            (out / name).unlink(missing_ok=True)
    write_atomically(out / "results.csv", csv_text(rows))
    write_atomically(out / "runs.csv", runs_csv_text(rows))
    write_atomically(out / "results.md", markdown(rows, title, command, plots))
    return [name for name, _ in plots]
