"""tools/suite_pytorch.py — a `pytorch` variant of tools/ddp_suite.py: the options of
tools/pytorch_ddp_bench.py that reproduce a variant's effective ddp config (PyTorch's
DistributedDataParallel on the same model, batch, optimizer, steps and warm-up), or the key it
cannot reproduce, by name. Pure functions of the config (a dict as tomllib reads it).

Reproduced: [model] lm (preset and every hyper-parameter) and mlp (width, depth, classes);
[data] random (batch_size, global, split over the ranks); [optimizer] sgd (lr, momentum,
weight_decay) and adamw (lr, betas, eps, weight_decay), with the engine's defaults; [run]
world_size, steps, seed, threads, device. Keys that do not change the computation ([run]
log_every, output_dir, timeout_s, checks, max_restarts) are ignored, as are [strategy] and
[transport]: PyTorch's DDP all-reduces over gloo (nccl on cuda) in buckets of bucket_cap_mb,
25 unless the variant sets strategy.bucket_mb. Anything else (a data file, parameter groups,
clipping, a schedule, freezing, gradient accumulation, checkpoints, ...) is refused.
"""
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "pytorch_ddp_bench.py"
TORCH_BUCKET_MB = 25.0  # DistributedDataParallel's bucket_cap_mb default


class Unreproducible(Exception):
    """A config the PyTorch baseline cannot run; the message names the key."""


# The keys a pytorch variant reproduces (or may ignore); any other key is refused by name.
TORCH_RUN_KEYS = {"steps", "world_size", "seed", "threads", "device", "grad_accum_steps",
                     "log_every", "output_dir", "timeout_s", "check_finite",
                     "check_replicas_every", "debug_collectives", "max_restarts"}
TORCH_MODEL_KEYS = {"lm": {"name", "preset", "vocab_size", "context_length", "d_model", "num_layers",
                           "num_heads", "d_ff", "rope_theta"},
                    "mlp": {"name", "width", "depth", "classes"}}
TORCH_OPTIMIZER_KEYS = {"sgd": {"name", "lr", "momentum", "weight_decay"},
                        "adamw": {"name", "lr", "betas", "eps", "weight_decay"}}


def refuse_unknown(table, known, section, where):
    for k in table:
        if k not in known:
            raise Unreproducible(f"{where}: kind = \"pytorch\" cannot reproduce '{section}.{k}' "
                                 f"(tools/pytorch_ddp_bench.py has no such setting)")


def torch_model_args(c, where):
    model = c.get("model", {})
    name = model.get("name")
    if name not in TORCH_MODEL_KEYS:
        raise Unreproducible(f"{where}: kind = \"pytorch\": model '{name}' has no PyTorch twin in "
                             f"tools/torch_models.py ({' and '.join(TORCH_MODEL_KEYS)} have)")
    refuse_unknown(model, TORCH_MODEL_KEYS[name], "model", where)
    args = {"model": name}
    if name == "lm":
        args["preset"] = model.get("preset", "lm-tiny")
    for k in sorted(TORCH_MODEL_KEYS[name] - {"name", "preset"}):
        if k in model:
            args[k.replace("_", "-")] = model[k]
    return args


def torch_optimizer_args(c, where):
    opt = c.get("optimizer", {})
    name = opt.get("name", "sgd")
    if name not in TORCH_OPTIMIZER_KEYS:
        raise Unreproducible(f"{where}: kind = \"pytorch\": optimizer '{name}' (sgd and adamw only)")
    refuse_unknown(opt, TORCH_OPTIMIZER_KEYS[name], "optimizer", where)
    if "lr" not in opt:
        raise Unreproducible(f"{where}: kind = \"pytorch\": no optimizer.lr")
    args = {"optimizer": name, "lr": opt["lr"],
            "weight-decay": opt.get("weight_decay", 0.01 if name == "adamw" else 0.0)}
    if name == "sgd":
        args["momentum"] = opt.get("momentum", 0.0)
    else:
        betas = opt.get("betas", [0.9, 0.999])
        args.update({"beta1": betas[0], "beta2": betas[1], "eps": opt.get("eps", 1e-8)})
    return args


def pytorch_args(c, overrides, warmup, where):
    """The tools/pytorch_ddp_bench.py options that reproduce effective config c (given the
    variant's overrides and warm-up): {option: value}; Unreproducible naming the key it cannot
    reproduce."""
    model = torch_model_args(c, where)
    for section in c:
        if section not in ("run", "model", "data", "optimizer", "strategy", "transport"):
            raise Unreproducible(f"{where}: kind = \"pytorch\" cannot reproduce [{section}]")
    run = c.get("run", {})
    data = {k: v for k, v in c.get("data", {}).items() if not (k == "path" and v == "")}
    refuse_unknown(run, TORCH_RUN_KEYS, "run", where)
    refuse_unknown(data, {"kind", "batch_size"}, "data", where)
    if data.get("kind", "random") != "random":
        raise Unreproducible(f"{where}: kind = \"pytorch\": data.kind = {data['kind']!r} "
                             "(random data only)")
    if run.get("grad_accum_steps", 1) != 1:
        raise Unreproducible(f"{where}: kind = \"pytorch\": run.grad_accum_steps must be 1")
    if "strategy.plugin" in overrides:
        raise Unreproducible(f"{where}: kind = \"pytorch\" runs PyTorch's DDP: no strategy.plugin")
    world, steps, batch = run.get("world_size", 1), run.get("steps"), data.get("batch_size")
    if not isinstance(steps, int) or not isinstance(batch, int) or not isinstance(world, int):
        raise Unreproducible(f"{where}: kind = \"pytorch\": needs run.steps and data.batch_size")
    if batch % world:
        raise Unreproducible(f"{where}: data.batch_size = {batch} does not divide by world {world}")
    for key, value in overrides.items():  # a strategy setting PyTorch's DDP would not apply
        if key.startswith("strategy.") and key.rsplit(".", 1)[1] not in ("bucket_mb",):
            raise Unreproducible(f"{where}: kind = \"pytorch\" cannot reproduce '{key}' = {value!r} "
                                 "(PyTorch's DDP here takes bucket_mb, as its bucket_cap_mb, alone)")
    bucket = overrides.get("strategy.bucket_mb", TORCH_BUCKET_MB)
    if not isinstance(bucket, (int, float)) or isinstance(bucket, bool) or bucket <= 0:
        raise Unreproducible(f"{where}: kind = \"pytorch\": strategy.bucket_mb (its bucket_cap_mb) "
                             f"must be a number > 0 (got {bucket!r})")
    return {**model, **torch_optimizer_args(c, where),
            "world": world, "batch": batch // world, "warmup": warmup, "steps": steps - warmup,
            "threads": run.get("threads", 1), "seed": run.get("seed", 0),
            "device": run.get("device", "cpu"), "bucket-cap-mb": float(bucket)}


def bench_command(python, args):
    """The command line of tools/pytorch_ddp_bench.py with these options."""
    cmd = [str(python), str(BENCH)]
    for k, value in args.items():
        cmd += [f"--{k}", str(value)]
    return cmd
