#!/usr/bin/python3
"""tests/huge_pages_run_test.py — `ddp` asks glibc's malloc for transparent huge pages
(engine/core/huge_pages.h), seen through a run's summary.json ("huge_pages"):
  - by default (and with DDP_HUGE_PAGES=0) the environment is left alone (in "madvise" mode: no
    huge page at all);
  - with DDP_HUGE_PAGES=1 every rank runs with glibc.malloc.hugetlb=1, and where the kernel gives
    huge pages on request (THP mode "madvise" or "always") the run's memory is on them;
  - a glibc.malloc.hugetlb the user set in GLIBC_TUNABLES is kept;
  - a rank started without the tunable (by hand, as mpirun or srun start them) but with
    DDP_HUGE_PAGES=1 starts itself again with it, and a restart's mark inherited from elsewhere
    changes nothing.
About 10 s. ctest runs it as `huge_pages_run` with DDP_BIN set; by hand:
  DDP_BIN=build/bin/ddp /usr/bin/python3 tests/huge_pages_run_test.py [-v]
"""
import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = os.environ.get("DDP_BIN", str(ROOT / "build" / "bin" / "ddp"))
# 4 MiB weight matrices: glibc maps each on its own, where huge pages can back it.
MLP = ["configs/mlp.toml", "--set", "model.width=1024", "--set", "model.depth=2", "--set", "run.world_size=1",
       "--set", "run.steps=1", "--set", "data.batch_size=8"]
ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MODE = ENABLED.read_text().split("[")[1].split("]")[0] if ENABLED.exists() else "unavailable"


class HugePages(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("GLIBC_TUNABLES", "DDP_HUGE_PAGES", "DDP_HUGE_PAGES_RESTARTED")}

    def tearDown(self):
        self.tmp.cleanup()

    def huge_pages(self, **env):
        out = os.path.join(self.tmp.name, "run")
        p = subprocess.run([DDP, "run", *MLP, "--set", f'run.output_dir="{out}"'], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=dict(self.env, **env))
        return self.summary(p, out)

    def summary(self, p, out):
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["huge_pages"]

    def test_on_with_ddp_huge_pages_1(self):
        h = self.huge_pages(DDP_HUGE_PAGES="1")
        self.assertEqual(h["malloc_hugetlb"], "1")
        self.assertEqual(h["transparent_huge_pages"], MODE)
        if MODE in ("madvise", "always"):
            self.assertGreaterEqual(h["anon_huge_bytes"], 2 << 20, h)

    def test_off_by_default_and_with_ddp_huge_pages_0(self):
        for env in ({}, {"DDP_HUGE_PAGES": "0"}):
            h = self.huge_pages(**env)
            self.assertEqual(h["malloc_hugetlb"], "", env)
            if MODE == "madvise":
                self.assertEqual(h["anon_huge_bytes"], 0, (env, h))

    def test_the_users_setting_is_kept(self):
        self.assertEqual(self.huge_pages(GLIBC_TUNABLES="glibc.malloc.hugetlb=0", DDP_HUGE_PAGES="1")["malloc_hugetlb"],
                         "0")
        self.assertEqual(self.huge_pages(GLIBC_TUNABLES="glibc.malloc.hugetlb=1")["malloc_hugetlb"], "1")
        self.assertEqual(self.huge_pages(GLIBC_TUNABLES="glibc.malloc.arena_max=2", DDP_HUGE_PAGES="1")["malloc_hugetlb"],
                         "1")

    def test_an_inherited_restart_mark_changes_nothing(self):
        self.assertEqual(self.huge_pages(DDP_HUGE_PAGES_RESTARTED="1")["malloc_hugetlb"], "")
        self.assertEqual(self.huge_pages(DDP_HUGE_PAGES_RESTARTED="1", DDP_HUGE_PAGES="1")["malloc_hugetlb"], "1")

    def test_a_rank_started_by_hand_starts_itself_again(self):
        out = os.path.join(self.tmp.name, "rank")
        os.mkdir(os.path.join(self.tmp.name, "rendezvous"))
        env = dict(self.env, RANK="0", WORLD_SIZE="1", DDP_RENDEZVOUS=f"file:{self.tmp.name}/rendezvous",
                   DDP_HUGE_PAGES="1")
        p = subprocess.run([DDP, "run", *MLP, "--set", f'run.output_dir="{out}"'], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=env)
        h = self.summary(p, out)
        self.assertEqual(h["malloc_hugetlb"], "1")
        if MODE in ("madvise", "always"):
            self.assertGreaterEqual(h["anon_huge_bytes"], 2 << 20, h)


if __name__ == "__main__":
    unittest.main()
