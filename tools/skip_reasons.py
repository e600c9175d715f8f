#!/usr/bin/python3
"""tools/skip_reasons.py — the skipped tests of a ctest run, counted by reason, from the JUnit
file `ctest --output-junit FILE` writes. A GoogleTest skip prints "<file>:<line>: Skipped" and
its message on the next line; that message is the reason (a test skipped without one counts
under "(no reason given)").

usage: tools/skip_reasons.py JUNIT.xml
Prints one line per reason, most frequent first: "<count> × <reason>", then the total; exit 0
(also with no skipped test), 2 for a file that is not ctest's JUnit.
tools/gpu_check.sh puts this in gpu_check.md, so a green run says what it did not test.
"""
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

SKIP_LINE = re.compile(r":\d+: Skipped\s*$")


def skip_reason(output):
    """The reason a GoogleTest program's output gives for its skip; None if none is given."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if SKIP_LINE.search(line) and i + 1 < len(lines) and not lines[i + 1].startswith("["):
            return lines[i + 1].strip()
    return None


def count_reasons(junit_text):
    """Counter of reasons over the skipped test cases of a ctest JUnit document."""
    root = ET.fromstring(junit_text)
    reasons = Counter()
    for case in root.iter("testcase"):
        if case.find("skipped") is None and case.get("status") != "notrun":
            continue
        out = case.findtext("system-out") or ""
        reasons[skip_reason(out) or "(no reason given)"] += 1
    return reasons


def report(reasons):
    lines = [f"{n} × {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines.append(f"{sum(reasons.values())} skipped in all")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[4], file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            reasons = count_reasons(f.read())
    except (OSError, ET.ParseError) as e:
        print(f"skip_reasons: {argv[1]}: {e}", file=sys.stderr)
        return 2
    print(report(reasons))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
