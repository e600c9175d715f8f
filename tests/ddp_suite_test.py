#!/usr/bin/python3
"""tests/ddp_suite_test.py — unit tests of tools/ddp_suite.py's pure parts (suite parsing and
checks, summaries to rows, speed-ups, bucket sweeps, tables, plots), without running ddp.
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


def summary(strategy="naive", world=2, steps=(1.0, 0.5, 0.25), config=None, opt_state=(100, 60)):
    """A summary.json as the engine writes it (the fields the runner reads)."""
    n = len(steps)
    return {
        "world_size": world, "strategy": strategy,
        "step_time_s": list(steps), "forward_s": [0.1] * n, "backward_s": [0.2] * n,
        "optimizer_s": [0.05] * n, "comm_blocked_s": [s / 10 for s in steps], "comm_busy_s": [0.3] * n,
        "collectives": [3] * n, "comm_bytes": [3400] * n,
        "peak_bytes": {p: {"total": 1024 * 1024 * (i + 1)} for i, p in enumerate(S.PHASES)},
        "ranks": [{"rank": r, "peak_bytes": {"parameters": 10, "gradients": 10, "optimizer_state": o,
                                             "comm_buffers": 0, "activations": 5}}
                  for r, o in enumerate(opt_state)],
        "config": config if config is not None else
        f'[run]\nworld_size = {world}\nsteps = {n}\n[model]\nname = "mlp"\n'
        f'[strategy]\nplugin = "{strategy}"\n',
    }


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
bucket_mb = 8
"""


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

    def test_refusals_name_the_key(self):
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.a\.b' is a table"):
            S.flatten_overrides({"a": {"b": {"c": 1}}}, "w")
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.steps': expected section\.key"):
            S.flatten_overrides({"steps": 1}, "w")
        with self.assertRaisesRegex(S.SuiteError, r"^w: key 'set\.run\.output_dir': set by the runner"):
            S.flatten_overrides({"run": {"output_dir": "x"}}, "w")


class LoadSuiteTest(unittest.TestCase):
    def setUp(self):
        self.f = Files(self)
        self.f.write("configs/base.toml", BASE)

    def load(self, text, name="suites/s.toml"):
        return S.load_suite(self.f.write(name, text), root=self.f.dir)

    def error(self, text, pattern):
        with self.assertRaisesRegex(S.SuiteError, pattern):
            self.load(text)

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
        self.assertEqual(vs[0].warmup, 2)

    def test_base_relative_to_the_suite_file_first(self):
        self.f.write("suites/base.toml", BASE.replace("steps = 5", "steps = 7"))
        _, vs = self.load('base = "base.toml"\nwarmup = 0\n[[variant]]\nname = "a"\n')
        self.assertEqual(vs[0].base, (self.f.dir / "suites/base.toml").resolve())
        self.assertEqual(vs[0].setting("run.steps"), 7)
        self.assertEqual(vs[0].warmup, 0)

    def test_naming_a_plugin_drops_the_base_plugin_keys(self):
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "n"\nstrategy = "naive"\n'
                          '[[variant]]\nname = "keep"\nworld_size = 1\n')
        n, keep = vs
        self.assertTrue(n.rewrite_base)
        self.assertIsNone(n.setting("strategy.bucket_mb"))
        self.assertFalse(keep.rewrite_base)
        self.assertEqual(keep.setting("strategy.bucket_mb"), 8)
        text = S.base_text(n)
        config = tomllib.loads(text)
        self.assertEqual(config["strategy"], {"plugin": "bucketed"})
        self.assertEqual(config["data"]["path"], str((self.f.dir / "tests/fixtures/toy_data.safetensors")))
        self.assertEqual(config["optimizer"], {"name": "sgd", "lr": 0.1})

    def test_plugin_tables_stay_when_a_variant_names_a_plugin(self):
        self.f.write("configs/tables.toml", BASE.replace("bucket_mb = 8", "bucket_mb = 8\n[strategy.sharded]\n"
                                                         "variant = \"allgather\""))
        _, vs = self.load('base = "configs/tables.toml"\n[[variant]]\nname = "s"\nstrategy = "sharded"\n')
        self.assertTrue(vs[0].rewrite_base)  # bucket_mb, directly under [strategy], was the base plugin's
        config = tomllib.loads(S.base_text(vs[0]))
        self.assertEqual(config["strategy"], {"plugin": "bucketed", "sharded": {"variant": "allgather"}})

    def test_a_variant_may_have_its_own_base(self):
        self.f.write("configs/other.toml", BASE.replace("steps = 5", "steps = 9"))
        _, vs = self.load('base = "configs/base.toml"\n[[variant]]\nname = "a"\n'
                          '[[variant]]\nname = "b"\nbase = "configs/other.toml"\n')
        self.assertEqual([v.setting("run.steps") for v in vs], [5, 9])

    def test_include_prefixes_names_and_keeps_their_settings(self):
        self.f.write("suites/inner.toml", 'base = "configs/base.toml"\nwarmup = 1\n[[variant]]\nname = "a"\n')
        _, vs = self.load('include = ["inner.toml"]\nbase = "configs/base.toml"\n[[variant]]\nname = "a"\n')
        self.assertEqual([(v.name, v.warmup) for v in vs], [("a", 2), ("inner/a", 1)])

    def test_refusals_name_file_and_key(self):
        self.error('base = "configs/base.toml"\nwarmpu = 1\n[[variant]]\nname = "a"\n',
                   r"s\.toml: unknown key 'warmpu'")
        self.error('[[variant]]\nname = "a"\n', r"s\.toml: variant 'a': no 'base'")
        self.error('[[variant]]\nname = "a"\nbase = "x.toml"\n', r"s\.toml: variant 'a': key 'base': 'x\.toml' not found")
        self.error('base = "nope.toml"\n[[variant]]\nname = "a"\n', r"s\.toml: key 'base': 'nope\.toml' not found")
        self.error('base = "configs/base.toml"\n', r"s\.toml: no \[\[variant\]\] and no 'include'")
        self.error('base = "configs/base.toml"\n[[variant]]\nname = "a"\n[[variant]]\nname = "a"\n',
                   r"variant name 'a' is used twice")
        self.error('base = "configs/base.toml"\n[[variant]]\nname = "a b"\n', r"variant\[0\]: key 'name'")
        self.error('base = "configs/base.toml"\n[[variant]]\nname = "a"\nbucket_mb = 1\n',
                   r"variant 'a': unknown key 'bucket_mb'")
        self.error('base = "configs/base.toml"\n[[variant]]\nname = "a"\nstrategy = "x"\n'
                   'set.strategy.plugin = "y"\n', r"variant 'a': 'strategy\.plugin' is set twice")
        self.error('base = "configs/base.toml"\nwarmup = 5\n[[variant]]\nname = "a"\n',
                   r"variant 'a': run\.steps = 5 leaves no step after warmup = 5")
        self.error('base = "configs/base.toml"\nwarmup = -1\n[[variant]]\nname = "a"\n', r"key 'warmup'")
        self.error('base = "configs/base.toml"\n[[variant]]\nname = "a"\nset.run.output_dir = "x"\n',
                   r"s\.toml: variant 'a': key 'set\.run\.output_dir': set by the runner")
        self.error('base = "configs/base.toml"\n[[variant]\n', r"s\.toml: .*line 2")
        self.error('include = ["s.toml"]\n', r"includes itself")

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
                          'set.strategy.variant = "allgather"\nset.strategy.bucket_mb = 0.5\n')
        cmd = S.ddp_command("/bin/ddp", vs[0], Path("/o/a"), Path("/o/a/base.toml"))
        self.assertEqual(cmd, ["/bin/ddp", "run", "/o/a/base.toml", "--set", 'strategy.plugin="sharded"',
                               "--set", 'strategy.variant="allgather"', "--set", "strategy.bucket_mb=0.5",
                               "--set", 'run.output_dir="/o/a"'])


class RowsTest(unittest.TestCase):
    def test_means_skip_warmup(self):
        r = S.row_from_summary(summary(steps=(1.0, 0.5, 0.25)), warmup=1)
        self.assertAlmostEqual(r["step_s"], 0.375)
        self.assertAlmostEqual(r["exposed_comm_s"], 0.0375)
        self.assertAlmostEqual(r["comm_fraction"], 0.1)
        self.assertEqual(r["timed_steps"], 2)
        self.assertEqual(r["peak_optimizer_state_bytes"], 100)  # the highest rank
        self.assertEqual(r["rank0_before_optimizer_step_bytes"], 2 * 1024 * 1024)
        self.assertEqual(r["model"], "mlp 1024x8")

    def test_auto_bucket_choice_from_strategy_stats(self):
        s = summary(strategy="bucketed")
        s["strategy_stats"] = {"bucket_mb": "auto", "auto": {"chosen_bucket_mb": 3.5}}
        self.assertEqual(S.row_from_summary(s, 0)["chosen_bucket_mb"], 3.5)

    def test_missing_fields_and_short_runs_are_errors(self):
        s = summary()
        del s["forward_s"]
        with self.assertRaisesRegex(ValueError, "no per-step 'forward_s'"):
            S.row_from_summary(s, 1)
        with self.assertRaisesRegex(ValueError, "3 steps .* not more than warmup = 3"):
            S.row_from_summary(summary(), 3)
        s = summary()
        del s["ranks"][1]["peak_bytes"]["activations"]
        with self.assertRaisesRegex(ValueError, "no 'activations'"):
            S.row_from_summary(s, 1)

    def row(self, name, **kw):
        r = S.row_from_summary(summary(**kw), 0)
        r["variant"] = name
        return r

    def test_speedup_against_naive_of_the_same_model_and_world(self):
        rows = [self.row("n", steps=(2.0,)), self.row("b", strategy="bucketed", steps=(0.5,)),
                self.row("b4", strategy="bucketed", world=4, steps=(0.5,)),
                {"variant": "x", "status": "failed", "strategy": "x", "world": 2}]
        S.add_speedups(rows)
        self.assertEqual([r["speedup"] for r in rows], [1.0, 4.0, None, None])

    def test_no_speedup_when_config_or_suite_differs(self):
        other = '[run]\nworld_size = 2\n[model]\nname = "mlp"\n[optimizer]\nname = "adamw"\n'
        rows = [self.row("n"), self.row("o", strategy="overlap", config=other)]
        S.add_speedups(rows)
        self.assertIsNone(rows[1]["speedup"])
        rows = [self.row("n", steps=(2.0,)), self.row("n2", steps=(1.0,)),
                self.row("o", strategy="overlap", steps=(1.0,))]
        rows[1]["suite"] = rows[2]["suite"] = "b.toml"  # an included suite compares with its own naive
        S.add_speedups(rows)
        self.assertEqual([r["speedup"] for r in rows], [1.0, 1.0, 1.0])

    def test_bucket_sweeps(self):
        def b(mb, steps, world=2):
            c = f'[run]\nworld_size = {world}\n[model]\nname = "mlp"\n[strategy]\nplugin = "bucketed"\n' \
                f'bucket_mb = {S.toml_value(mb)}\n'
            return self.row(f"b{mb}", strategy="bucketed", steps=(steps,), config=c, world=world)
        rows = [b(100, 0.3), b(1, 0.5), b("auto", 0.2), b(10, 0.4), b(1, 0.5, world=4), self.row("n")]
        self.assertIsNone(rows[0]["chosen_bucket_mb"])
        sweeps = S.bucket_sweeps(rows)
        self.assertEqual(len(sweeps), 1)  # world 4 has one size only
        label, members, others = sweeps[0]
        self.assertEqual(label, "mlp 1024x8, bucketed, world 2")
        self.assertEqual([r["bucket_mb"] for r in members], [1, 10, 100])
        self.assertEqual([r["variant"] for r in others], ["bauto", "n"])  # and naive, same model


class OutputTest(unittest.TestCase):
    def test_sig(self):
        self.assertEqual([S.sig(x) for x in [712.4, 45.27, 1.0, 0.05, 0.001234, 0, None, math.nan]],
                         ["712", "45.3", "1.00", "0.0500", "0.00123", "0", "—", "—"])

    def rows(self):
        n = S.row_from_summary(summary(), 1)
        b = S.row_from_summary(summary(strategy="bucketed", steps=(1.0, 0.25, 0.25)), 1)
        n.update(variant="naive", seconds=1.0)
        b.update(variant="b", seconds=1.0)
        bad = {"variant": "bad", "status": "failed", "strategy": "nosuch", "world": 2,
               "error": "exit 1: ddp: error: no such plugin", "seconds": 0.1}
        return S.add_speedups([n, b, bad])

    def test_markdown_and_csv(self):
        md = S.markdown(self.rows(), "T", "note", "tools/ddp_suite.py x.toml", [("p.png", "alt")])
        table = [l for l in md.splitlines() if l.startswith("| ") and "variant" not in l]
        self.assertEqual(table[0].split(" | ")[:4], ["| naive", "naive", "2", "375"])
        self.assertEqual(table[0].split(" | ")[10], "1.00")
        self.assertEqual(table[1].split(" | ")[10], "1.50")
        self.assertEqual(table[2].split(" | ")[:4], ["| bad", "nosuch", "2", "**failed**"])
        self.assertIn("- `bad`: exit 1: ddp: error: no such plugin", md)
        self.assertIn("![alt](p.png)", md)
        rows = list(csv.DictReader(io.StringIO(S.csv_text(self.rows()))))
        self.assertEqual([r["status"] for r in rows], ["ok", "ok", "failed"])
        self.assertEqual(float(rows[0]["speedup"]), 1.0)
        self.assertEqual(rows[2]["step_s"], "")

    def test_plots_are_png_files(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        with tempfile.TemporaryDirectory() as d:
            S.plot_breakdown(plt, self.rows(), Path(d) / "a.png")
            sums = [summary(strategy="bucketed", steps=(s,), config=(
                f'[model]\nname = "toy"\n[strategy]\nplugin = "bucketed"\nbucket_mb = {mb}\n'))
                for mb, s in [(1, 0.5), (10, 0.3), ('"auto"', 0.2)]]
            sums[2]["strategy_stats"] = {"auto": {"chosen_bucket_mb": 4.0}}
            rows = [S.row_from_summary(x, 0) | {"variant": f"v{i}"} for i, x in enumerate(sums)]
            sweeps = S.bucket_sweeps(rows)
            self.assertEqual([len(sweeps[0][1]), len(sweeps[0][2])], [2, 1])
            S.plot_sweeps(plt, sweeps, Path(d) / "b.png")
            for name in ["a.png", "b.png"]:
                self.assertEqual((Path(d) / name).read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
            self.assertEqual(sorted(os.listdir(d)), ["a.png", "b.png"])  # no temporary left


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


if __name__ == "__main__":
    unittest.main()
