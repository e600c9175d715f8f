#!/usr/bin/python3
"""tests/powersgd_bytes_test.py — what the `powersgd` strategy sends, through `ddp run` and `ddp plan`,
on lm-tiny and mlp (256 x 3), both learning a teacher's targets with AdamW (lr 1e-3), at rank 2:
  - every step's comm_bytes in summary.json is exactly Σ (n + m)·r·4 over the matrices (every
    parameter of 2+ dimensions, n its first dimension, m the rest, r = min(2, n, m)) plus 4 per
    element of the 1-D parameters, the shapes read from the run's weights.safetensors; in three
    all-reduces a step (the vectors', P's, Q's); the same as `ddp plan`'s comm_bytes_per_step
    and as the strategy's stats, whose compression ratio is the all-reduce's bytes over these;
  - the loss falls: the mean of the last 5 of 30 steps at least 0.02 below the first 5's
    (measured: lm-tiny 6.31 to 6.06, mlp 2.305 to 2.255, where bucketed goes 2.302 to 2.232);
  - with start_step = 3, steps 0-2 send every gradient uncompressed (4 bytes an element, in
    place: one all-reduce of the packed gradients) and steps 3-4 the compressed bytes;
  - configs/powersgd.toml (mlp 1024 x 8) sends under 1/100 of an all-reduce's bytes (1/195);
  - a bad key is refused naming it.
A few seconds. ctest runs it as `powersgd_bytes` with DDP_BIN set; by hand:
  DDP_BIN=build/bin/ddp /usr/bin/python3 tests/powersgd_bytes_test.py [-v]
"""
import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = os.environ.get("DDP_BIN", str(ROOT / "build" / "bin" / "ddp"))
MODELS = {
    "lm-tiny": ["configs/lm-cpu.toml", "--set", 'model.preset="lm-tiny"', "--set", "data.batch_size=8", "--set",
                "data.teacher=true"],
    "mlp": ["configs/mlp.toml", "--set", "model.width=256", "--set", "model.depth=3", "--set", 'optimizer.name="adamw"',
            "--set", "optimizer.lr=1e-3", "--set", "data.batch_size=64", "--set", "data.teacher=true"],
}
STEPS = 30
RANK = 2


def sets(items):
    return [a for s in items for a in ("--set", s)]


def ddp(*args, check=True):
    p = subprocess.run([DDP, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"ddp {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p


def shapes(path):
    """{name: shape} from a safetensors header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: v["shape"] for k, v in header.items()}


def expected_bytes(shape_of):
    """(compressed bytes a step, an all-reduce's bytes a step), from the shapes alone."""
    compressed = dense = 0
    for shape in shape_of.values():
        numel = 1
        for d in shape:
            numel *= d
        dense += 4 * numel
        if len(shape) >= 2:
            n, m = shape[0], numel // shape[0]
            compressed += (n + m) * min(RANK, n, m) * 4
        else:
            compressed += 4 * numel
    return compressed, dense


class PowerSgdBytes(unittest.TestCase):
    def run_model(self, model, world, more=()):
        base = MODELS[model] + sets(['strategy.plugin="powersgd"', f"strategy.powersgd.rank={RANK}",
                                     f"run.world_size={world}", *more])
        with tempfile.TemporaryDirectory() as out:
            ddp("run", *base, *sets(["run.log_every=100", f'run.output_dir="{out}"']))
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            shape_of = shapes(os.path.join(out, "weights.safetensors"))
        plan = json.loads(ddp("plan", *base, "--json").stdout)["run"]
        return summary, shape_of, plan

    def test_bytes_are_the_low_rank_factors_and_the_vectors_and_the_loss_falls(self):
        for model, world in (("lm-tiny", 2), ("mlp", 2), ("mlp", 4)):
            with self.subTest(model=model, world=world):
                summary, shape_of, plan = self.run_model(model, world, [f"run.steps={STEPS}"])
                compressed, dense = expected_bytes(shape_of)
                has_vectors = any(len(s) < 2 for s in shape_of.values())
                self.assertTrue(has_vectors)  # both models have 1-D parameters: three all-reduces
                self.assertEqual(summary["comm_bytes"], [compressed] * STEPS)
                self.assertEqual(summary["collectives"], [3] * STEPS)
                self.assertEqual(plan["comm_bytes_per_step"], compressed)
                self.assertEqual(plan["collectives_per_step"], 3)
                stats = summary["strategy_stats"]
                self.assertEqual(stats["bytes_per_step"], compressed)
                self.assertEqual(stats["all_reduce_bytes"], dense)
                self.assertAlmostEqual(stats["compression_ratio"], dense / compressed, places=12)
                self.assertEqual(stats["compressed_steps"], STEPS)
                self.assertEqual(len(stats["matrices"]), sum(1 for s in shape_of.values() if len(s) >= 2))
                loss = summary["loss"]
                self.assertLess(sum(loss[-5:]) / 5, sum(loss[:5]) / 5 - 0.02, loss)
                self.assertGreater(dense / compressed, 10 if model == "mlp" else 2)

    def test_steps_before_start_step_send_the_whole_gradients(self):
        summary, shape_of, _ = self.run_model("mlp", 2, ["run.steps=5", "strategy.powersgd.start_step=3"])
        compressed, dense = expected_bytes(shape_of)
        self.assertEqual(summary["comm_bytes"], [dense] * 3 + [compressed] * 2)
        self.assertEqual(summary["collectives"], [1] * 3 + [3] * 2)  # the packed gradients: one all-reduce
        self.assertEqual(summary["strategy_stats"]["uncompressed_steps"], 3)
        self.assertEqual(summary["strategy_stats"]["compressed_steps"], 2)

    def test_the_ready_config_sends_under_a_hundredth_of_an_all_reduce(self):
        """configs/powersgd.toml (mlp 1024 x 8, 2 ranks, rank 2): 172 152 bytes a step against 33 628 200."""
        with tempfile.TemporaryDirectory() as out:
            ddp("run", "configs/powersgd.toml", *sets(["run.steps=2", f'run.output_dir="{out}"']))
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            compressed, dense = expected_bytes(shapes(os.path.join(out, "weights.safetensors")))
        self.assertEqual(summary["comm_bytes"], [compressed] * 2)
        self.assertEqual((compressed, dense), (172152, 33628200))
        self.assertLess(compressed * 100, dense)

    def test_bad_keys_are_refused_by_name(self):
        for key, words in (("rank=0", "strategy.rank must be an integer >= 1 (got 0)"),
                           ("start_step=-1", "strategy.start_step must be an integer >= 0 (got -1)"),
                           ("epsilon=-1", "strategy.epsilon must be a finite number >= 0 (got -1)")):
            with self.subTest(key=key):
                p = ddp("plan", *MODELS["mlp"], *sets(['strategy.plugin="powersgd"', f"strategy.powersgd.{key}"]),
                        check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(words, p.stderr)


if __name__ == "__main__":
    unittest.main()
