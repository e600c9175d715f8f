"""PyTorch reference implementations of the engine's `lm` and `mlp` models.

Spec: docs/models.md. Shared by tests/fixtures/make_lm_fixtures.py
(the golden fixtures) and tools/pytorch_ddp_bench.py (the PyTorch DDP
baseline), so that both use exactly the same definitions.

  lm:   decoder-only pre-norm Transformer (RMSNorm, RoPE, causal attention,
        SwiGLU), no biases; parameters in the spec's named_parameters() order
        (token_embeddings.weight, layers.{i}.{ln1,attn.{q,k,v,output}_proj,ln2,
        ffn.{w1,w2,w3}}.weight, ln_final.weight, lm_head.weight).
        make_lm(cfg, seed) builds it with the spec's initialisation.
  mlp:  `depth` x (nn.Linear(width, width) + ReLU), then head nn.Linear(width,
        classes); parameters layers.{i}.weight/bias, head.weight/bias.
        make_mlp(cfg, seed) seeds torch then constructs (nn.Linear's init).

Weights as PyTorch: y = x W^T (+ b), W is [out, in]. float32 throughout,
except the RoPE cos/sin tables, computed in float64 and rounded once, and
the matrix products under `rounded_matmuls(dtype)`: the engine's emulated
mixed precision ([precision] compute; docs/precision.md), where every
matrix product, forward and backward, takes its two inputs rounded to
bfloat16 or float16 (round to nearest even, torch's .to()) and multiplies
and accumulates in float32; and where what backward keeps of RMSNorm's
input, of SwiGLU's two inputs, of attention's softmax and of the mlp's
ReLU is kept rounded to that dtype, as the engine stores it (forward
itself runs on the float32 values).

LM_PRESETS holds the spec's named sizes as keyword arguments for LM / make_lm
(the same values as the engine's engine/models/lm.cpp lm_preset()).

Importing this module changes no torch state (no seeding, no thread settings).
Needs torch only (Debian's python3-torch 1.13 is what the fixtures were made with).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "LM_PRESETS", "lm_preset",
    "Linear", "Embedding", "RMSNorm", "rope_tables", "apply_rope", "Attention", "SwiGLU", "Block",
    "LM", "lm_param_names", "make_lm", "lm_loss",
    "MLPModel", "mlp_param_names", "make_mlp", "mlp_loss",
    "rounded_matmuls", "matmul",
]


def _lm(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=10000.0):
    return dict(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                num_layers=num_layers, num_heads=num_heads, d_ff=d_ff, rope_theta=rope_theta)


# The spec's presets (vocab 10000 except lm-tiny; the GPT-2-like sizes use context 256,
# the CS336 benchmarking setting, as the engine does).
LM_PRESETS = {
    "lm-tiny": _lm(512, 32, 64, 2, 4, 256),
    "lm-cpu": _lm(10000, 128, 256, 4, 4, 1024),
    "small": _lm(10000, 256, 768, 12, 12, 3072),
    "medium": _lm(10000, 256, 1024, 24, 16, 4096),
    "large": _lm(10000, 256, 1280, 36, 20, 5120),
    "xl": _lm(10000, 256, 1600, 48, 25, 6400),
    "2.7B": _lm(10000, 256, 2560, 32, 32, 10240),
}


def lm_preset(name, **overrides):
    """The preset's hyper-parameters (a fresh dict); overrides that are not None replace them."""
    if name not in LM_PRESETS:
        raise ValueError(f"unknown lm preset '{name}' (known: {', '.join(LM_PRESETS)})")
    cfg = dict(LM_PRESETS[name])
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError(f"unknown lm hyper-parameter '{k}'")
        if v is not None:
            cfg[k] = v
    return cfg


# ---------------------------------------------------------------------------
# Emulated mixed precision: the engine's [precision] compute on the CPU
# ---------------------------------------------------------------------------

_ROUND_TO = None  # None: matrix products as they are (float32)


class rounded_matmuls:
    """Within `with rounded_matmuls(torch.bfloat16):` every matmul() below
    rounds its inputs to that dtype, forward and backward (the engine's
    engine/models/gemm.h), and the activations backward keeps are kept
    rounded to it (_KeptRounded: engine/models/lm.h, mlp.h)."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        global _ROUND_TO
        self.before, _ROUND_TO = _ROUND_TO, self.dtype

    def __exit__(self, *exc):
        global _ROUND_TO
        _ROUND_TO = self.before


class _RoundedMatmul(torch.autograd.Function):
    """a @ b with a and b rounded to `dtype` and back to float32; its
    backward rounds the incoming gradient likewise before each product:
    grad_a = r(g) r(b)^T, grad_b = r(a)^T r(g). 2-D, or batched with both
    operands batched alike."""

    @staticmethod
    def forward(ctx, a, b, dtype):
        ra, rb = a.to(dtype).float(), b.to(dtype).float()
        ctx.save_for_backward(ra, rb)
        ctx.dtype = dtype
        return ra @ rb

    @staticmethod
    def backward(ctx, g):
        ra, rb = ctx.saved_tensors
        rg = g.to(ctx.dtype).float()
        return rg @ rb.transpose(-1, -2), ra.transpose(-1, -2) @ rg, None


def matmul(a, b):
    """a @ b, its inputs rounded under rounded_matmuls (a 2-D b with a
    batched a is taken as one product over the rows of a)."""
    if _ROUND_TO is None:
        return a @ b
    if b.dim() == 2 and a.dim() > 2:
        return _RoundedMatmul.apply(a.reshape(-1, a.shape[-1]), b, _ROUND_TO).reshape(*a.shape[:-1], b.shape[-1])
    return _RoundedMatmul.apply(a, b, _ROUND_TO)


def _r(t):
    """t rounded to the compute dtype and back to float32 (what the engine keeps)."""
    return t.to(_ROUND_TO).float()


class _RMSNormKept(torch.autograd.Function):
    """RMSNorm whose backward reads x rounded (the float32 rms of the
    unrounded x is kept as is): the engine's layers::rmsnorm_backward,
    dx = g dy / r - x sum(g dy x) / (d r^3), dg = sum over rows dy x / r."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        r = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(_r(x), r, weight)
        return x / r * weight

    @staticmethod
    def backward(ctx, dy):
        x, r, g = ctx.saved_tensors
        inv = 1.0 / r
        c = (g * dy * x).sum(dim=-1, keepdim=True) * inv * inv * inv / x.shape[-1]
        dg = (dy * x * inv).reshape(-1, x.shape[-1]).sum(dim=0)
        return g * dy * inv - x * c, dg, None


class _SwiGLUKept(torch.autograd.Function):
    """silu(a) * b, its backward reading a and b rounded (layers::swiglu_backward)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(_r(a), _r(b))
        return a * torch.sigmoid(a) * b

    @staticmethod
    def backward(ctx, dout):
        z, b = ctx.saved_tensors
        s = torch.sigmoid(z)
        return dout * b * s * (1.0 + z * (1.0 - s)), dout * z * s


class _SoftmaxKept(torch.autograd.Function):
    """softmax over the last dimension, its backward reading p rounded:
    ds = p (dp - sum(p dp))."""

    @staticmethod
    def forward(ctx, scores):
        p = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(_r(p))
        return p

    @staticmethod
    def backward(ctx, dp):
        (p,) = ctx.saved_tensors
        return p * (dp - (p * dp).sum(dim=-1, keepdim=True))


class _ReluKept(torch.autograd.Function):
    """relu, its backward masking by the rounded output (layers::relu_backward)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.save_for_backward(_r(y))
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return torch.where(y > 0, dy, torch.zeros_like(dy))


# ---------------------------------------------------------------------------
# lm: decoder-only Transformer (spec: docs/models.md, `lm`)
# ---------------------------------------------------------------------------

class Linear(nn.Module):
    """Bias-free linear layer, weight [out, in]."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, dtype=torch.float32))

    def forward(self, x):
        return matmul(x, self.weight.t())


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, dim, dtype=torch.float32))

    def forward(self, ids):
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, dtype=torch.float32))

    def forward(self, x):
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.to(torch.float32)  # upcast low precision; float32 (and the float64 check) as is
        if _ROUND_TO is not None:
            return _RMSNormKept.apply(x, self.weight, self.eps)
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def rope_tables(context_length, d_head, theta):
    """cos/sin [context_length, d_head/2]: angle(pos, k) = pos / theta^(2k/d_head).
    Computed in float64, rounded once to float32."""
    k = torch.arange(d_head // 2, dtype=torch.float64)
    pos = torch.arange(context_length, dtype=torch.float64)
    ang = pos[:, None] / (theta ** (2.0 * k / d_head))[None, :]
    return torch.cos(ang).to(torch.float32), torch.sin(ang).to(torch.float32)


def apply_rope(x, cos, sin):
    """x [..., T, d_head]; rotate adjacent pairs (2k, 2k+1)."""
    a = x[..., 0::2]
    b = x[..., 1::2]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    return torch.stack((ra, rb), dim=-1).flatten(-2)


class Attention(nn.Module):
    # True: causal attention through F.scaled_dot_product_attention (PyTorch
    # 2.0 or newer: the fused kernels, no T x T scores in memory), as a user's
    # bf16 baseline runs it (tools/pytorch_ddp_bench.py --sdpa); the same
    # function, another summation order. False (the fixtures'): the explicit
    # softmax below.
    sdpa = False

    def __init__(self, d_model, num_heads, context_length, theta):
        super().__init__()
        self.h = num_heads
        self.dh = d_model // num_heads
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)
        cos, sin = rope_tables(context_length, self.dh, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, D = x.shape

        def heads(t):
            return t.view(B, T, self.h, self.dh).transpose(1, 2)  # [B, H, T, dh]

        q = heads(self.q_proj(x))
        k = heads(self.k_proj(x))
        v = heads(self.v_proj(x))
        q = apply_rope(q, self.cos[:T], self.sin[:T])
        k = apply_rope(k, self.cos[:T], self.sin[:T])
        if Attention.sdpa:
            # (RoPE's float32 tables make q and k float32 under autocast; v
            # is its dtype: the fast kernels take one dtype.)
            o = F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, is_causal=True)
            return self.output_proj(o.transpose(1, 2).reshape(B, T, D))
        scores = matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        att = torch.softmax(scores, dim=-1) if _ROUND_TO is None else _SoftmaxKept.apply(scores)
        o = matmul(att, v).transpose(1, 2).reshape(B, T, D)
        return self.output_proj(o)


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x):
        a = self.w1(x)
        if _ROUND_TO is not None:
            return self.w2(_SwiGLUKept.apply(a, self.w3(x)))
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, context_length, theta):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = Attention(d_model, num_heads, context_length, theta)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class LM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                 rope_theta):
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            [Block(d_model, num_heads, d_ff, context_length, rope_theta)
             for _ in range(num_layers)])
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def lm_param_names(num_layers):
    names = ["token_embeddings.weight"]
    for i in range(num_layers):
        p = f"layers.{i}."
        names += [p + "ln1.weight", p + "attn.q_proj.weight", p + "attn.k_proj.weight",
                  p + "attn.v_proj.weight", p + "attn.output_proj.weight", p + "ln2.weight",
                  p + "ffn.w1.weight", p + "ffn.w2.weight", p + "ffn.w3.weight"]
    return names + ["ln_final.weight", "lm_head.weight"]


def make_lm(cfg, seed):
    m = LM(**cfg)
    got = [n for n, _ in m.named_parameters()]
    assert got == lm_param_names(cfg["num_layers"]), got
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n == "token_embeddings.weight":
                nn.init.trunc_normal_(p, mean=0.0, std=1.0, a=-3.0, b=3.0)
            elif p.dim() == 1:
                p.fill_(1.0)  # RMSNorm gain
            else:
                d_out, d_in = p.shape
                std = math.sqrt(2.0 / (d_in + d_out))
                nn.init.trunc_normal_(p, mean=0.0, std=std, a=-3.0 * std, b=3.0 * std)
    return m


def lm_loss(model, tokens):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


# ---------------------------------------------------------------------------
# mlp
# ---------------------------------------------------------------------------

class MLPModel(nn.Module):
    def __init__(self, width, depth, classes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width, bias=True) for _ in range(depth)])
        self.head = nn.Linear(width, classes, bias=True)

    def forward(self, x):
        def linear(layer, h):  # nn.Linear, its product rounded under rounded_matmuls
            return layer(h) if _ROUND_TO is None else matmul(h, layer.weight.t()) + layer.bias

        h = x
        for layer in self.layers:
            h = linear(layer, h)
            h = F.relu(h) if _ROUND_TO is None else _ReluKept.apply(h)
        return linear(self.head, h)


def mlp_param_names(depth):
    names = []
    for i in range(depth):
        names += [f"layers.{i}.weight", f"layers.{i}.bias"]
    return names + ["head.weight", "head.bias"]


def make_mlp(cfg, seed):
    torch.manual_seed(seed)
    m = MLPModel(**cfg)
    got = [n for n, _ in m.named_parameters()]
    assert got == mlp_param_names(cfg["depth"]), got
    return m


def mlp_loss(model, x, y):
    logits = model(x)
    return logits, F.cross_entropy(logits, y)

