#!/usr/bin/python3
"""tests/blas_kernel_test.py — how `ddp run` picks OpenBLAS's GEMM kernel (engine/blas/blas_choice.h),
through the runs' summary.json ("blas": the kernel rank 0 loaded and how it was chosen):
  - OPENBLAS_CORETYPE in the environment is kept; run.blas_kernel names one;
  - "auto" measures once (the candidates timed, written to the cache under DDP_CACHE_DIR) and the
    ranks load the fastest; the next run takes it from the cache without measuring;
  - a cache that is not JSON is measured over; an unknown key value is refused naming it.
About 20 s. ctest runs it as `blas_kernel` with DDP_BIN set; by hand:
  DDP_BIN=build/bin/ddp /usr/bin/python3 tests/blas_kernel_test.py [-v]
"""
import json
import os
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = os.environ.get("DDP_BIN", str(ROOT / "build" / "bin" / "ddp"))
MLP = ["configs/mlp.toml", "--set", "model.width=64", "--set", "model.depth=2", "--set", "run.world_size=1",
       "--set", "run.steps=1", "--set", "data.batch_size=8"]
AVX2 = "avx2" in Path("/proc/cpuinfo").read_text()


class BlasKernel(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.cache = os.path.join(self.tmp.name, "cache")
        self.env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "DDP_BLAS_CHOICE")}
        self.env["DDP_CACHE_DIR"] = self.cache

    def tearDown(self):
        self.tmp.cleanup()

    def run_ddp(self, *sets, env=None, ok=True):
        out = os.path.join(self.tmp.name, "run")
        args = [DDP, "run", *MLP, *[a for s in sets for a in ("--set", s)], "--set", f'run.output_dir="{out}"']
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env or self.env)
        if not ok:
            return p
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            return p, json.load(f)["blas"]

    @unittest.skipUnless(AVX2, "this CPU lacks AVX2: Haswell's kernel cannot run")
    def test_the_environment_is_kept(self):
        _, blas = self.run_ddp(env=dict(self.env, OPENBLAS_CORETYPE="Haswell"))
        self.assertEqual(blas["kernel"], "Haswell")
        self.assertEqual(blas["choice"]["source"], "environment")
        self.assertFalse(os.path.exists(self.cache), "measured although the environment named a kernel")

    def test_the_key_names_one(self):
        _, blas = self.run_ddp('run.blas_kernel="Sandybridge"')
        self.assertEqual(blas["kernel"], "Sandybridge")
        self.assertEqual((blas["choice"]["kernel"], blas["choice"]["source"]), ("Sandybridge", "config"))

    def test_auto_measures_once_then_uses_the_cache(self):
        p, blas = self.run_ddp()
        self.assertIn("choosing the BLAS kernel", p.stderr)
        self.assertEqual(blas["choice"]["source"], "measured")
        timings = blas["choice"]["timings_s"]
        self.assertIn("default", timings)
        chosen = blas["choice"]["kernel"]
        self.assertEqual(timings[chosen], min(timings.values()))
        if chosen != "default":
            self.assertEqual(blas["kernel"].lower(), chosen.lower())
        with open(os.path.join(self.cache, "blas-kernel.json")) as f:
            cached = json.load(f)
        # One machine, one set of GEMM shapes (this model's), its choice.
        self.assertEqual([e["kernel"] for machine in cached.values() for e in machine.values()], [chosen])
        p, again = self.run_ddp()
        self.assertNotIn("choosing the BLAS kernel", p.stderr)
        self.assertEqual((again["choice"]["source"], again["choice"]["kernel"]), ("cache", chosen))

    def test_a_broken_cache_is_measured_over(self):
        os.makedirs(self.cache)
        Path(self.cache, "blas-kernel.json").write_text("not json")
        _, blas = self.run_ddp()
        self.assertEqual(blas["choice"]["source"], "measured")

    def test_a_cache_of_wrong_types_is_measured_over(self):
        self.run_ddp()
        path = Path(self.cache, "blas-kernel.json")
        cached = json.loads(path.read_text())
        for machine in cached.values():
            for entry in machine.values():
                entry["kernel"], entry["gflop"] = 5, "many"
        path.write_text(json.dumps(cached))
        _, blas = self.run_ddp()
        self.assertEqual(blas["choice"]["source"], "measured")
        for machine in json.loads(path.read_text()).values():
            for entry in machine.values():
                self.assertIsInstance(entry["kernel"], str)

    def test_a_stop_signal_while_probing_stops_the_probe_and_says_so(self):
        # A model whose GEMMs take a while to time, and a tag to find the probes by.
        env = dict(self.env, DDP_TEST_PROBE_TAG=self.tmp.name)
        out = os.path.join(self.tmp.name, "run")
        args = [DDP, "run", *MLP, "--set", "model.width=2048", "--set", "data.batch_size=256", "--set",
                f'run.output_dir="{out}"']
        p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = ""
        while "choosing the BLAS kernel" not in first:
            line = p.stderr.readline()
            self.assertNotEqual(line, "", first)
            first += line
        time.sleep(0.5)
        p.send_signal(signal.SIGTERM)
        err = first + p.stderr.read()
        p.stderr.close()
        self.assertEqual(p.wait(timeout=30), 1, err)
        self.assertRegex(err, r"ddp: error: interrupted by SIGTERM while choosing the BLAS kernel: the probe of "
                              r"\S+ was stopped, and no rank started")
        time.sleep(0.5)
        left = []
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and ("DDP_TEST_PROBE_TAG=" + self.tmp.name).encode() in \
                        Path("/proc", pid, "environ").read_bytes().split(b"\0"):
                    left.append(pid)
            except OSError:
                pass
        self.assertEqual(left, [], "a probe outlived its launcher")

    def test_an_unknown_kernel_is_refused(self):
        p = self.run_ddp('run.blas_kernel="Pentium"', ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("key 'run.blas_kernel' must be one of: auto, default, Sandybridge, Haswell, Zen, SkylakeX, "
                      "Cooperlake (got 'Pentium')", p.stderr)


if __name__ == "__main__":
    unittest.main()
