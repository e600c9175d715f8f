"""tools/step_bench_args.py — the options the one-rank step benchmarks share (bench_blas_kernels.py,
bench_gemm_floor.py, bench_step_ab.py): the config and its --set overrides (one rank, 8 sequences by default), the
rounds, the steps of each run and how many of them to skip, the ddp binary."""
import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_parser(doc):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/lm-cpu.toml")
    ap.add_argument("--set", action="append", default=["run.world_size=1", "data.batch_size=8"], dest="sets",
                    help="a key of the run (after the defaults, which it overrides)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--ddp", default=os.path.join(ROOT, "build/bin/ddp"))
    return ap
