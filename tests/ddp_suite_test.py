#!/usr/bin/python3
"""tests/ddp_suite_test.py — unit tests of tools/ddp_suite.py's pure parts and of its modules
tools/suite_stats.py and tools/suite_report.py, without running ddp: suite parsing and checks,
repeats and their schedule, pytorch variants' options and refusals, statistics against closed
forms, number formatting, runs to figures, paired speed-ups, bucket sweeps, tables and plots,
held-out loss against bytes sent.
ctest runs it as `ddp_suite_unit`; by hand: /usr/bin/python3 tests/ddp_suite_test.py [-v]
"""
import contextlib
import csv
import io
import math
import os
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ddp_suite as S  # noqa: E402
import suite_report as R  # noqa: E402
from suite_stats import Stat, fmt_stat, ratio_stat, sig, summarize, t975, t_interval  # noqa: E402


def summary(steps=(1.0, 0.5, 0.25), world=2, opt_state=(100, 60), loss=None, samples=20):
    """A summary.json as the engine writes it (the fields the runner reads)."""
    n = len(steps)
    mean = sum(steps) / n
    return {
        "world_size": world, "strategy": "naive",
        "step_time_s": list(steps), "forward_s": [0.1] * n, "backward_s": [0.2] * n,
        "optimizer_s": [0.05] * n, "comm_blocked_s": [s / 10 for s in steps], "comm_busy_s": [0.3] * n,
        "collectives": [3] * n, "comm_bytes": [3400] * n, "bus_bytes": [3400] * n,
        "loss": list(loss) if loss else [2.0 - 0.1 * i for i in range(n)],
        "mean_step_time_s": mean, "samples_per_s": samples / mean,
        "peak_bytes": {p: {"total": 1024 * 1024 * (i + 1)} for i, p in enumerate(R.PHASES)},
        "ranks": [{"rank": r, "peak_bytes": {"parameters": 10, "gradients": 10, "optimizer_state": o,
                                             "comm_buffers": 0, "activations": 5}}
                  for r, o in enumerate(opt_state)],
    }


def torch_result(steps=(1.0, 0.5, 0.25)):
    """tools/pytorch_ddp_bench.py's JSON (the fields the runner reads)."""
    n = len(steps)
    return {"impl": "pytorch-ddp", "torch": "1.13", "step_time_s": list(steps),
            "loss": [2.0] * n, "forward_s": [0.1] * n, "backward_s": [0.3] * n, "optimizer_s": [0.05] * n,
            "unit": "tokens", "units_per_step": 2048}


class Files:
    """Writes files under a temporary directory."""

    def __init__(self, test):
        tmp = tempfile.TemporaryDirectory()
        test.addCleanup(tmp.cleanup)
        self.dir = Path(tmp.name)

    def write(self, name, text):
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p


BASE = """[run]
steps = 5
world_size = 2
[model]
name = "toy"
[data]
path = "../tests/fixtures/toy_data.safetensors"
batch_size = 20
[optimizer]
name = "sgd"
lr = 0.1
[strategy]
plugin = "bucketed"
[strategy.bucketed]
bucket_mb = 8
"""

LM = """[run]
world_size = 2
steps = 6
threads = 1
output_dir = "runs/x"
[model]
name = "lm"
preset = "lm-cpu"
[data]
kind = "random"
batch_size = 16
[optimizer]
name = "adamw"
lr = 1e-3
weight_decay = 0.01
[strategy]
plugin = "bucketed"
[strategy.bucketed]
bucket_mb = 8
"""


class SuiteFiles(unittest.TestCase):
    def setUp(self):
        self.f = Files(self)
        self.f.write("configs/base.toml", BASE)
        self.f.write("configs/lm.toml", LM)

    def load(self, text, name="suites/s.toml"):
        return S.load_suite(self.f.write(name, text), root=self.f.dir)

    def error(self, text, pattern):
        with self.assertRaisesRegex(S.SuiteError, pattern):
            self.load(text)


class TomlValueTest(unittest.TestCase):
    def test_values_round_trip_through_toml(self):
        for v in [1, -3, 0.001, 1e-8, 2.5e10, True, False, "naive", 'a "quoted" \\ path/ü',
                  [0.9, 0.95], [], [{"params": "layers.*", "lr": 0.1}], {"a": 1}]:
            self.assertEqual(tomllib.loads("x = " + S.toml_value(v))["x"], v, v)

    def test_other_types_are_refused(self):
        with self.assertRaisesRegex(S.SuiteError, "where: a NoneType"):
            S.toml_value(None, "where")


class FlattenTest(unittest.TestCase):
    def test_nested_and_dotted_forms(self):
        self.assertEqual(S.flatten_overrides({"run": {"steps": 3}, "strategy.bucket_mb": 1}, "w"),
                         {"run.steps": 3, "strategy.bucket_mb": 1})

    def test_a_plugin_table_key(self):
        self.assertEqual(S.flatten_overrides({"strategy": {"bucketed": {"bucket_mb": 4}},
                                              "transport.gloo.algorithm": "ring"}, "w"),
                         {"strategy.bucketed.bucket_mb": 4, "transport.gloo.algorithm": "ring"})

    def test_refusals_name_the_key(self):
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.a\.b' is a table"):
            S.flatten_overrides({"a": {"b": {"c": 1}}}, "w")
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.steps': expected section\.key"):
            S.flatten_overrides({"steps": 1}, "w")
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.run\.a\.b': expected section\.key"):
            S.flatten_overrides({"run.a.b": 1}, "w")
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.run\.output_dir': set by the runner"):
            S.flatten_overrides({"run": {"output_dir": "x"}}, "w")


class LoadSuiteTest(SuiteFiles):
    def test_overrides_layer_suite_then_short_keys_then_set(self):
        title, vs = self.load('description = "T"\nbase = "configs/base.toml"\n'
                              '[set]\nrun.steps = 4\nstrategy.bucket_mb = 2\n'
                              '[[variant]]\nname = "a"\nstrategy = "flat"\nworld_size = 4\n'
                              '[[variant]]\nname = "b"\nsteps = 9\nset.strategy.bucket_mb = 1\n'
                              'set."model.preset" = "x"\n')
        self.assertEqual(title, "T")
        self.assertEqual([v.name for v in vs], ["a", "b"])
        self.assertEqual(vs[0].overrides, {"run.steps": 4, "strategy.bucket_mb": 2, "strategy.plugin": "flat",
                                           "run.world_size": 4})
        self.assertEqual(vs[1].overrides, {"run.steps": 9, "strategy.bucket_mb": 1, "model.preset": "x"})
        self.assertEqual(vs[0].base, (self.f.dir / "configs/base.toml").resolve())  # from the root
        self.assertEqual((vs[0].warmup, vs[0].repeats, vs[0].kind), (2, 3, "ddp"))

    def test_base_relative_to_the_suite_file_first(self):
        self.f.write("suites/base.toml", BASE.replace("steps = 5", "steps = 7"))
        _, vs = self.load('base = "base.toml"\nwarmup = 0\nrepeats = 1\n[[variant]]\nname = "a"\n')
        self.assertEqual(vs[0].base, (self.f.dir / "suites/base.toml").resolve())
        self.assertEqual(vs[0].setting("run.steps"), 7)
        self.assertEqual((vs[0].warmup, vs[0].repeats), (0, 1))

    def test_naming_a_plugin_runs_the_base_as_it_is(self):
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "n"\nstrategy = "naive"\n'
                          '[[variant]]\nname = "b"\nset.strategy.bucket_mb = 2\n'
                          '[[variant]]\nname = "t"\nset.strategy.bucketed.bucket_mb = 3\n')
        n, b, t = vs
        self.assertEqual(S.ddp_command("/bin/ddp", n, Path("/o/n/r1")),
                         ["/bin/ddp", "run", str(n.base), "--set", 'strategy.plugin="naive"',
                          "--set", 'run.output_dir="/o/n/r1"'])
        self.assertEqual(S.plugin_keys(n.config(), "strategy", "naive"), {})  # bucketed's table: not naive's
        self.assertEqual(S.plugin_keys(b.config(), "strategy", "naive", b.overrides.items()), {"bucket_mb": 2})
        self.assertEqual(S.plugin_keys(t.config(), "strategy", "naive", t.overrides.items()), {"bucket_mb": 3})
        self.assertEqual(t.setting("strategy.bucketed.bucket_mb"), 3)
        self.assertEqual(n.setting("strategy.bucketed.bucket_mb"), 8)

    def test_effective_config_paths_are_absolute(self):
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "a"\n')
        c = vs[0].config()
        self.assertEqual(c["data"]["path"], str(self.f.dir / "tests/fixtures/toy_data.safetensors"))
        self.assertEqual(c["strategy"], {"plugin": "bucketed", "bucketed": {"bucket_mb": 8}})

    def test_plugin_keys_direct_and_by_path(self):
        c = {"strategy": {"plugin": "/x/libddp_strategy_mine.so", "k": 1, "mine": {"j": 2}, "other": {"z": 3}}}
        self.assertEqual(S.plugin_name(c, "strategy", "naive"), "mine")
        self.assertEqual(S.plugin_keys(c, "strategy", "naive"), {"k": 1, "j": 2})
        self.assertEqual(S.plugin_keys(c, "strategy", "naive", [("strategy.mine.k", 5)]), {"k": 5, "j": 2})

    def test_a_variant_may_have_its_own_base(self):
        self.f.write("configs/other.toml", BASE.replace("steps = 5", "steps = 9"))
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "a"\n'
                          '[[variant]]\nname = "b"\nbase = "configs/other.toml"\n')
        self.assertEqual([v.setting("run.steps") for v in vs], [5, 9])

    def test_include_prefixes_names_and_keeps_their_settings(self):
        self.f.write("suites/inner.toml", 'base = "configs/base.toml"\nwarmup = 1\nrepeats = 5\n'
                                          '[[variant]]\nname = "a"\n')
        _, vs = self.load('include = ["inner.toml"]\nbase = "configs/base.toml"\n[[variant]]\nname = "a"\n')
        self.assertEqual([(v.name, v.warmup, v.repeats) for v in vs], [("a", 2, 3), ("inner/a", 1, 5)])

    def test_refusals_name_file_and_key(self):
        base = 'base = "configs/base.toml"\n'
        for text, pattern in [
                (base + 'warmpu = 1\n[[variant]]\nname = "a"\n', r"s\.toml: unknown key 'warmpu'"),
                ('[[variant]]\nname = "a"\n', r"s\.toml: variant 'a': no 'base'"),
                ('[[variant]]\nname = "a"\nbase = "x.toml"\n', r"variant 'a': key 'base': 'x\.toml' not found"),
                ('base = "nope.toml"\n[[variant]]\nname = "a"\n', r"s\.toml: key 'base': 'nope\.toml' not found"),
                (base, r"s\.toml: no \[\[variant\]\] and no 'include'"),
                (base + '[[variant]]\nname = "a"\n[[variant]]\nname = "a"\n', r"variant name 'a' is used twice"),
                (base + '[[variant]]\nname = "a b"\n', r"variant\[0\]: key 'name'"),
                (base + '[[variant]]\nname = "a"\nbucket_mb = 1\n', r"variant 'a': unknown key 'bucket_mb'"),
                (base + '[[variant]]\nname = "a"\nstrategy = "x"\nset.strategy.plugin = "y"\n',
                 r"variant 'a': 'strategy\.plugin' is set twice"),
                (base + 'warmup = 5\n[[variant]]\nname = "a"\n', r"variant 'a': run\.steps = 5 leaves no step"),
                (base + 'warmup = -1\n[[variant]]\nname = "a"\n', r"key 'warmup' must be an integer >= 0"),
                (base + 'repeats = 0\n[[variant]]\nname = "a"\n', r"s\.toml: key 'repeats' must be an integer >= 1"),
                (base + 'repeats = 2.5\n[[variant]]\nname = "a"\n', r"key 'repeats'"),
                (base + '[[variant]]\nname = "a"\nkind = "jax"\n', r"variant 'a': key 'kind' must be one of ddp, pytorch"),
                (base + '[[variant]]\nname = "a"\nset.run.output_dir = "x"\n',
                 r"s\.toml: variant 'a': key 'set\.run\.output_dir': set by the runner"),
                (base + '[[variant]\n', r"s\.toml: .*line 2"),
                ('include = ["s.toml"]\n', r"includes itself")]:
            self.error(text, pattern)

    def test_select_by_glob(self):
        _, vs = self.load('base = "configs/base.toml"\n' +
                          "".join(f'[[variant]]\nname = "{n}"\n' for n in ["b-1", "b-10", "naive"]))
        self.assertEqual([v.name for v in S.select(vs, ["b-*"])], ["b-1", "b-10"])
        self.assertEqual([v.name for v in S.select(vs, ["naive", "b-1"])], ["b-1", "naive"])
        self.assertEqual(S.select(vs, None), vs)
        with self.assertRaisesRegex(S.SuiteError, "--only x: no such variant"):
            S.select(vs, ["x"])

    def test_command(self):
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "a"\nstrategy = "sharded"\n'
                          'set.strategy.variant = "allgather"\nset.strategy.sharded.bucket_mb = 0.5\n')
        cmd = S.ddp_command("/bin/ddp", vs[0], Path("/o/a/r2"))
        self.assertEqual(cmd, ["/bin/ddp", "run", str(vs[0].base), "--set", 'strategy.plugin="sharded"',
                               "--set", 'strategy.variant="allgather"', "--set", "strategy.sharded.bucket_mb=0.5",
                               "--set", 'run.output_dir="/o/a/r2"'])


class ScheduleTest(SuiteFiles):
    def test_rounds_rotate_and_respect_each_variants_repeats(self):
        self.f.write("suites/inner.toml", 'base = "configs/base.toml"\nrepeats = 1\n[[variant]]\nname = "c"\n')
        _, vs = self.load('base = "configs/base.toml"\nrepeats = 3\ninclude = ["inner.toml"]\n'
                          '[[variant]]\nname = "a"\n[[variant]]\nname = "b"\n')
        order = [(k, v.name) for k, v in S.schedule(vs)]
        self.assertEqual(order, [(1, "a"), (1, "b"), (1, "inner/c"), (2, "b"), (2, "a"), (3, "a"), (3, "b")])
        order = [(k, v.name) for k, v in S.schedule(vs, 2)]
        self.assertEqual(order, [(1, "a"), (1, "b"), (1, "inner/c"), (2, "b"), (2, "inner/c"), (2, "a")])


class PytorchVariantTest(SuiteFiles):
    def test_lm_options_from_the_effective_config(self):
        _, vs = self.load('base = "configs/lm.toml"\n[set]\nrun.steps = 6\n'
                          '[[variant]]\nname = "p"\nkind = "pytorch"\nset.model.d_model = 128\n'
                          '[[variant]]\nname = "q"\nkind = "pytorch"\nset.strategy.bucket_mb = 10\nworld_size = 4\n')
        p, q = vs
        self.assertEqual(S.pytorch_args(p), {
            "model": "lm", "preset": "lm-cpu", "d-model": 128, "optimizer": "adamw", "lr": 1e-3,
            "weight-decay": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "world": 2, "batch": 8,
            "warmup": 2, "steps": 4, "threads": 1, "seed": 0, "device": "cpu", "bucket-cap-mb": 25.0})
        self.assertEqual((S.pytorch_args(q)["bucket-cap-mb"], S.pytorch_args(q)["batch"]), (10.0, 4))
        cmd = S.pytorch_command("/usr/bin/python3", p)
        self.assertEqual(cmd[:2], ["/usr/bin/python3", str(ROOT / "tools" / "pytorch_ddp_bench.py")])
        self.assertEqual(cmd[cmd.index("--steps") + 1], "4")
        row = S.variant_row(q)
        self.assertEqual((row["strategy"], row["strategy_keys"], row["world"], row["bucket_mb"]),
                         ("pytorch", "bucket_cap_mb=10", 4, None))

    def test_mlp_with_sgd(self):
        self.f.write("configs/mlp.toml", '[run]\nsteps = 4\nworld_size = 2\n[model]\nname = "mlp"\nwidth = 64\n'
                                         '[data]\nbatch_size = 8\n[optimizer]\nname = "sgd"\nlr = 0.01\n'
                                         'momentum = 0.9\n')
        _, vs = self.load('base = "configs/mlp.toml"\nwarmup = 1\n[[variant]]\nname = "p"\nkind = "pytorch"\n')
        a = S.pytorch_args(vs[0])
        self.assertEqual({k: a[k] for k in ["model", "width", "optimizer", "momentum", "weight-decay", "batch",
                                            "warmup", "steps"]},
                         {"model": "mlp", "width": 64, "optimizer": "sgd", "momentum": 0.9, "weight-decay": 0.0,
                          "batch": 4, "warmup": 1, "steps": 3})

    def test_what_it_cannot_reproduce_is_refused_by_name(self):
        p = '[[variant]]\nname = "p"\nkind = "pytorch"\n'
        lm = 'base = "configs/lm.toml"\n'
        for text, pattern in [
                ('base = "configs/base.toml"\n' + p, r"variant 'p': kind = \"pytorch\": model 'toy' has no PyTorch twin"),
                (lm + p + 'set.data.path = "x.bin"\n', r"variant 'p': .*cannot reproduce 'data\.path'"),
                (lm + p + 'set.run.grad_accum_steps = 2\n', r"run\.grad_accum_steps must be 1"),
                (lm + p + 'set.optimizer.clip_grad_norm = 1.0\n', r"cannot reproduce 'optimizer\.clip_grad_norm'"),
                (lm + p + 'set.model.freeze = ["x"]\n', r"cannot reproduce 'model\.freeze'"),
                (lm + p + 'set.schedule.lr = "cosine"\n', r"cannot reproduce \[schedule\]"),
                (lm + p + 'strategy = "naive"\n', r"no strategy\.plugin"),
                (lm + p + 'set.data.batch_size = 15\n', r"batch_size = 15 does not divide by world 2"),
                (lm + p + 'set.strategy.bucket_mb = "auto"\n', r"strategy\.bucket_mb .* must be a number"),
                (lm + p + 'set.strategy.compress = "bf16"\n', r"cannot reproduce 'strategy\.compress' = 'bf16'"),
                (lm + p + 'set.optimizer.name = "lion"\n', r"optimizer 'lion'")]:
            self.error(text, pattern)


class StatsTest(unittest.TestCase):
    def test_t_quantiles(self):
        self.assertEqual([t975(d) for d in [1, 2, 4, 30, 35, 60, 200, 5000]],
                         [12.7062, 4.3027, 2.7764, 2.0423, 2.0423, 2.0003, 1.9799, 1.96])
        with self.assertRaises(ValueError):
            t975(0)

    def test_t_interval_closed_form(self):
        low, high = t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, n = 3
        self.assertAlmostEqual(low, 2 - 4.3027 / math.sqrt(3))
        self.assertAlmostEqual(high, 2 + 4.3027 / math.sqrt(3))
        low, high = t_interval([4.0, 6.0])  # mean 5, s = sqrt(2), n = 2
        self.assertAlmostEqual(high - 5, 12.7062 * math.sqrt(2) / math.sqrt(2))
        self.assertEqual(t_interval([3.0]), (None, None))

    def test_summarize(self):
        s = summarize([3.0, 1.0, 2.0, None])
        self.assertEqual((s.median, s.n), (2.0, 3))
        self.assertAlmostEqual(s.low, 2 - 4.3027 / math.sqrt(3))
        self.assertEqual(summarize([5.0]), Stat(5.0, None, None, 1))
        self.assertIsNone(summarize([None]))
        self.assertEqual(summarize([2.0, 2.0]), Stat(2.0, 2.0, 2.0, 2))

    def test_ratio_interval_is_on_the_logs(self):
        s = ratio_stat([1.0, 2.0, 4.0])  # logs 0, ln 2, 2 ln 2: mean ln 2, s = ln 2
        half = 4.3027 * math.log(2) / math.sqrt(3)
        self.assertEqual(s.median, 2.0)
        self.assertAlmostEqual(s.low, 2 * math.exp(-half))
        self.assertAlmostEqual(s.high, 2 * math.exp(half))
        self.assertEqual(ratio_stat([1.5]), Stat(1.5, None, None, 1))

    def test_sig(self):
        self.assertEqual([sig(x) for x in [712.4, 45.27, 1.0, 0.05, 0.001234, 0, None, math.nan]],
                         ["712", "45.3", "1.00", "0.0500", "0.00123", "0", "—", "—"])

    def test_fmt_stat_rounds_where_the_interval_puts_it(self):
        cases = [(Stat(939.4, 912.1, 966.8), "939 [912, 967]"),     # half 27: two digits of it
                 (Stat(107.3, 101.9, 112.7), "107 [102, 113]"),     # half 5.4: one digit
                 (Stat(1.163, 1.04, 1.28), "1.16 [1.04, 1.28]"),
                 (Stat(10180, 9910, 10450), "10180 [9910, 10450]"),
                 (Stat(939.4, 870, 1010), "940 [870, 1010]"),       # half 70: tens
                 (Stat(0.42, 0.001, 3426.6), "0.42 [0.00, 3426.60]"),  # two digits of the median at least
                 (Stat(2.0, -0.48, 4.48), "2.0 [-0.5, 4.5]"),
                 (Stat(5.0, 5.0, 5.0), "5.00"), (Stat(939.4), "939"), (None, "—")]
        for s, text in cases:
            self.assertEqual(fmt_stat(s), text, s)
        self.assertEqual(fmt_stat(Stat(9.23184567), 5), "9.2318")
        self.assertEqual(fmt_stat(Stat(6.0, 6.0, 6.0), integer=True), "6")


class MeasureTest(unittest.TestCase):
    def test_means_skip_warmup(self):
        m = S.measure(summary(steps=(1.0, 0.5, 0.25), loss=(3.0, 2.0, 1.5)), warmup=1)
        self.assertAlmostEqual(m["step_s"], 0.375)
        self.assertAlmostEqual(m["exposed_comm_s"], 0.0375)
        self.assertAlmostEqual(m["comm_fraction"], 0.1)
        self.assertEqual(m["timed_steps"], 2)
        self.assertEqual((m["loss"], m["loss_curve"]), (1.5, [3.0, 2.0, 1.5]))
        self.assertAlmostEqual(m["throughput"], 20 / 0.375)
        self.assertEqual(m["unit"], "samples")
        self.assertAlmostEqual(m["mb_sent"], 0.0034)
        self.assertEqual(m["peak_optimizer_state_bytes"], 100)  # the highest rank
        self.assertEqual(m["rank0_before_optimizer_step_bytes"], 2 * 1024 * 1024)

    def test_auto_bucket_choice_from_strategy_stats(self):
        s = summary()
        s["strategy_stats"] = {"bucket_mb": "auto", "auto": {"chosen_bucket_mb": 3.5}}
        self.assertEqual(S.measure(s, 0)["chosen_bucket_mb"], 3.5)

    def test_a_pytorch_run_measures_less(self):
        m = S.measure(torch_result(), 1, "pytorch")
        self.assertAlmostEqual(m["step_s"], 0.375)
        self.assertAlmostEqual(m["backward_s"], 0.3)
        self.assertEqual((m["unit"], m["throughput"]), ("tokens", 2048 / 0.375))
        for k in ["exposed_comm_s", "comm_fraction", "collectives", "mb_sent", "peak_parameters_bytes"]:
            self.assertIsNone(m.get(k), k)
        r = torch_result()
        r["forward_s"] = None  # a cuda run
        self.assertIsNone(S.measure(r, 1, "pytorch")["forward_s"])

    def test_eval_and_bytes_per_step(self):
        s = summary(steps=(1.0,) * 4)
        s["bus_bytes"] = [0, 100, 0, 100]
        s["eval"] = {"every": 2, "batches": 1, "after_steps": [2, 4], "val_loss": [3.0, 2.5]}
        m = S.measure(s, 1)
        self.assertEqual((m["eval_steps"], m["val_curve"], m["val_loss"]), ([2, 4], [3.0, 2.5], 2.5))
        self.assertEqual(m["bus_curve"], [0, 100, 0, 100])
        m = S.measure(summary(), 1)  # no [eval]
        self.assertEqual((m["eval_steps"], m["val_curve"], m["val_loss"]), ([], [], None))
        s["eval"]["val_loss"] = [3.0]  # lengths differ: nothing
        self.assertEqual(S.eval_points(s), ([], []))

    def test_missing_fields_and_short_runs_are_errors(self):
        s = summary()
        del s["forward_s"]
        with self.assertRaisesRegex(ValueError, "no per-step 'forward_s'"):
            S.measure(s, 1)
        with self.assertRaisesRegex(ValueError, "3 steps .* not more than warmup = 3"):
            S.measure(summary(), 3)
        s = summary()
        del s["ranks"][1]["peak_bytes"]["activations"]
        with self.assertRaisesRegex(ValueError, "no 'activations'"):
            S.measure(s, 1)
        s = summary()
        del s["loss"]
        with self.assertRaisesRegex(ValueError, "no per-step 'loss'"):
            S.measure(s, 1)


def row_of(v, runs, kind=None):
    """A variant's row after its runs: runs = [summary or torch_result per run]."""
    row = S.variant_row(v)
    for k, data in enumerate(runs, 1):
        row["runs"][k] = dict(S.measure(data, 0, v.kind), seconds=1.0)
    return S.aggregate(row)


class RowsTest(SuiteFiles):
    def variants(self, extra=""):
        _, vs = self.load('base = "configs/lm.toml"\nwarmup = 0\n'
                          '[[variant]]\nname = "n"\nstrategy = "naive"\n'
                          '[[variant]]\nname = "b"\nstrategy = "bucketed"\n'
                          '[[variant]]\nname = "b4"\nstrategy = "bucketed"\nworld_size = 4\n'
                          '[[variant]]\nname = "p"\nkind = "pytorch"\n' + extra)
        return {v.name: v for v in vs}

    def test_paired_speedups_against_naive_and_pytorch(self):
        vs = self.variants()
        rows = [row_of(vs["n"], [summary(steps=(s,)) for s in (2.0, 4.0, 2.0)]),
                row_of(vs["b"], [summary(steps=(s,)) for s in (1.0, 1.0, 2.0)]),
                row_of(vs["b4"], [summary(steps=(1.0,))] * 3),
                row_of(vs["p"], [torch_result(steps=(s,)) for s in (4.0, 4.0, 4.0)])]
        S.add_speedups(rows)
        n, b, b4, p = rows
        self.assertEqual((n["speedup"].median, n["speedup"].low, n["speedup"].high), (1.0, 1.0, 1.0))
        self.assertEqual(b["speedup"], ratio_stat([2.0, 4.0, 1.0]))  # run k against run k
        self.assertIsNone(b4["speedup"])  # world 4 has no naive
        self.assertEqual(b["speedup_pytorch"], ratio_stat([4.0, 4.0, 2.0]))
        self.assertEqual(p["speedup"], ratio_stat([0.5, 1.0, 0.5]))
        self.assertEqual(p["speedup_pytorch"].median, 1.0)
        self.assertEqual((b["model"], b["strategy_keys"], b["bucket_mb"]), ("lm lm-cpu", "bucket_mb=8", 8))
        self.assertEqual((n["n"], n["stats"]["step_s"].median, n["unit"]), (3, 2.0, "samples"))

    def test_no_speedup_when_config_or_suite_differs(self):
        vs = self.variants('[[variant]]\nname = "o"\nstrategy = "overlap"\nset.optimizer.lr = 0.1\n')
        rows = [row_of(vs["n"], [summary()]), row_of(vs["o"], [summary()])]
        S.add_speedups(rows)
        self.assertIsNone(rows[1]["speedup"])
        rows = [row_of(vs["n"], [summary()]), row_of(vs["b"], [summary()])]
        rows[1]["suite"] = "other.toml"  # an included suite compares with its own naive
        S.add_speedups(rows)
        self.assertIsNone(rows[1]["speedup"])

    def test_a_failed_variant_has_no_figures(self):
        vs = self.variants()
        rows = [row_of(vs["n"], [summary()]), row_of(vs["b"], [])]
        rows[1].update(status="failed", error="run 1/3: exit 1: no", failed_run=1)
        S.add_speedups(rows)
        self.assertEqual((rows[1]["n"], rows[1]["speedup"], rows[1]["stats"]["step_s"]), (0, None, None))

    def test_bucket_sweeps(self):
        _, vs = self.load('base = "configs/lm.toml"\nwarmup = 0\n' + "".join(
            f'[[variant]]\nname = "b{mb}"\nstrategy = "bucketed"\nset.strategy.bucket_mb = {S.toml_value(mb)}\n'
            for mb in [100, 1, "auto", 10]) +
            '[[variant]]\nname = "w4"\nstrategy = "bucketed"\nworld_size = 4\n'
            '[[variant]]\nname = "n"\nstrategy = "naive"\n[[variant]]\nname = "p"\nkind = "pytorch"\n')
        rows = [row_of(v, [torch_result() if v.kind == "pytorch" else summary()]) for v in vs]
        sweeps = S.bucket_sweeps(rows)
        self.assertEqual(len(sweeps), 1)  # world 4 has one size only
        label, members, others = sweeps[0]
        self.assertEqual(label, "lm lm-cpu, bucketed, world 2")
        self.assertEqual([r["bucket_mb"] for r in members], [1, 10, 100])
        self.assertEqual([r["variant"] for r in others], ["bauto", "n", "p"])  # same model and world


class OutputTest(SuiteFiles):
    def rows(self, n=3):
        _, vs = self.load('base = "configs/lm.toml"\nwarmup = 0\n'
                          '[[variant]]\nname = "naive"\nstrategy = "naive"\n'
                          '[[variant]]\nname = "b"\nstrategy = "bucketed"\nset.strategy.bucket_mb = 1\n'
                          '[[variant]]\nname = "b2"\nstrategy = "bucketed"\nset.strategy.bucket_mb = 2\n'
                          '[[variant]]\nname = "pytorch"\nkind = "pytorch"\n'
                          '[[variant]]\nname = "bad"\nstrategy = "nosuch"\n')
        steps = [(0.9, 1.0, 1.1), (0.45, 0.5, 0.55), (0.5, 0.5, 0.5), (1.9, 2.0, 2.1)]
        rows = [row_of(v, [torch_result(steps=(s,)) if v.kind == "pytorch" else summary(steps=(s,))
                           for s in ss[:n]]) for v, ss in zip(vs, steps)]
        rows.append(row_of(vs[4], []))
        rows[4].update(status="failed", error="run 2/3: exit 1: ddp: error: no such plugin", failed_run=2)
        return S.add_speedups(rows)

    def test_markdown(self):
        md = R.markdown(self.rows(), "T", "tools/ddp_suite.py x.toml", [("p.png", "alt")])
        head, *body = [l for l in md.splitlines() if l.startswith("| ")][:6]
        cols = [c.strip() for c in head.strip("|").split("|")]
        self.assertEqual(cols, ["variant", "strategy (keys)", "world", "n", "step ms", "speed-up vs naive",
                                "speed-up vs PyTorch", "samples/s", "final loss", "collectives/step",
                                "MB sent/rank/step"])
        cells = [[c.strip() for c in l.strip("|").split("|")] for l in body]
        self.assertEqual(cells[0][:6], ["naive", "naive", "2", "3", "1000 [750, 1250]", "1.00"])
        self.assertEqual(cells[1][1], "bucketed (bucket_mb=1)")
        self.assertEqual(cells[1][5], "2.00")  # every pair 2: an interval of width 0
        self.assertEqual(cells[2][4], "500")
        self.assertEqual(cells[3][:2], ["pytorch", "PyTorch DDP (bucket_cap_mb=25)"])
        self.assertEqual(cells[3][6:], ["1.00", "—", "2.0000", "—", "—"])  # samples/s: the JSON's unit is tokens
        self.assertEqual(cells[0][8:], ["2.0000", "3", "0.00340"])
        self.assertEqual(cells[4][:5], ["bad", "nosuch", "2", "0", "**failed**"])
        self.assertIn("- `bad`: run 2/3: exit 1: ddp: error: no such plugin", md)
        self.assertIn("95 % confidence interval", md)
        self.assertIn("| pytorch | 100 | 300 | 50.0 | — | — | — |", md)
        self.assertIn("![alt](p.png)", md)
        one = R.markdown(self.rows(n=1), "T", "c", [])
        self.assertIn("n = 1, no interval", one)
        naive = [l for l in one.splitlines() if l.startswith("| naive |")]
        self.assertEqual(naive[0].split(" | ")[4], "900")  # one run: no interval
        self.assertNotIn("[", "".join(naive))

    def test_csv_files(self):
        rows = list(csv.DictReader(io.StringIO(R.csv_text(self.rows()))))
        self.assertEqual([r["status"] for r in rows], ["ok", "ok", "ok", "ok", "failed"])
        self.assertEqual((rows[0]["step_s"], rows[0]["n"]), ("1.0", "3"))
        self.assertAlmostEqual(float(rows[0]["step_s_high"]), 1 + 4.3027 * 0.1 / math.sqrt(3))
        self.assertEqual(float(rows[1]["speedup_vs_naive"]), 2.0)
        self.assertEqual(float(rows[1]["speedup_vs_pytorch"]), 4.0)
        self.assertEqual((rows[3]["collectives"], rows[3]["throughput_unit"]), ("", "tokens"))
        self.assertEqual(rows[4]["step_s"], "")
        runs = list(csv.DictReader(io.StringIO(R.runs_csv_text(self.rows()))))
        self.assertEqual([(r["variant"], r["run"], r["status"]) for r in runs][:3],
                         [("naive", "1", "ok"), ("naive", "2", "ok"), ("naive", "3", "ok")])
        self.assertEqual((runs[-1]["variant"], runs[-1]["run"], runs[-1]["status"]), ("bad", "2", "failed"))
        self.assertEqual(float(runs[1]["step_s"]), 1.0)

    def test_plots_are_png_files(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        with tempfile.TemporaryDirectory() as d:
            rows = self.rows()
            sweeps = S.bucket_sweeps(rows)
            self.assertEqual([len(sweeps[0][1]), len(sweeps[0][2])], [2, 2])  # naive, pytorch
            plots = R.write_results(plt, Path(d), rows, "T", "c", sweeps)
            self.assertEqual(plots, ["step_breakdown.png", "loss_vs_step.png", "bucket_sweep.png"])
            for name in plots:
                self.assertEqual((Path(d) / name).read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertEqual(sorted(os.listdir(d)), sorted(plots + ["results.csv", "results.md", "runs.csv"]))
            R.write_results(plt, Path(d), rows[:1], "T", "c", [])
            self.assertFalse((Path(d) / "bucket_sweep.png").exists())  # a previous run's is removed


class EvalTest(SuiteFiles):
    def rows(self):
        """bucketed (sends every step), localsgd period 2 and diloco period 4, each evaluated after
        steps 4 and 8, and a pytorch row (no bytes, no eval)."""
        _, vs = self.load('base = "configs/lm.toml"\nwarmup = 2\nrepeats = 1\n'
                          '[[variant]]\nname = "b"\nstrategy = "bucketed"\n'
                          '[[variant]]\nname = "l2"\nstrategy = "localsgd"\nset.strategy.localsgd.period = 2\n'
                          '[[variant]]\nname = "d4"\nstrategy = "diloco"\nset.strategy.diloco.period = 4\n'
                          '[[variant]]\nname = "p"\nkind = "pytorch"\n')
        rows = []
        for v, period, losses in zip(vs, [1, 2, 4], [(3.0, 2.0), (3.5, 2.5), (3.2, 2.2)]):
            s = summary(steps=(1.0,) * 8)
            s["bus_bytes"] = [2_000_000 if k % period == 0 else 0 for k in range(1, 9)]
            s["eval"] = {"every": 4, "batches": 1, "after_steps": [4, 8], "val_loss": list(losses)}
            rows.append(row_of(v, [s]))
        return S.add_speedups(rows + [row_of(vs[3], [torch_result()])])

    def test_points_are_cumulative_mb_at_the_evaluated_steps(self):
        b, l2, d4, p = self.rows()
        self.assertEqual(R.val_points(R.first_run(b)), [(8.0, 3.0), (16.0, 2.0)])
        self.assertEqual(R.val_points(R.first_run(l2)), [(4.0, 3.5), (8.0, 2.5)])
        self.assertEqual(R.val_points(R.first_run(d4)), [(2.0, 3.2), (4.0, 2.2)])
        self.assertEqual(R.val_points(R.first_run(p)), [])
        self.assertEqual(R.val_points({"bus_curve": [1e6], "eval_steps": [2], "val_curve": [1.0]}), [])
        self.assertEqual([r["variant"] for r in R.evaluated([b, l2, d4, p])], ["b", "l2", "d4"])

    def test_fractions_of_bucketed_over_every_step(self):
        rows = self.rows()
        # over every step: d4 sends in 2 of 8 (after a warm-up of 2 it would be 2 of 6)
        self.assertEqual(R.bytes_fractions(rows), {"b": 1.0, "l2": 0.5, "d4": 0.25, "p": None})
        self.assertEqual((R.fraction_text(0.125), R.fraction_text(1.0), R.fraction_text(None)),
                         ("0.125 (1/8.00)", "1.00", "—"))
        rows[0]["suite"] = "other.toml"  # no bucketed of the same suite file: no fraction
        self.assertEqual(R.bytes_fractions(rows), {"b": 1.0, "l2": None, "d4": None, "p": None})

    def test_table_and_plot(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = self.rows()
        md = R.markdown(rows, "T", "c", [])
        self.assertIn("bytes sent per step as a fraction of the bucketed variant's", md)
        self.assertIn("| d4 | diloco (period=4) | 0.250 (1/4.00) | 4.00 | 2.2000 | 4, 8 |", md)
        self.assertIn("| b | bucketed (bucket_mb=8) | 1.00 | 16.0 | 2.0000 | 4, 8 |", md)
        self.assertEqual(float(list(csv.DictReader(io.StringIO(R.csv_text(rows))))[1]["val_loss"]), 2.5)
        with tempfile.TemporaryDirectory() as d:
            plots = R.write_results(plt, Path(d), rows, "T", "c", [])
            self.assertIn("val_loss_vs_bytes.png", plots)
            self.assertEqual((Path(d) / "val_loss_vs_bytes.png").read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
            R.write_results(plt, Path(d), rows[3:], "T", "c", [])  # pytorch alone: no eval
            self.assertFalse((Path(d) / "val_loss_vs_bytes.png").exists())


class MainTest(unittest.TestCase):
    def run_main(self, *args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = S.main(list(args))
        return rc, err.getvalue()

    def test_bad_input_exits_2_naming_it(self):
        f = Files(self)
        suite = f.write("s.toml", 'base = "configs/toy.toml"\n[[variant]]\nname = "a"\nworld = 2\n')
        rc, err = self.run_main(str(suite))
        self.assertEqual(rc, 2)
        self.assertIn(f"{suite}: variant 'a': unknown key 'world'", err)
        suite = f.write("t.toml", 'base = "configs/toy.toml"\n[[variant]]\nname = "a"\n')
        rc, err = self.run_main(str(suite), "--ddp", str(f.dir / "nope"))
        self.assertEqual(rc, 2)
        self.assertIn("--ddp: ", err)
        self.assertIn("is not an executable", err)
        rc, err = self.run_main(str(suite), "--repeats", "0")
        self.assertEqual((rc, "--repeats must be >= 1" in err), (2, True))


if __name__ == "__main__":
    unittest.main()
