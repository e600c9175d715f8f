#!/usr/bin/python3
"""tests/ddp_suite_run_test.py — tools/ddp_suite.py end to end on tiny suites, into temporary
directories: `toy` on 2 ranks, variants naive and bucketed, 3 steps, 2 runs each; the same with a
variant whose strategy plugin does not exist; and a small mlp with a `pytorch` variant (PyTorch's
DDP, python3-torch) beside naive. Checks the exit status, the schedule, the files, and the rows of
results.md, results.csv and runs.csv. About 25 s.
ctest runs it as `ddp_suite_run` with DDP_BIN set; by hand:
  DDP_BIN=build/bin/ddp /usr/bin/python3 tests/ddp_suite_run_test.py [-v]
"""
import csv
import math
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = os.environ.get("DDP_BIN", str(ROOT / "build" / "bin" / "ddp"))
PNG = b"\x89PNG\r\n\x1a\n"

SUITE = """description = "toy smoke"
base = "configs/toy.toml"
warmup = 1
repeats = 2
[set]
run.steps = 3
run.world_size = 2
[[variant]]
name = "naive"
strategy = "naive"
[[variant]]
name = "bucketed"
strategy = "bucketed"
set.strategy.bucket_mb = 0.001
"""

TORCH_SUITE = """description = "mlp against PyTorch"
base = "configs/mlp.toml"
warmup = 1
repeats = 2
[set]
run.steps = 3
model.width = 32
model.depth = 2
data.batch_size = 8
[[variant]]
name = "naive"
strategy = "naive"
[[variant]]
name = "pytorch"
kind = "pytorch"
"""


def table_rows(md):
    """Header and cells of the first Markdown table's body rows."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| variant |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    cols = [c.strip() for c in lines[start].strip("|").split("|")]
    return {c: i for i, c in enumerate(cols)}, rows


class SuiteRunTest(unittest.TestCase):
    def run_suite(self, text, *args):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = Path(tmp.name)
        (d / "suite.toml").write_text(text)
        p = subprocess.run(["/usr/bin/python3", str(ROOT / "tools" / "ddp_suite.py"), str(d / "suite.toml"),
                            "--out", str(d / "out"), "--ddp", DDP, *args], capture_output=True, text=True,
                           timeout=100)
        return p, d / "out"

    def test_two_variants_twice(self):
        p, out = self.run_suite(SUITE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for line in ["[1/4] naive, run 1/2 (naive, world 2) ...", "[2/4] bucketed, run 1/2: step ",
                     "[3/4] bucketed, run 2/2", "[4/4] naive, run 2/2: step "]:  # round 2 rotated
            self.assertIn(line, p.stdout)
        for name in ["results.csv", "results.md", "runs.csv"]:
            self.assertGreater((out / name).stat().st_size, 0, name)
        for name in ["step_breakdown.png", "loss_vs_step.png"]:
            self.assertEqual((out / name).read_bytes()[:8], PNG, name)
        self.assertFalse((out / "bucket_sweep.png").exists())  # one bucket size: no sweep
        for k in [1, 2]:
            self.assertTrue((out / "naive" / f"r{k}" / "summary.json").is_file())
            self.assertFalse((out / "naive" / f"r{k}" / "weights.safetensors").exists())

        col, rows = table_rows((out / "results.md").read_text())
        self.assertEqual([(r[0], r[1], r[2], r[3]) for r in rows],
                         [("naive", "naive", "2", "2"), ("bucketed", "bucketed (bucket_mb=0.001)", "2", "2")])
        for r in rows:
            step = float(r[col["step ms"]].split(" [")[0])
            self.assertTrue(math.isfinite(step) and step > 0, r)
            self.assertIn(" [", r[col["step ms"]])  # two runs: an interval
            self.assertRegex(r[col["final loss"]], r"^\d\.\d+$")  # the same in both runs: no interval
        self.assertEqual(rows[0][col["speed-up vs naive"]], "1.00")
        self.assertEqual(rows[1][col["collectives/step"]], "3")  # toy's 3 parameters in 0.001 MiB buckets
        self.assertNotIn("speed-up vs PyTorch", col)

        csv_rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
        self.assertEqual([(r["variant"], r["status"], r["strategy"], r["n"]) for r in csv_rows],
                         [("naive", "ok", "naive", "2"), ("bucketed", "ok", "bucketed", "2")])
        for r in csv_rows:
            self.assertTrue(float(r["step_s_low"]) <= float(r["step_s_high"]), r)
            self.assertTrue(0 < float(r["step_s"]) < 10, r)
            self.assertEqual((r["timed_steps"], r["world"], r["throughput_unit"]), ("2", "2", "samples"))
        self.assertEqual(float(csv_rows[0]["speedup_vs_naive"]), 1.0)
        runs = list(csv.DictReader((out / "runs.csv").read_text().splitlines()))
        self.assertEqual(sorted((r["variant"], r["run"]) for r in runs),
                         [("bucketed", "1"), ("bucketed", "2"), ("naive", "1"), ("naive", "2")])

    def test_a_failed_variant_is_reported_and_the_rest_go_on(self):
        p, out = self.run_suite(SUITE.replace('[[variant]]\nname = "bucketed"',
                                              '[[variant]]\nname = "bad"\nstrategy = "nosuch"\n'
                                              '[[variant]]\nname = "bucketed"'))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("[2/6] bad, run 1/2: FAILED", p.stdout)
        self.assertIn("[4/6] bad, run 2/2: skipped", p.stdout)
        self.assertIn("libddp_strategy_nosuch.so", p.stderr)  # its error tail
        self.assertIn("[3/6] bucketed, run 1/2: step ", p.stdout)
        md = (out / "results.md").read_text()
        col, rows = table_rows(md)
        self.assertEqual([r[0] for r in rows], ["naive", "bad", "bucketed"])
        self.assertEqual((rows[1][1], rows[1][col["step ms"]]), ("nosuch", "**failed**"))
        self.assertRegex(md, r"- `bad`: run 1/2: exit 1: .*libddp_strategy_nosuch\.so")
        csv_rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
        self.assertEqual([r["status"] for r in csv_rows], ["ok", "failed", "ok"])
        self.assertIn("nosuch", csv_rows[1]["error"])

    def test_against_pytorch(self):
        p, out = self.run_suite(TORCH_SUITE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("[2/4] pytorch, run 1/2 (pytorch, world 2) ...", p.stdout)
        self.assertTrue((out / "pytorch" / "r2" / "pytorch.json").is_file())
        self.assertTrue((out / "pytorch" / "r2" / "pytorch.log").read_text().startswith("$ /usr/bin/python3 "))
        col, rows = table_rows((out / "results.md").read_text())
        self.assertEqual([(r[0], r[1]) for r in rows],
                         [("naive", "naive"), ("pytorch", "PyTorch DDP (bucket_cap_mb=25)")])
        naive, torch = rows
        self.assertEqual(torch[col["speed-up vs PyTorch"]], "1.00")
        self.assertGreater(float(naive[col["speed-up vs PyTorch"]].split(" [")[0]), 0)
        self.assertEqual([torch[col[c]] for c in ["collectives/step", "MB sent/rank/step"]], ["—", "—"])
        self.assertAlmostEqual(float(torch[col["final loss"]].split(" [")[0]), math.log(10), delta=0.5)
        self.assertGreater(float(torch[col["samples/s"]].split(" [")[0]), 0)
        csv_rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
        self.assertEqual((csv_rows[1]["kind"], csv_rows[1]["n"], csv_rows[1]["exposed_comm_s"]), ("pytorch", "2", ""))
        self.assertGreater(float(csv_rows[1]["forward_s"]), 0)


if __name__ == "__main__":
    unittest.main()
