#!/usr/bin/python3
"""PyTorch baseline for the engine's benchmarks: trains `lm` or `mlp` with PyTorch's own
torch.nn.parallel.DistributedDataParallel (gloo on the CPU, nccl on GPUs) and times the steps.

usage (from anywhere; Debian's python3 with torch 1.13, not the pyenv python):
  /usr/bin/python3 tools/pytorch_ddp_bench.py [--world N] [--batch B] [--steps S] [--warmup W]
      [--preset lm-cpu | --model mlp --width 1024 --depth 8 --classes 10] [--bucket-cap-mb 25]
      [--optimizer adamw | sgd] [--lr LR] [--weight-decay WD] [--device cpu | cuda]

  --world N        ranks (default 2): N processes (torch.multiprocessing spawn), gloo over
                   127.0.0.1 on a free port, each rank wrapped in DistributedDataParallel
                   with its defaults (bucket_cap_mb 25, broadcast_buffers, ...).
                   --world 1: one process, plain model, no DDP and no process group.
  --device cuda    one GPU per rank (rank r on GPU r), nccl instead of gloo, float32 with
                   TF32 off (as the engine's cuBLAS calls); each step ends with
                   torch.cuda.synchronize(), so its time is the GPU's too.
  --batch B        rows per rank (default 8); an lm row is context_length + 1 tokens
  --steps S        timed steps (default 20), after --warmup W untimed ones (default 3)
  --threads T      torch threads per rank (default 1: torch.set_num_threads(1))
  --model lm       (default) with --preset (default lm-cpu; lm-tiny, small, ...) and optional
                   overrides of its hyper-parameters, as the engine's [model] keys: --vocab-size,
                   --context-length, --d-model, --num-layers, --num-heads, --d-ff, --rope-theta
  --model mlp      --width (1024) --depth (8) --classes (10): depth x Linear(width, width)+ReLU,
                   then Linear(width, classes); cross-entropy
  --seed           weights from make_lm/make_mlp(seed) (DDP then broadcasts rank 0's);
                   rank r's data from seed + 1000 + r

  --precision bf16 what a user trains with: the forward under torch.autocast(bfloat16) (matrix
                   products in bf16 with float32 accumulation, softmax, norms and the loss in
                   float32, as the engine's [precision] compute = "bf16" defines them),
                   float32 master weights and optimizer; with it, by default, attention
                   through F.scaled_dot_product_attention (--sdpa, PyTorch >= 2.0) and
                   AdamW(fused=True) on cuda (--fused-adamw, PyTorch >= 2.0): PyTorch's
                   fast path (--no-sdpa, --no-fused-adamw turn them off). Default fp32.
  --optimizer      adamw (default: --lr 1e-3, --weight-decay 0.01, --beta1 0.9, --beta2 0.999,
                   --eps 1e-8) or sgd (--lr, --momentum 0, --weight-decay: give it, L2 as
                   torch.optim.SGD); torch.optim's own, as the engine's optimizers follow them

Every step: zero_grad(set_to_none=True), forward, cross-entropy loss (lm: next-token over all
positions), backward (DDP all-reduces the gradients, bucketed, during it), optimizer step. A
step's time is wall time on rank 0 from before zero_grad to after the optimizer step (the ranks
are in lockstep through the all-reduce); on the CPU also split into forward (zero_grad and
forward), backward (which includes DDP's wait for its all-reduces) and optimizer. Random data
are made before the timed loop. Each step's loss is the mean over the global batch (the ranks'
losses averaged once, after the last step, outside the timed loop).

Prints one JSON line on stdout:
  {"impl": "pytorch-ddp" | "pytorch-single", "model": "lm-cpu" (the preset) | "mlp", "world": N,
   "batch_per_rank": B, "step_s_mean": ..., "step_s_median": ..., "steps": S,
   "warmup": W, "threads": T, "parameters": ..., "torch": "1.13...", "step_s": [S times],
   "optimizer": "adamw lr=0.001 ... [fused]", "precision": "fp32" | "bf16", "sdpa": true | false,
   "final_loss": ...,
   per step, warm-up included (as the engine's summary.json names them): "step_time_s",
   "loss", "forward_s", "backward_s", "optimizer_s" (the last three null on cuda);
   "unit": "tokens" (lm) | "samples" (mlp), "units_per_step": global tokens or samples per step}
"""

import argparse
import contextlib
import datetime
import inspect
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import LM_PRESETS, Attention, lm_preset, make_lm, make_mlp  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["lm", "mlp"], default="lm")
    p.add_argument("--preset", default="lm-cpu", choices=list(LM_PRESETS))
    p.add_argument("--context-length", type=int, default=None, help="lm: override the preset's")
    p.add_argument("--vocab-size", type=int, default=None, help="lm: override the preset's")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="rows per rank")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (default 25)")
    for name in ["d-model", "num-layers", "num-heads", "d-ff"]:
        p.add_argument(f"--{name}", type=int, default=None, help="lm: override the preset's")
    p.add_argument("--rope-theta", type=float, default=None, help="lm: override the preset's")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=None, help="default 0.01 (adamw), 0 (sgd)")
    p.add_argument("--momentum", type=float, default=0.0, help="sgd")
    p.add_argument("--beta1", type=float, default=0.9, help="adamw")
    p.add_argument("--beta2", type=float, default=0.999, help="adamw")
    p.add_argument("--eps", type=float, default=1e-8, help="adamw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=300.0, help="process group timeout")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--sdpa", action=argparse.BooleanOptionalAction, default=None,
                   help="attention through F.scaled_dot_product_attention (default: with bf16)")
    p.add_argument("--fused-adamw", action=argparse.BooleanOptionalAction, default=None,
                   help="AdamW(fused=True) (default: with bf16 on cuda)")
    a = p.parse_args(argv)
    bf16 = a.precision == "bf16"
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    has_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters
    if a.sdpa and not has_sdpa:
        p.error(f"--sdpa needs PyTorch >= 2.0 (this is {torch.__version__})")
    if a.fused_adamw and (not has_fused or a.device != "cuda" or a.optimizer != "adamw"):
        p.error(f"--fused-adamw needs adamw on cuda and PyTorch >= 2.0 (this is {torch.__version__})")
    # Unless told: PyTorch's fast path with bf16, where this torch has it.
    a.sdpa = bf16 and has_sdpa if a.sdpa is None else a.sdpa
    if a.fused_adamw is None:
        a.fused_adamw = bf16 and has_fused and a.device == "cuda" and a.optimizer == "adamw"
    if a.world < 1 or a.batch < 1 or a.steps < 1 or a.warmup < 0 or a.threads < 1:
        p.error("--world, --batch, --steps, --threads must be >= 1 and --warmup >= 0")
    if a.model == "mlp" and (a.width < 1 or a.depth < 0 or a.classes < 2):
        p.error("mlp needs --width >= 1, --depth >= 0, --classes >= 2")
    if a.weight_decay is None:
        a.weight_decay = 0.01 if a.optimizer == "adamw" else 0.0
    if a.device == "cuda" and torch.cuda.device_count() < a.world:
        p.error(f"--device cuda --world {a.world} needs a GPU per rank; this machine has "
                f"{torch.cuda.device_count()}")
    return a


def build(a):
    """(model, loss_fn(model, batch), batches [warmup + steps], model label)."""
    n = a.warmup + a.steps
    if a.model == "lm":
        cfg = lm_preset(a.preset, context_length=a.context_length, vocab_size=a.vocab_size,
                        d_model=a.d_model, num_layers=a.num_layers, num_heads=a.num_heads,
                        d_ff=a.d_ff, rope_theta=a.rope_theta)
        model = make_lm(cfg, seed=a.seed)
        g = torch.Generator().manual_seed(a.seed + 1000 + a.rank)
        batches = [torch.randint(0, cfg["vocab_size"], (a.batch, cfg["context_length"] + 1), generator=g)
                   for _ in range(n)]

        def loss_fn(m, tokens):
            logits = m(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

        a.units = ("tokens", a.batch * a.world * cfg["context_length"])
        return model, loss_fn, batches, a.preset
    cfg = dict(width=a.width, depth=a.depth, classes=a.classes)
    model = make_mlp(cfg, seed=a.seed)
    g = torch.Generator().manual_seed(a.seed + 1000 + a.rank)
    batches = [(torch.randn(a.batch, a.width, generator=g),
                torch.randint(0, a.classes, (a.batch,), generator=g)) for _ in range(n)]

    def loss_fn(m, xy):
        return F.cross_entropy(m(xy[0]), xy[1])

    a.units = ("samples", a.batch * a.world)
    return model, loss_fn, batches, "mlp"


def to_device(batch, device):
    if isinstance(batch, tuple):
        return tuple(t.to(device) for t in batch)
    return batch.to(device)


def make_optimizer(a, params):
    if a.optimizer == "sgd":
        return (torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay),
                f"sgd lr={a.lr:g} momentum={a.momentum:g} weight_decay={a.weight_decay:g}")
    fused = {"fused": True} if a.fused_adamw else {}
    return (torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                              weight_decay=a.weight_decay, **fused),
            f"adamw lr={a.lr:g} betas=({a.beta1:g}, {a.beta2:g}) eps={a.eps:g} "
            f"weight_decay={a.weight_decay:g}" + (" fused" if fused else ""))


def global_losses(a, losses):
    """Each step's loss, averaged over the ranks (equal batches: the global batch's mean)."""
    t = torch.stack(losses).detach().to(torch.float64)
    if a.world > 1:
        dist.all_reduce(t)
        t /= a.world
    return [float(x) for x in t.cpu()]


def autocast(a):
    """--precision bf16: the forward (and so the loss) under torch.autocast."""
    if a.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=a.device, dtype=torch.bfloat16)


def train(a):
    """Runs warm-up + timed steps on this rank; returns the result dict (meaningful on rank 0)."""
    torch.set_num_threads(a.threads)
    Attention.sdpa = a.sdpa
    model, loss_fn, batches, label = build(a)
    n_params = sum(p.numel() for p in model.parameters())
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(a.rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model = model.cuda()
        batches = [to_device(b, "cuda") for b in batches]
    if a.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=a.bucket_cap_mb, device_ids=[a.rank] if cuda else None)
    opt, opt_text = make_optimizer(a, model.parameters())
    every, phases, losses = [], [], []
    for step, batch in enumerate(batches):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(a):
            loss = loss_fn(model, batch)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        every.append(t3 - t0)
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        losses.append(loss.detach())
    if not torch.isfinite(loss.detach()):
        raise RuntimeError(f"rank {a.rank}: non-finite loss {float(loss)}")
    times = every[a.warmup:]
    loss_per_step = global_losses(a, losses)
    return {
        "impl": "pytorch-ddp" if a.world > 1 else "pytorch-single",
        "model": label,
        "world": a.world,
        "batch_per_rank": a.batch,
        "step_s_mean": statistics.fmean(times),
        "step_s_median": statistics.median(times),
        "steps": a.steps,
        "warmup": a.warmup,
        "threads": a.threads,
        "device": a.device,
        "parameters": n_params,
        "final_loss": loss_per_step[-1],
        "torch": torch.__version__,
        "step_s": times,
        "optimizer": opt_text,
        "precision": a.precision,
        "sdpa": a.sdpa,
        "bucket_cap_mb": a.bucket_cap_mb if a.world > 1 else None,
        "step_time_s": every,
        # torch.cuda.max_memory_allocated(): the GPU memory its tensors peaked at (None on the CPU)
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "loss": loss_per_step,
        "forward_s": None if cuda else [p[0] for p in phases],
        "backward_s": None if cuda else [p[1] for p in phases],
        "optimizer_s": None if cuda else [p[2] for p in phases],
        "unit": a.units[0],
        "units_per_step": a.units[1],
    }


def rank_main(rank, a, port, results):
    a.rank = rank
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", rank=rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    try:
        out = train(a)
        dist.barrier()
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    a = parse_args(argv)
    # One compute thread per rank, also in the children (set before they start).
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(a.threads))
    # Gloo: the loopback interface (127.0.0.1), whatever the host name resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if a.world == 1:
        a.rank = 0
        out = train(a)
    else:
        results = mp.get_context("spawn").SimpleQueue()
        mp.spawn(rank_main, args=(a, free_port(), results), nprocs=a.world, join=True)
        out = results.get()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
