"""The transformers side of the oracle: float32 logits, greedy continuations, router margins and
the amplification measurement (logit change per unit of injected relative noise)."""
from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def logits(model, ids: list[int]) -> np.ndarray:
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens: the first from the prompt's last position, then one cached decode each.
    Plain argmax, no eos handling, so it lines up with llama_logits' loop."""
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    past = out.past_key_values
    tok = int(out.logits[0, -1].argmax())
    gen = [tok]
    for _ in range(n - 1):
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = int(out.logits[0, -1].argmax())
        gen.append(tok)
    return gen


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − b‖ / ‖b‖ (b is the reference)."""
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def rel_l2_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def _routers(model):
    return [(name, m) for name, m in model.named_modules()
            if name.endswith("mlp.gate") and hasattr(m, "weight") and hasattr(m, "top_k")]


@torch.no_grad()
def router_margins(model, ids: list[int]) -> np.ndarray | None:
    """[n_pos, n_moe_layers]: the softmax probability of the k-th chosen expert minus that of the
    best unchosen one. A small margin means a tiny arithmetic difference can swap an expert, the
    usual cause of an MoE greedy divergence that is not a bug."""
    routers = _routers(model)
    if not routers:
        return None
    margins = []
    hooks = []

    def hook(mod, args):
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        p = torch.softmax(x @ mod.weight.float().T, dim=-1)
        top = torch.topk(p, mod.top_k + 1, dim=-1).values
        margins.append((top[:, mod.top_k - 1] - top[:, mod.top_k]).numpy())

    for _, m in routers:
        hooks.append(m.register_forward_pre_hook(hook))
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return np.stack(margins, axis=1)


def _matmul_inputs(model):
    """Modules whose first input is the activation a matmul consumes: every nn.Linear and the
    fused MoE expert blocks (their weights are plain parameters, not nn.Linear)."""
    mods = []
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) or type(m).__name__.endswith("Experts"):
            mods.append(m)
    return mods


@torch.no_grad()
def amplification(model, prompts: list[list[int]], eps: float, kind: str, seed: int) -> dict:
    """Logit change per unit of injected relative noise: rel-L2(noisy, clean) / eps.

    kind "act": every matmul input x becomes x + eps * rms(x) * N(0, 1) per element; the model of
    activation quantization (Q8_0 / Q8_K / bf16 rounding of what a matmul reads).
    kind "weight": every weight matrix W becomes W * (1 + eps * N(0, 1)) elementwise; the model
    of weight quantization.

    Returns "all" (over every position of every prompt), "median" and "max" (per position). In an
    MoE the two can differ by 10x: noise that swaps an expert at one position moves that
    position's logits by a fixed amount whatever eps was, so "max" and "all" are not linear in
    eps there, while "median" (positions where routing held) is."""
    g = torch.Generator().manual_seed(seed)
    clean = [logits(model, p) for p in prompts]
    hooks = []
    saved = {}
    if kind == "act":
        def hook(mod, args):
            x = args[0]
            rms = x.float().pow(2).mean().sqrt()
            noise = torch.randn(x.shape, generator=g, dtype=torch.float32) * (eps * rms)
            return (x + noise.to(x.dtype),) + tuple(args[1:])

        for m in _matmul_inputs(model):
            hooks.append(m.register_forward_pre_hook(hook))
    elif kind == "weight":
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                saved[name] = p.detach().clone()
                p.mul_(1 + eps * torch.randn(p.shape, generator=g))
    else:
        raise ValueError(kind)
    try:
        noisy = [logits(model, p) for p in prompts]
    finally:
        for h in hooks:
            h.remove()
        for name, p in model.named_parameters():
            if name in saved:
                p.copy_(saved[name])
    num = np.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(noisy, clean)))
    den = np.sqrt(sum(float(np.sum(b ** 2)) for b in clean))
    rows = np.concatenate([rel_l2_rows(a, b) for a, b in zip(noisy, clean)])
    return {"all": float(num / den / eps), "median": float(np.median(rows) / eps),
            "max": float(rows.max() / eps)}


@torch.no_grad()
def bug_sensitivity(model, prompts: list[list[int]]) -> dict[str, float]:
    """How far the logits move (rel-L2 over all positions) under bugs an engine could have.
    Each must land far above every tier's tolerance, or the fixture could not catch it."""
    clean = [logits(model, p) for p in prompts]

    def moved():
        new = [logits(model, p) for p in prompts]
        num = np.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(new, clean)))
        return float(num / np.sqrt(sum(float(np.sum(b ** 2)) for b in clean)))

    params = dict(model.named_parameters())
    bugs = {
        # a zero-centred norm applied as plain multiply (the +1 missed)
        "norm_missing_plus1": [n for n, p in params.items() if "norm" in n and p.dim() == 1
                               and not n.endswith("linear_attn.norm.weight")],
        # the dt bias dropped from softplus(a + dt_bias)
        "dt_bias_dropped": [n for n in params if n.endswith("dt_bias")],
        # the decay rate's magnitude wrong: A_log - 1, i.e. A = exp(A_log) scaled by 1/e (a sign
        # error in -exp(A_log) makes the state grow without bound, which nothing can miss)
        "ssm_a_scaled": [n for n in params if n.endswith("A_log")],
    }
    out = {}
    for bug, names in bugs.items():
        if not names:
            continue
        saved = {n: params[n].detach().clone() for n in names}
        for n in names:
            if bug == "norm_missing_plus1":
                params[n].sub_(1.0)
            elif bug == "dt_bias_dropped":
                params[n].zero_()
            else:
                params[n].sub_(1.0)
        out[bug] = moved()
        for n in names:
            params[n].copy_(saved[n])
    return out


def _fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """What ggml does to a matmul's f32 input before a quantized dot: Q8_0 (blocks of 32,
    d = amax / 127 stored as f16), Q8_K (blocks of 256, scale -127 / signed max, f32), or bf16
    rounding. Returned dequantized, so the rest of the model sees the rounded activation."""
    if fmt == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    block = 32 if fmt == "q8_0" else 256
    if x.shape[-1] % block:
        return x
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    if fmt == "q8_0":
        d = (xb.abs().amax(-1, keepdim=True) / 127).to(torch.float16).float()
        q = torch.where(d > 0, torch.round(xb / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(xb))
        out = q * d
    else:
        idx = xb.abs().argmax(-1, keepdim=True)
        mx = torch.gather(xb, -1, idx)
        iscale = torch.where(mx != 0, -127.0 / torch.where(mx != 0, mx, torch.ones_like(mx)), torch.zeros_like(mx))
        q = torch.clamp(torch.round(iscale * xb), max=127)
        out = torch.where(iscale != 0, q / torch.where(iscale != 0, iscale, torch.ones_like(iscale)), torch.zeros_like(xb))
    return out.reshape(x.shape).to(x.dtype)


@torch.no_grad()
def act_quant_effect(model, prompts: list[list[int]], fmt: str) -> dict:
    """rel-L2 (per position median and max) between the float32 model and the same weights with
    every matmul input rounded as ggml rounds it for `fmt`: the size of the effect a quantized
    tier must reproduce, so its tolerance can be set well below it."""
    clean = [logits(model, p) for p in prompts]
    hooks = [m.register_forward_pre_hook(lambda mod, args: (_fake_quant(args[0], fmt),) + tuple(args[1:]))
             for m in _matmul_inputs(model)]
    try:
        noisy = [logits(model, p) for p in prompts]
    finally:
        for h in hooks:
            h.remove()
    rows = np.concatenate([rel_l2_rows(a, b) for a, b in zip(noisy, clean)])
    return {"median": float(np.median(rows)), "max": float(rows.max())}
