"""tools/suite_stats.py — the statistics and number formatting of tools/ddp_suite.py: pure
functions, no third-party modules (tests/ddp_suite_test.py checks them against closed forms).

A figure of a variant (its step time, forward time, loss, ...) is measured once per run (the
mean over the run's steps after warm-up); over the variant's n runs it is summarised as a Stat:
  median       the median of the n per-run values
  low, high    the 95 % confidence interval of the mean of the per-run values, Student's t:
               mean ± t(0.975, n − 1) · s / √n, s the sample standard deviation (n − 1);
               None when n < 2 (n = 1: no interval)
A ratio (a speed-up) is summarised from paired runs: run k of a variant against run k of its
reference, the same round. Its median is the median of the n ratios; its interval is the
t-interval above taken on the logarithms of the ratios, then exponentiated (a ratio's noise is
multiplicative; the interval is that of the geometric mean, and never negative).
"""
import math
import statistics
from dataclasses import dataclass

# Student's t: the 0.975 quantile by degrees of freedom (two-sided 95 %), to 4 decimals.
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060,
        9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314,
        16: 2.1199, 17: 2.1098, 18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739,
        23: 2.0687, 24: 2.0639, 25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452,
        30: 2.0423, 40: 2.0211, 60: 2.0003, 120: 1.9799}
Z975 = 1.9600


def t975(df):
    """The 0.975 quantile of Student's t with df >= 1 degrees of freedom; between tabulated
    values, the one of the nearest smaller df (a slightly wider, conservative interval)."""
    if df < 1:
        raise ValueError(f"t975: df = {df} (at least 1)")
    if df in T975:
        return T975[df]
    below = [d for d in T975 if d < df]
    return T975[max(below)] if df < 1000 else Z975


@dataclass(frozen=True)
class Stat:
    median: float
    low: float = None   # None: n < 2, no interval
    high: float = None
    n: int = 1


def t_interval(values):
    """(low, high): the 95 % Student-t interval of the mean of values; (None, None) for n < 2."""
    n = len(values)
    if n < 2:
        return None, None
    mean = statistics.fmean(values)
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def summarize(values):
    """Stat of per-run values (None entries left out); None when there is none."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    low, high = t_interval(xs)
    return Stat(statistics.median(xs), low, high, len(xs))


def ratio_stat(ratios):
    """Stat of paired ratios (each > 0): median of the ratios, interval exp(t-interval of the
    logs); None when there is none."""
    rs = [float(r) for r in ratios if r is not None and r > 0]
    if not rs:
        return None
    low, high = t_interval([math.log(r) for r in rs])
    if low is not None:
        low, high = math.exp(low), math.exp(high)
    return Stat(statistics.median(rs), low, high, len(rs))


def scaled(stat, factor):
    """The Stat in other units (ms from s: factor 1e3)."""
    if stat is None:
        return None
    f = lambda x: None if x is None else x * factor
    return Stat(f(stat.median), f(stat.low), f(stat.high), stat.n)


# ---------------------------------------------------------------- formatting

def sig(x, digits=3):
    """x with `digits` significant digits, never in exponent notation; '—' for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{min(decimals, 6)}f}"


def at_decimals(x, decimals):
    """x rounded to `decimals` places (negative: to tens, hundreds, ...), as text."""
    if decimals >= 0:
        return f"{x:.{decimals}f}"
    return f"{round(x, decimals):.0f}"


def interval_decimals(low, high, median):
    """Decimal places at which the interval's half-width shows its significant digits: two when
    they read below 35 (0.12, 27), else one (0.5, 80), as the particle physicists round; no more
    than 6 significant digits of the largest magnitude printed, yet at least two of the median
    (a wide interval does not round it to 0); at most 6 decimals."""
    half = (high - low) / 2
    first = math.floor(math.log10(half))
    lead = half / 10 ** (first - 1)  # the first two digits, 10 <= lead < 100
    decimals = (1 if lead < 35 else 0) - first
    largest = max(abs(median), abs(low), abs(high))
    decimals = min(decimals, 5 - math.floor(math.log10(largest)))
    if median != 0:
        decimals = max(decimals, 1 - math.floor(math.log10(abs(median))))
    return min(decimals, 6)


def fmt_stat(stat, digits=3, integer=False):
    """'median [low, high]' rounded where the interval's half-width puts it; the median alone
    (`digits` significant digits; `integer`: a whole number as such) when there is no interval
    (n = 1) or every run gave the same value; '—' for None."""
    if stat is None or stat.median is None:
        return "—"
    if stat.low is None or not stat.high > stat.low:
        if integer and float(stat.median).is_integer():
            return str(int(stat.median))
        return sig(stat.median, digits)
    d = interval_decimals(stat.low, stat.high, stat.median)
    return f"{at_decimals(stat.median, d)} [{at_decimals(stat.low, d)}, {at_decimals(stat.high, d)}]"
