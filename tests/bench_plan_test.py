#!/usr/bin/python3
"""tests/bench_plan_test.py — tools/bench_plan.py's measure from a trace (joined_seconds) on small
synthetic traces (and the sizes it benchmarks, step_sizes): each collective counted from the latest start over the ranks to the latest end,
summed per step, medians over the steps after --skip; traces whose ranks disagree are refused."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import bench_plan  # noqa: E402


def span(rank, step, ts, dur, nbytes=1000, op="all_reduce"):
    return {"name": op, "ph": "X", "pid": rank, "tid": 1, "ts": ts, "dur": dur,
            "args": {"op": op, "bytes": nbytes, "step": step}}


def joined(events, skip):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": [{"name": "process_name", "ph": "M", "pid": 0, "args": {}}] + events}, f)
    try:
        return bench_plan.joined_seconds(f.name, skip)
    finally:
        os.unlink(f.name)


class StepSizes(unittest.TestCase):
    def test_the_distinct_sizes_of_the_step_and_a_quarter_of_a_lone_one(self):
        c = [{"bytes": b} for b in (10240000, 8130560, 8130560, 525312, 10240000)]
        self.assertEqual(bench_plan.step_sizes(c), [525312, 8130560, 10240000])
        self.assertEqual(bench_plan.step_sizes([{"bytes": 37266432}]), [9316608, 37266432])
        self.assertEqual(bench_plan.step_sizes([{"bytes": 8}]), [4, 8])


class JoinedSeconds(unittest.TestCase):
    def test_counts_from_the_last_start_to_the_last_end(self):
        # Step 1: rank 1 joins the first collective 3000 µs late and ends 500 µs after rank 0; the
        # second starts together. Step 0 is skipped; step 2 is the same as step 1 but 1 ms longer.
        events = [span(0, 0, 0, 99e6), span(1, 0, 0, 99e6)]
        for step, base, extra in ((1, 1e6, 0), (2, 2e6, 1000)):
            events += [span(0, step, base, 5000), span(1, step, base + 3000, 2500),
                       span(0, step, base + 10000, 4000 + extra, 2000), span(1, step, base + 10000, 3000, 2000)]
        per_step, per_collective = joined(events, skip=1)
        # step 1: (5500 - 3000) + 4000 = 6500 µs; step 2: 2500 + 5000 = 7500 µs; median 7000 µs
        self.assertAlmostEqual(per_step, 7000e-6)
        self.assertEqual(len(per_collective), 2)
        self.assertAlmostEqual(per_collective[0][0], 2500e-6)  # after all joined
        self.assertAlmostEqual(per_collective[0][1], 5000e-6)  # rank 0's own time in flight
        self.assertAlmostEqual(per_collective[1][0], 4500e-6)
        self.assertAlmostEqual(per_collective[1][1], 4500e-6)

    def test_ranks_that_disagree_are_refused(self):
        for other in (span(1, 1, 0, 10, nbytes=999), span(1, 1, 0, 10, op="broadcast")):
            with self.assertRaises(SystemExit) as e:
                joined([span(0, 1, 0, 10), other], skip=0)
            self.assertIn("step 1: the ranks' traces hold different collectives", str(e.exception))
        with self.assertRaises(SystemExit) as e:
            joined([span(0, 1, 0, 10), span(0, 1, 20, 10), span(1, 1, 0, 10)], skip=0)
        self.assertIn("different collectives", str(e.exception))

    def test_no_collective_of_rank_0_is_refused(self):
        with self.assertRaises(SystemExit) as e:
            joined([span(0, 0, 0, 10)], skip=1)
        self.assertIn("has no collectives of rank 0 after step 1", str(e.exception))


if __name__ == "__main__":
    unittest.main()
