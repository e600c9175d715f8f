#!/usr/bin/python3
"""tests/ddp_suite_run_test.py — tools/ddp_suite.py end to end on a tiny suite: `toy` on 2
ranks, variants naive and bucketed, 3 steps, into a temporary directory; then the same with a
variant whose strategy plugin does not exist. Checks the exit status, the files, and the rows of
results.md and results.csv. About 5 s.
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

SUITE = """description = "toy smoke"
base = "configs/toy.toml"
warmup = 1
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


def table_rows(md):
    """Cells of the first Markdown table's body rows."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| variant |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return lines[start], rows


class SuiteRunTest(unittest.TestCase):
    def run_suite(self, text):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = Path(tmp.name)
        (d / "suite.toml").write_text(text)
        p = subprocess.run(["/usr/bin/python3", str(ROOT / "tools" / "ddp_suite.py"), str(d / "suite.toml"),
                            "--out", str(d / "out"), "--ddp", DDP], capture_output=True, text=True, timeout=120)
        return p, d / "out"

    def test_two_variants(self):
        p, out = self.run_suite(SUITE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("[1/2] naive", p.stdout)
        self.assertIn("[2/2] bucketed: step ", p.stdout)
        for name in ["results.csv", "results.md", "step_breakdown.png"]:
            self.assertGreater((out / name).stat().st_size, 0, name)
        self.assertEqual((out / "step_breakdown.png").read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
        self.assertFalse((out / "bucket_sweep.png").exists())  # one bucket size: no sweep
        self.assertFalse((out / "naive" / "weights.safetensors").exists())
        self.assertTrue((out / "naive" / "summary.json").is_file())

        head, rows = table_rows((out / "results.md").read_text())
        cols = head.strip("|").split("|")
        col = {c.strip(): i for i, c in enumerate(cols)}
        self.assertEqual([(r[0], r[1], r[2]) for r in rows],
                         [("naive", "naive", "2"), ("bucketed", "bucketed (bucket_mb=0.001)", "2")])
        for r in rows:
            step = float(r[col["step ms"]])
            self.assertTrue(math.isfinite(step) and step > 0, r)
        self.assertEqual(rows[0][col["speed-up vs naive"]], "1.00")
        self.assertGreater(float(rows[1][col["speed-up vs naive"]]), 0)
        self.assertGreater(float(rows[1][col["comm buf MiB"]]), 0)  # bucketed keeps a bucket buffer
        self.assertEqual(rows[0][col["comm buf MiB"]], "0")

        csv_rows = list(csv.DictReader((out / "results.csv").open()))
        self.assertEqual([(r["variant"], r["status"], r["strategy"]) for r in csv_rows],
                         [("naive", "ok", "naive"), ("bucketed", "ok", "bucketed")])
        for r in csv_rows:
            self.assertTrue(0 < float(r["step_s"]) < 10, r)
            self.assertEqual(r["timed_steps"], "2")
            self.assertEqual(r["world"], "2")
        self.assertEqual(float(csv_rows[0]["speedup"]), 1.0)
        self.assertEqual(csv_rows[1]["collectives"], "3.0")  # toy's 3 parameters in 0.001 MiB buckets

    def test_a_failed_variant_is_reported_and_the_rest_go_on(self):
        p, out = self.run_suite(SUITE.replace('[[variant]]\nname = "bucketed"',
                                              '[[variant]]\nname = "bad"\nstrategy = "nosuch"\n'
                                              '[[variant]]\nname = "bucketed"'))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("[2/3] bad: FAILED", p.stdout)
        self.assertIn("libddp_strategy_nosuch.so", p.stderr)  # its error tail
        self.assertIn("[3/3] bucketed: step ", p.stdout)
        md = (out / "results.md").read_text()
        _, rows = table_rows(md)
        self.assertEqual([(r[0], r[1], r[3]) for r in rows][1], ("bad", "nosuch", "**failed**"))
        self.assertEqual([r[0] for r in rows], ["naive", "bad", "bucketed"])
        self.assertGreater(float(rows[2][3]), 0)
        self.assertRegex(md, r"- `bad`: exit 1: .*libddp_strategy_nosuch\.so")
        csv_rows = list(csv.DictReader((out / "results.csv").open()))
        self.assertEqual([r["status"] for r in csv_rows], ["ok", "failed", "ok"])
        self.assertIn("nosuch", csv_rows[1]["error"])


if __name__ == "__main__":
    unittest.main()
