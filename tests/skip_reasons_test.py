#!/usr/bin/python3
"""tests/skip_reasons_test.py — tools/skip_reasons.py on a JUnit document shaped as ctest writes
it: skipped cases counted by the reason GoogleTest printed, run and failed ones left out."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import skip_reasons  # noqa: E402

GPU = "needs 2 GPU(s); this machine has 1 (one GPU per rank)"


def case(name, status, out):
    skipped = '<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>' if status == "notrun" else ""
    return f'<testcase name="{name}" status="{status}">{skipped}<system-out>{out}</system-out></testcase>'


def gtest_skip(reason):
    return f"[ RUN      ] A.B\n/x/tests/a_test.cpp:417: Skipped\n{reason}\n[  SKIPPED ] A.B (0 ms)\n"


DOC = ("<testsuite>" + case("a", "notrun", gtest_skip(GPU)) + case("b", "notrun", gtest_skip(GPU)) +
       case("c", "notrun", gtest_skip("no compute-sanitizer")) +
       case("d", "notrun", "[ RUN      ] A.D\n/x/a.cpp:9: Skipped\n\n[  SKIPPED ] A.D (0 ms)\n") +
       case("e", "run", "[       OK ] A.E (1 ms)\n") + case("f", "fail", gtest_skip("not a skip: failed")) +
       "</testsuite>")


class SkipReasons(unittest.TestCase):
    def test_counts_skipped_cases_by_reason(self):
        reasons = skip_reasons.count_reasons(DOC)
        self.assertEqual(dict(reasons), {GPU: 2, "no compute-sanitizer": 1, "(no reason given)": 1})

    def test_report_most_frequent_first_then_the_total(self):
        self.assertEqual(skip_reasons.report(skip_reasons.count_reasons(DOC)),
                         f"2 × {GPU}\n1 × (no reason given)\n1 × no compute-sanitizer\n4 skipped in all")

    def test_no_skip(self):
        self.assertEqual(skip_reasons.report(skip_reasons.count_reasons("<testsuite/>")), "0 skipped in all")


if __name__ == "__main__":
    unittest.main()
