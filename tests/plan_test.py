#!/usr/bin/python3
"""tests/plan_test.py — `ddp plan` against what `ddp run` measures. For lm-tiny and mlp (256 x 3)
at worlds 1, 2 and 4 and lm-cpu (its config: world 2) every shipped strategy (sharded in both
variants of stage 1, in stage 2 with two caps and in stage 3 (also gathering in bf16), bucketed also compressed and with small buckets;
and under 16-bit compute, whose kept activations take 2 bytes an element),
each planning its own part through its plan entry, powersgd at rank 2 among them, with AdamW (lm) and
SGD with momentum (mlp):
  - rank 0's peak bytes at the three moments of summary.json, and every rank's peak over the run,
    per category: exactly equal for parameters, gradients, optimizer state and communication
    buffers; within 5 % for activations (the bound the issue sets; they come out exact);
  - per step: the number of collectives and the bytes they move (comm_bytes, bus_bytes), exactly.
Then `ddp plan` of the xxl preset: 2.2e11 parameters, 16 bytes per parameter in fp32, the
smallest FSDP degree within a TPU v5p's 95 GB; and refusals (bucket_mb = "auto", freeze).
About 3 minutes. ctest runs it as `plan` with DDP_BIN set (release only); by hand:
  DDP_BIN=build/bin/ddp /usr/bin/python3 tests/plan_test.py [-v]
"""
import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DDP = os.environ.get("DDP_BIN", str(ROOT / "build" / "bin" / "ddp"))
NCCL = Path(DDP).resolve().parent.parent / "lib" / "ddp" / "libddp_transport_nccl.so"
MODELS = {
    "lm-tiny": ["configs/lm-cpu.toml", "--set", 'model.preset="lm-tiny"', "--set", "data.batch_size=8"],
    "lm-cpu": ["configs/lm-cpu.toml"],
    "mlp": ["configs/mlp.toml", "--set", "model.width=256", "--set", "model.depth=3", "--set",
            "optimizer.momentum=0.9", "--set", "data.batch_size=8"],
}
STRATEGIES = {
    "naive": ['strategy.plugin="naive"'],
    "flat": ['strategy.plugin="flat"'],
    "flat_copies": ['strategy.plugin="flat"', "strategy.flat.in_place=false"],
    "overlap": ['strategy.plugin="overlap"'],
    "bucketed": ['strategy.plugin="bucketed"', "strategy.bucketed.bucket_mb=0.1"],
    "bucketed_bf16": ['strategy.plugin="bucketed"', 'strategy.bucketed.compress="bf16"'],
    "sharded": ['strategy.plugin="sharded"', "strategy.sharded.bucket_mb=0.1"],
    "sharded_allgather": ['strategy.plugin="sharded"', 'strategy.sharded.variant="allgather"'],
    "sharded_stage2": ['strategy.plugin="sharded"', "strategy.sharded.stage=2", "strategy.sharded.bucket_mb=0.1"],
    # Compressed: P, Q and the vectors' all-reduces; the error and Q as optimizer state.
    "powersgd": ['strategy.plugin="powersgd"'],
}
# Checked in tests of their own, not for every model and world.
MORE = {
    "sharded_stage2_8": ['strategy.plugin="sharded"', "strategy.sharded.stage=2", "strategy.sharded.bucket_mb=8"],
    "sharded_stage2_bf16": ['strategy.plugin="sharded"', "strategy.sharded.stage=2", 'strategy.sharded.compress="bf16"'],
    "sharded_stage3": ['strategy.plugin="sharded"', "strategy.sharded.stage=3"],
    "sharded_stage3_bf16": ['strategy.plugin="sharded"', "strategy.sharded.stage=3",
                            'strategy.sharded.gather_dtype="bf16"'],
    "sharded_stage3_keep": ['strategy.plugin="sharded"', "strategy.sharded.stage=3", "strategy.sharded.prefetch=0",
                            "strategy.sharded.reshard_after_forward=false"],
    # Replicas that differ between sync points: every 2 steps, so that the last of a 2-step run is one.
    "localsgd": ['strategy.plugin="localsgd"', "strategy.localsgd.period=2"],
    "diloco": ['strategy.plugin="diloco"', "strategy.diloco.period=2"],
}
EXACT = ["parameters", "gradients", "optimizer_state", "comm_buffers"]
MOMENTS = ["after_setup", "before_optimizer_step", "after_optimizer_step"]


def sets(items):
    return [a for s in items for a in ("--set", s)]


def ddp(*args):
    p = subprocess.run([DDP, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"ddp {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


class PlanAgainstRuns(unittest.TestCase):
    def check(self, model, strategy, world, more=()):
        """Plan against run; returns the run's summary.json."""
        base = MODELS[model] + sets({**STRATEGIES, **MORE}[strategy] + [f"run.world_size={world}", *more])
        with tempfile.TemporaryDirectory() as out:
            ddp("run", *base, *sets(["run.steps=2", "run.log_every=100", f'run.output_dir="{out}"']))
            with open(os.path.join(out, "summary.json")) as f:
                measured = json.load(f)
        plan = json.loads(ddp("plan", *base, "--json"))["run"]
        predicted = plan["peak_bytes"]
        for moment in MOMENTS:
            for cat in EXACT:
                self.assertEqual(predicted[0][moment][cat], measured["peak_bytes"][moment][cat], f"rank 0 {moment} {cat}")
            acts, want = predicted[0][moment]["activations"], measured["peak_bytes"][moment]["activations"]
            self.assertLessEqual(abs(acts - want), 0.05 * want, f"rank 0 {moment} activations")
        for r, rank in enumerate(measured["ranks"]):
            for cat in EXACT + ["activations"]:
                self.assertEqual(max(predicted[r][m][cat] for m in MOMENTS), rank["peak_bytes"][cat], f"rank {r} {cat}")
        if strategy.startswith("flat"):  # the packed gradients averaged in place, unless told to copy
            self.assertEqual(measured["strategy_stats"]["averaged_in_place"], strategy == "flat")
        sync = plan.get("per_sync_point", {"collectives": [], "comm_bytes": 0, "bus_bytes": 0})
        self.assertEqual(plan["collectives_per_step"] + len(sync["collectives"]), measured["collectives"][-1])
        self.assertEqual(plan["comm_bytes_per_step"] + sync["comm_bytes"], measured["comm_bytes"][-1])
        self.assertEqual(plan["bus_bytes_per_step"] + sync["bus_bytes"], measured["bus_bytes"][-1])
        if "per_sync_point" in plan:  # the first step is not one: every other step
            self.assertEqual(plan["collectives_per_step"], measured["collectives"][0])
            self.assertEqual(plan["comm_bytes_per_step"], measured["comm_bytes"][0])
        return measured

    def test_every_strategy_world_and_model(self):
        for model in MODELS:
            for strategy in STRATEGIES:
                for world in (1, 2, 4) if model != "lm-cpu" else (2,):
                    with self.subTest(model=model, strategy=strategy, world=world):
                        self.check(model, strategy, world)

    def test_divergent_strategies_send_at_their_sync_points(self):
        """localsgd and diloco (ABI 1.8's ddp_plan::every): nothing in the step between sync points,
        one all-reduce of the model at each; their buffers (diloco's θ_global and momentum) exactly."""
        for model in ("lm-tiny", "mlp"):
            for strategy in ("localsgd", "diloco"):
                with self.subTest(model=model, strategy=strategy):
                    measured = self.check(model, strategy, 2)
                    self.assertEqual(measured["synced"], [False, True])

    def test_stage2_gradients_are_a_slice_plus_the_buckets_in_flight(self):
        """lm-cpu at worlds 2 and 4, the config's 8 MiB buckets: ZeRO-2's gradients per rank are its shard
        (1/N of bucketed's, but for the chunks' alignment) and the ring of buckets in flight, which holds one
        bucket at a time here (the largest: the head's), and the plan says so exactly."""
        for world in (2, 4):
            with self.subTest(world=world):
                bucketed = self.check("lm-cpu", "bucketed", world)
                stage2 = self.check("lm-cpu", "sharded_stage2_8", world)
                stats = stage2["strategy_stats"]
                largest = max(b["chunk"] for b in stats["buckets"]) * world * 4
                self.assertEqual(stats["ring_elements"] * 4, largest)  # one bucket in flight at a time
                full = bucketed["ranks"][0]["peak_bytes"]["gradients"]
                slack = 16 * 4 * len(stats["buckets"])  # a chunk rounds up to 16 floats
                for rank in stage2["ranks"]:
                    self.assertLessEqual(rank["peak_bytes"]["gradients"], full / world + slack + largest)

    def test_stage2_with_accumulation_and_compressed(self):
        """Stage 2 reduce-scatters every micro-batch's gradients: the plan counts them all; compressed, it
        plans its 16-bit buffers and halves the bytes."""
        self.check("mlp", "sharded_stage2", 2, ["run.grad_accum_steps=3"])
        self.check("mlp", "sharded_stage2_bf16", 2)
        self.check("lm-tiny", "sharded_stage2_bf16", 2)

    def test_stage3(self):
        """Stage 3 (FSDP): values, gradients and optimizer state of 1/N of the model per rank, the gather
        slots and the ring, one unit's initial values at a time lent through set-up (take_values); the
        schedule's all-gathers and a reduce-scatter per unit, per micro-batch, exactly."""
        for model, world in (("lm-tiny", 1), ("lm-tiny", 2), ("lm-tiny", 4), ("mlp", 2), ("lm-cpu", 2)):
            with self.subTest(model=model, world=world):
                self.check(model, "sharded_stage3", world)
        self.check("mlp", "sharded_stage3", 2, ["run.grad_accum_steps=3"])
        self.check("lm-tiny", "sharded_stage3_keep", 2)

    def test_stage3_never_holds_the_whole_model(self):
        """lm-cpu at world 4 with prefetch 0 (the issue's memory target). The engine lends the initial values
        a unit at a time, so the parameters' peak through set-up is the shard, the gather slot and the largest
        unit (the head, 10.2 MB), not the model's 37.3 MB; and at every moment parameters + gradients +
        optimizer state are at most a quarter of bucketed's plus two units."""
        bucketed = self.check("lm-cpu", "bucketed", 4)
        stage3 = self.check("lm-cpu", "sharded_stage3", 4, ["strategy.sharded.prefetch=0"])
        stats = stage3["strategy_stats"]
        unit = max(b["elements"] for b in stats["buckets"]) * 4  # a unit's values, as lent
        slot = max(b["chunk"] for b in stats["buckets"]) * 4 * 4  # as gathered: 4 chunks (padded)
        model = bucketed["peak_bytes"]["after_setup"]["parameters"]
        self.assertEqual(stage3["peak_bytes"]["after_setup"]["parameters"],
                         stats["shard_elements"] * 4 + stats["gather_slots"] * slot + unit)
        for rank in stage3["ranks"]:
            self.assertLess(rank["peak_bytes"]["parameters"], model)

        def held(summary, moment):
            return sum(summary["peak_bytes"][moment][c] for c in ("parameters", "gradients", "optimizer_state"))
        quarter = max(held(bucketed, m) for m in MOMENTS) / 4
        for m in MOMENTS:
            self.assertLessEqual(held(stage3, m), quarter + 2 * slot, m)

    def test_stage3_gathers_in_bf16(self):
        """gather_dtype = "bf16": the plan equals the run (its 16-bit chunk and unit in the communication
        buffers), every all-gather moves half the bytes of float32's and every reduce-scatter the same."""
        for model, world in (("lm-tiny", 2), ("mlp", 4)):
            with self.subTest(model=model, world=world):
                self.check(model, "sharded_stage3_bf16", world)
                plans = {}
                for strategy in ("sharded_stage3", "sharded_stage3_bf16"):
                    base = MODELS[model] + sets(MORE[strategy] + [f"run.world_size={world}"])
                    plans[strategy] = json.loads(ddp("plan", *base, "--json"))["run"]["collectives"]
                f32, bf16 = plans["sharded_stage3"], plans["sharded_stage3_bf16"]
                self.assertEqual([c["op"] for c in f32], [c["op"] for c in bf16])
                gathers = [(a, b) for a, b in zip(f32, bf16) if a["op"] == "all_gather"]
                self.assertGreater(len(gathers), 0)
                for a, b in zip(f32, bf16):
                    self.assertEqual(b["bytes"] * (2 if a["op"] == "all_gather" else 1), a["bytes"], a)

    def test_16_bit_compute_keeps_activations_in_16_bits(self):
        """[precision] compute = "bf16" / "fp16": the plan equals the run, and the activations backward
        keeps take 2 bytes an element (lm-cpu: 0.69 of fp32's; its float32 logits are a quarter). powersgd
        under fp16's loss scaling: its copies of the error and Q a skipped step puts back, counted."""
        acts = {}
        for model, strategy, compute in (("lm-cpu", "bucketed", "fp32"), ("lm-cpu", "bucketed", "bf16"),
                                         ("lm-tiny", "sharded_stage3", "fp16"), ("mlp", "naive", "bf16"),
                                         ("mlp", "powersgd", "fp16")):
            with self.subTest(model=model, compute=compute):
                measured = self.check(model, strategy, 2, [f'precision.compute="{compute}"'])
                acts[model, compute] = measured["peak_bytes"]["before_optimizer_step"]["activations"]
        self.assertEqual(acts["lm-cpu", "bf16"], 107159552)
        self.assertEqual(acts["lm-cpu", "fp32"], 154345472)
        text = ddp("plan", *MODELS["lm-cpu"], "--set", 'precision.compute="bf16"')
        self.assertIn(" rows per rank per micro-batch, adamw, compute bf16\n", text.splitlines(True)[0])

    @unittest.skipUnless((Path(DDP).parent.parent / "lib" / "ddp" / "libddp_transport_mpi.so").exists(),
                         "the mpi transport is not built (no MPI found)")
    def test_mpi_transport(self):
        for strategy in ("bucketed", "sharded_allgather", "sharded_stage2"):
            with self.subTest(strategy=strategy):
                self.check("mlp", strategy, 2, ['transport.plugin="mpi"'])


class CommunicationTime(unittest.TestCase):
    """--bench and --bench-busy: the step's collectives priced in closed form from the fits of two
    bench_comm.json files, the collectives beside compute with the loaded one."""

    def write(self, d, name, load, o, w):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            json.dump({"load": load, "rows": [],
                       "overhead_fit": [{"transport": "gloo", "world": 2, "o_s": o, "w_bytes_per_s": w}]}, f)
        return path

    def test_collectives_beside_compute_take_the_loaded_price(self):
        with tempfile.TemporaryDirectory() as d:
            idle, busy = self.write(d, "idle.json", "none", 1e-3, 1e9), self.write(d, "busy.json", "gemm", 2e-3, 5e8)
            odd = self.write(d, "odd.json", True, 1e-3, 1e9)
            broken = os.path.join(d, "broken.json")
            with open(broken, "w") as f:
                f.write('{"overhead_fit": [{"o_s": NaN}]}')
            clipped = json.loads(ddp("plan", "configs/lm-cpu.toml", "--set", "optimizer.clip_grad_norm=1.0", "--json",
                                     "--bench", idle, "--bench-busy", busy))["run"]
            self.assertFalse(clipped["collectives"][-1]["beside_compute"])  # the engine waits for every gradient
            for overlap_optimizer, alone in (("true", 0), ("false", 1)):
                with self.subTest(overlap_optimizer=overlap_optimizer):
                    run = json.loads(ddp("plan", "configs/lm-cpu.toml", "--set",
                                         f"strategy.bucketed.overlap_optimizer={overlap_optimizer}", "--json",
                                         "--bench", idle, "--bench-busy", busy))["run"]
                    marks = [c["beside_compute"] for c in run["collectives"]]
                    self.assertEqual(marks, [True] * (len(marks) - alone) + [False] * alone)
                    # world 2: bus bytes = the buffer's, at w bytes/s
                    want = sum(2e-3 + c["bytes"] / 5e8 if c["beside_compute"] else 1e-3 + c["bytes"] / 1e9
                               for c in run["collectives"])
                    self.assertAlmostEqual(run["comm_seconds_per_step"], want, places=12)
                    self.assertAlmostEqual(sum(c["seconds"] for c in run["collectives"]), want, places=12)
                    self.assertEqual(run["overhead_fit_busy"], {"o_s": 2e-3, "w_bytes_per_s": 5e8})
            for args, message in [(["--bench", busy], f"--bench {busy}: measured with --load gemm: give it as "
                                                      "--bench-busy, and an idle one as --bench"),
                                  (["--bench", idle, "--bench-busy", idle],
                                   f"--bench-busy {idle}: measured on idle cores; --bench-busy takes a bench-comm "
                                   "run with --load gemm"),
                                  (["--bench", odd], f'--bench {odd}: "load" is true, not "none" or "gemm"'),
                                  (["--bench", broken], f"--bench {broken}: not valid JSON")]:
                with self.subTest(args=args):
                    p = subprocess.run([DDP, "plan", "configs/lm-cpu.toml", *args], cwd=ROOT, capture_output=True,
                                       text=True)
                    self.assertEqual(p.returncode, 1, p.stdout)
                    self.assertIn(message, p.stderr)


class Accounting(unittest.TestCase):
    XXL = ["configs/lm-cpu.toml", "--set", 'model.preset="xxl"']

    def test_xxl_on_one_device_and_the_fsdp_degree_that_fits_a_v5p(self):
        one = json.loads(ddp("plan", *self.XXL, "--json", "--hardware", "h100-80gb"))
        self.assertEqual(one["parameters"], 126 * 2 * 16384 * 53248)
        self.assertNotIn("run", one)
        mesh = one["mesh"]
        states = mesh["bytes_per_device"]
        self.assertEqual(states["master"] + states["gradients"] + states["optimizer"], 16 * one["parameters"])
        self.assertAlmostEqual(mesh["devices_of_memory"], 16 * one["parameters"] / 80e9)  # 43.97 H100s
        v5p = json.loads(ddp("plan", *self.XXL, "--json", "--hardware", "tpu-v5p"))["mesh"]
        # 16 P / N < 95e9  =>  N > 37.02
        self.assertEqual(v5p["min_fsdp_to_fit"], 38)

    def test_the_v5p_mesh_of_the_assignment(self):
        m = json.loads(ddp("plan", *self.XXL, "--json", "--hardware", "tpu-v5p", "--mesh", "16,4",
                           "--tokens", "20480"))["mesh"]
        alpha = 4.6e14 / 1.8e11  # W_ici = 2 x 9e10
        self.assertAlmostEqual(m["alpha"], alpha)
        self.assertAlmostEqual(m["fsdp_min_tokens_per_device"], alpha / (4 * 2))  # comm alpha / (2 Y M_X)
        self.assertAlmostEqual(m["fsdp_min_global_tokens"], 64 * alpha / 8)  # 20,444
        self.assertAlmostEqual(m["tp_max_y"], 53248 / alpha)  # m M_Y F / (comm alpha) = 20.8
        self.assertTrue(m["tp_compute_bound"])
        self.assertTrue(m["compute_bound"])  # 20 sequences of 1024 > 20,444 tokens

    def test_refusals_name_the_file_and_key(self):
        for args, message in [
                (["--precision", "master=abc", "--mesh", "2,2"], "--precision master=abc: VALUE must be a finite number > 0"),
                (["--mesh", "16,4", "--tokens", "1e308"], "mesh: the plan overflows a double at these sizes"),
                (["--tokens", "5"], "--hardware, --hw, --axes, --tokens, --activation-shard and --precision describe a mesh"),
                (["--overhead", "5,0"], "--overhead: o must be a finite number and w a finite number > 0"),
                (["--bench-busy", "x.json"], "--bench-busy prices the collectives beside compute; the others need --bench or --overhead"),
                (["--overhead", "5,1", "--bench-busy", "/nonexistent.json"], "--bench-busy /nonexistent.json: not a file"),
                (["--set", "model.num_heads=3"], "must split into num_heads 3 heads of an even size"),
                (["--set", 'strategy.bucketed.bucket_mbb=1'], "unknown key 'strategy.bucketed.bucket_mbb' (strategy plugin 'bucketed' does not read it"),
                (["--set", 'strategy.bucketed.bucket_mb=0'], "strategy.bucket_mb must be a finite number of MiB > 0"),
                (["--set", 'strategy.plugin="sharded"', "--set", "strategy.sharded.stage=2", "--set",
                  'strategy.sharded.variant="allgather"'],
                 "unknown key 'strategy.sharded.variant' (strategy plugin 'sharded' does not read it)"),
                (["--set", 'transport.plugin="nccl"'], "transport plugin 'nccl' does not run on run.device = \"cpu\"")]:
            if "nccl" in " ".join(args) and not NCCL.exists():
                continue  # a build without CUDA (the sanitizers') has no nccl plugin to refuse
            with self.subTest(args=args):
                p = subprocess.run([DDP, "plan", "configs/lm-cpu.toml", *args], cwd=ROOT, capture_output=True, text=True)
                self.assertEqual(p.returncode, 1, p.stdout)
                self.assertIn(message, p.stderr)
        # A command line that does not parse: exit 2 (usage), not CLI11's own codes.
        for args, message in [(["--mesh", "a,b"], "Could not convert: --mesh = a,b"),
                              (["--bogus"], "The following argument was not expected: --bogus")]:
            p = subprocess.run([DDP, "plan", "configs/lm-cpu.toml", *args], cwd=ROOT, capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(message, p.stderr)
        p = subprocess.run([DDP, "plan", "configs/lm-cpu.toml", "--set", 'strategy.bucketed.bucket_mb="auto"'],
                           cwd=ROOT, capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertIn("configs/lm-cpu.toml: strategy plugin 'bucketed': plan: strategy.bucket_mb = \"auto\" is chosen "
                      "by a measurement at run time", p.stderr)
        p = subprocess.run([DDP, "plan", "configs/lm-cpu.toml", "--set", 'model.freeze=["lm_head.*"]'],
                           cwd=ROOT, capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertIn("`ddp plan` plans runs that train every parameter", p.stderr)


if __name__ == "__main__":
    unittest.main()
