#!/usr/bin/env python3
"""Trains a multi-token-prediction (MTP / NextN) draft head for a frozen, trained Qwen3.5 trunk.

What it trains
  One MTP block in the naming of the real Qwen3.5 checkpoints (what llama.cpp b11434's
  `conversion/qwen.py` `_QwenMtpMixin` reads): `mtp.fc.weight` [H, 2H],
  `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight` [H]
  (zero-centred, applied as x*(1+w), like every Qwen3.5 RMSNorm in HF) and `mtp.layers.0.*`, one
  full-attention decoder layer with the trunk's full-attention layer's tensor names (dense
  SwiGLU for qwen35, router + experts + gated shared expert for qwen35moe).
  Its forward is llama.cpp's `src/models/qwen35.cpp` / `qwen35moe.cpp` graph_mtp: for token
  x_p and the trunk's final hidden h_{p-1} (after `model.norm`),
      cur = fc(concat(rms(emb(x_p))*(1+enorm), rms(h_{p-1})*(1+hnorm)))      embedding first
      cur = decoder_layer(cur)       its own causal attention over the MTP entries, rope at p
      out = rms(cur)*(1+mtp.norm);  logits = lm_head(out)   (trunk's lm_head / tied embedding)
  and the logits at p predict x_{p+1}.  The trunk (embedding, lm_head included) stays frozen.

How: self-distillation
  The trunk's hidden states for the whole training stream are computed once (non-overlapping
  512-token windows) and kept on the GPU. The head is trained, for every window and p, to
  match the trunk's own next-token distribution at p: loss = KL(softmax(lm_head(h_p)) ||
  softmax(MTP logits at p)), which pushes its argmax towards the trunk's (greedy acceptance).
  Init: the decoder layer is a copy of the trunk's full-attention layer (layer 3), fc = [I | I]
  plus small noise, enorm = hnorm = 0 (scale 1), mtp.norm = the trunk's model.norm.

On what
  The models' own training text: CPython 3.11.7's standard library (.py files, sorted, each
  followed by <|endoftext|>, every 50th file from index 7 held out), as in
  `../shared/models/README.md` and `data_meta.json`. The held-out files are used only for the
  measurements below.

Measured (train_log.json), on held-out text, teacher-forced, a_{p+1} = trunk argmax at p:
  * accept1: P(argmax MTP(x_p, h_{p-1}) == a_{p+1}), all positions, and restricted to positions
    where x_p == a_p (the input token is what greedy decoding would have fed);
  * chain2: the second drafted token, feeding the head its own `out` as the next h with the
    token x_{p+1}, attending to the head's cache of the real entries plus itself;
    P(d1 ok and d2 ok) over positions where x_{p+1} == a_{p+1} (there the teacher-forced trunk
    states are the greedy ones), and P(d2 ok | d1 ok);
  * the same on the trunk's own greedy continuations of held-out prompts (every token there is
    the trunk's argmax, so these are the expected greedy acceptance rates exactly).

Subcommands (see tools/oracle/mtp_train.sh, which drives them)
  prep      --stdlib DIR --tokenizer FILE --meta data_meta.json --out DIR
            tokenises the corpus into DIR/train.u16.xz and DIR/val.u16 (uint16 token ids)
  train     --model HF_DIR --data DIR --out DIR --name NAME [--steps N ...]
            (GPU) writes DIR/NAME-mtp.safetensors (bf16, HF naming) and DIR/NAME-train_log.json
  assemble  --model HF_DIR --mtp FILE --out HF_DIR2
            the trunk checkpoint plus the MTP tensors, config.json with mtp_num_hidden_layers=1,
            ready for convert_hf_to_gguf.py (with --mtp for the sidecar, or plain for the full file)
  inspect   GGUF... (needs gguf-py on PYTHONPATH): tensor names, shapes, types and metadata keys
"""
from __future__ import annotations

import argparse
import json
import lzma
import math
import shutil
import sys
import time
from pathlib import Path

EOS = 4089


# ----------------------------------------------------------------------------- prep

def cmd_prep(a) -> None:
    import numpy as np
    from tokenizers import Tokenizer

    root = Path(a.stdlib)
    meta = json.loads(Path(a.meta).read_text())
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "site-packages" not in p.relative_to(root).parts)
    used = [f for f in files if f not in set(meta["skipped"])]
    val = used[7::50]
    if val != meta["val_files"]:
        sys.exit("held-out file list differs from data_meta.json: wrong stdlib?")
    tok = Tokenizer.from_file(a.tokenizer)
    enc = tok.encode_batch([(root / f).read_text(encoding="utf-8") for f in used],
                           add_special_tokens=False)
    tr, va, vs = [], [], set(val)
    for f, e in zip(used, enc):
        (va if f in vs else tr).extend(e.ids + [EOS])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.u16.xz").write_bytes(lzma.compress(np.array(tr, dtype=np.uint16).tobytes(), preset=6))
    np.array(va, dtype=np.uint16).tofile(out / "val.u16")
    print(f"train {len(tr)} tokens (data_meta {meta['train_tokens']}), "
          f"val {len(va)} tokens (data_meta {meta['val_tokens']})")


def load_tokens(path: Path):
    import numpy as np
    if path.suffix == ".xz":
        return np.frombuffer(lzma.decompress(path.read_bytes()), dtype=np.uint16).astype(np.int64)
    return np.fromfile(path, dtype=np.uint16).astype(np.int64)


# ----------------------------------------------------------------------------- the head

def trunk_tensors(model_dir: Path) -> dict:
    from safetensors import safe_open
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def rms(x, w, eps):
    import torch
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def make_head(cfg: dict, trunk: dict, full_layer: int, seed: int):
    """The MTP block as a torch Module whose parameter names map 1:1 onto the HF names."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    H = cfg["hidden_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 1e7))
    n_rot = int(hd * rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    moe = "num_experts" in cfg
    src = f"model.layers.{full_layer}."
    layer_names = sorted(k[len(src):] for k in trunk if k.startswith(src))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.p = nn.ParameterDict()
            for n in layer_names:
                self.p[n.replace(".", "|")] = nn.Parameter(trunk[src + n].float().clone())
            eye = torch.eye(H)
            fc = torch.cat([eye, eye], 1) + 0.01 * torch.randn(H, 2 * H, generator=g)
            self.p["fc"] = nn.Parameter(fc)
            self.p["pre_fc_norm_embedding"] = nn.Parameter(torch.zeros(H))
            self.p["pre_fc_norm_hidden"] = nn.Parameter(torch.zeros(H))
            self.p["norm"] = nn.Parameter(trunk["model.norm.weight"].float().clone())
            inv = 1.0 / (theta ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot))
            self.register_buffer("inv_freq", inv.float(), persistent=False)

        def w(self, n):
            return self.p[n.replace(".", "|")]

        def hf_state(self) -> dict:
            out = {}
            for k, v in self.p.items():
                k = k.replace("|", ".")
                name = f"mtp.layers.0.{k}" if k in layer_names else f"mtp.{k}.weight"
                out[name] = v.detach()
            return out

        # -- pieces of the decoder layer, the same arithmetic as transformers' Qwen3.5 layer
        def rope(self, x, pos):  # x [B, h, T, hd], pos [T] or [B, T]
            f = pos.float()[..., None] * self.inv_freq  # [.., T, n_rot/2]
            cos = torch.cat([f.cos(), f.cos()], -1)
            sin = torch.cat([f.sin(), f.sin()], -1)
            if cos.dim() == 3:
                cos, sin = cos[:, None], sin[:, None]
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
            xr, xp = x[..., :n_rot], x[..., n_rot:]
            x1, x2 = xr[..., : n_rot // 2], xr[..., n_rot // 2:]
            rot = torch.cat([-x2, x1], -1)
            return torch.cat([xr * cos + rot * sin, xp], -1)

        def qkv(self, x, pos):
            B, T, _ = x.shape
            h = rms(x, self.w("input_layernorm.weight"), eps)
            qg = F.linear(h, self.w("self_attn.q_proj.weight").to(h.dtype)).view(B, T, nh, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(B, T, nh * hd)
            q = rms(q, self.w("self_attn.q_norm.weight"), eps).transpose(1, 2)
            k = F.linear(h, self.w("self_attn.k_proj.weight").to(h.dtype)).view(B, T, nkv, hd)
            k = rms(k, self.w("self_attn.k_norm.weight"), eps).transpose(1, 2)
            v = F.linear(h, self.w("self_attn.v_proj.weight").to(h.dtype)).view(B, T, nkv, hd)
            v = v.transpose(1, 2)
            return self.rope(q, pos), self.rope(k, pos), v, gate

        def attn_out(self, o, gate, x):  # o [B, nh, T, hd]
            B, _, T, _ = o.shape
            o = o.transpose(1, 2).reshape(B, T, nh * hd) * torch.sigmoid(gate)
            x = x + F.linear(o, self.w("self_attn.o_proj.weight").to(o.dtype))
            h = rms(x, self.w("post_attention_layernorm.weight"), eps)
            return x + self.ffn(h)

        def ffn(self, h):
            def lin(t, n):
                return F.linear(t, self.w(n).to(t.dtype))
            if not moe:
                return lin(F.silu(lin(h, "mlp.gate_proj.weight")) * lin(h, "mlp.up_proj.weight"),
                           "mlp.down_proj.weight")
            E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
            shape = h.shape
            x = h.reshape(-1, shape[-1])
            probs = torch.softmax(lin(x, "mlp.gate.weight").float(), -1)
            top, idx = probs.topk(k, -1)
            top = top / top.sum(-1, keepdim=True)
            wts = torch.zeros_like(probs).scatter(-1, idx, top).to(x.dtype)  # [N, E]
            gw = torch.stack([self.w(f"mlp.experts.{e}.gate_proj.weight") for e in range(E)]).to(x.dtype)
            uw = torch.stack([self.w(f"mlp.experts.{e}.up_proj.weight") for e in range(E)]).to(x.dtype)
            dw = torch.stack([self.w(f"mlp.experts.{e}.down_proj.weight") for e in range(E)]).to(x.dtype)
            # every expert on every token, weighted by the (mostly zero) routing weights: exact
            # top-k MoE, dense arithmetic (the layer is tiny)
            a_ = torch.einsum("nh,eih->eni", x, gw)
            b_ = torch.einsum("nh,eih->eni", x, uw)
            y = torch.einsum("eni,ehi->enh", F.silu(a_) * b_, dw)
            out = torch.einsum("enh,ne->nh", y, wts)
            sh = lin(F.silu(lin(x, "mlp.shared_expert.gate_proj.weight")) *
                     lin(x, "mlp.shared_expert.up_proj.weight"), "mlp.shared_expert.down_proj.weight")
            out = out + torch.sigmoid(lin(x, "mlp.shared_expert_gate.weight")) * sh
            return out.reshape(shape)

        def layer(self, x, pos):
            """The decoder layer alone, causal over T (used by the self-check against the trunk)."""
            q, k, v, gate = self.qkv(x, pos)
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(nh // nkv, 1),
                                               v.repeat_interleave(nh // nkv, 1), is_causal=True)
            return self.attn_out(o, gate, x)

        def inp(self, e, h):
            en = rms(e, self.w("pre_fc_norm_embedding"), eps)
            hn = rms(h, self.w("pre_fc_norm_hidden"), eps)
            cat = torch.cat([en, hn], -1)
            return F.linear(cat, self.w("fc").to(cat.dtype))

        def forward(self, e, h, pos, want_kv=False):
            """e = emb(x_p), h = h_{p-1}: [B, T, H]; pos [T]. Returns out (after mtp.norm)."""
            x = self.inp(e, h)
            q, k, v, gate = self.qkv(x, pos)
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(nh // nkv, 1),
                                               v.repeat_interleave(nh // nkv, 1), is_causal=True)
            out = rms(self.attn_out(o, gate, x), self.w("norm"), eps)
            return (out, k, v) if want_kv else out

        def chain_step(self, e2, h2, pos2, k1, v1):
            """Second draft step for every entry i at once: input (e2_i, h2_i) at pos2_i, attending
            to the first pass's entries 0..i (k1, v1) and to itself."""
            x = self.inp(e2, h2)
            q, k, v, gate = self.qkv(x, pos2)
            T = q.shape[2]
            K = torch.cat([k1, k], 2).repeat_interleave(nh // nkv, 1)
            V = torch.cat([v1, v], 2).repeat_interleave(nh // nkv, 1)
            ar = torch.arange(T, device=q.device)
            m1 = ar[None, :] <= ar[:, None]
            m2 = ar[None, :] == ar[:, None]
            mask = torch.cat([m1, m2], 1)
            o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)
            return rms(self.attn_out(o, gate, x), self.w("norm"), eps)

    return Head()


# ----------------------------------------------------------------------------- train

def cmd_train(a) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # the trunk's targets in true float32
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mdir, data, out = Path(a.model), Path(a.data), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((mdir / "config.json").read_text())
    full_layer = cfg["layer_types"].index("full_attention")
    L = a.seq
    log = {"model": a.name, "config": {k: getattr(a, k) for k in
                                       ("steps", "batch", "seq", "lr", "warmup", "wd", "seed", "max_train_tokens",
                                        "time_budget", "gen_prompts", "gen_prompt_len", "gen_len")}}

    def say(*m):
        print(f"[{time.time() - t_start:7.1f}s]", *m, flush=True)

    trunk_model = AutoModelForCausalLM.from_pretrained(str(mdir), dtype=torch.float32).to(dev).eval()
    for p in trunk_model.parameters():
        p.requires_grad_(False)
    trunk = trunk_tensors(mdir)
    emb_w = trunk["model.embed_tokens.weight"].float().to(dev)
    lm_w = (trunk["lm_head.weight"] if "lm_head.weight" in trunk else trunk["model.embed_tokens.weight"]).float().to(dev)
    head = make_head(cfg, trunk, full_layer, a.seed).to(dev)
    say(f"trunk loaded; head params {sum(p.numel() for p in head.parameters()) / 1e6:.3f} M")

    @torch.no_grad()
    def hidden(tokens):  # [N, T] long (cpu) -> [N, T, H] float32 on dev
        outs = []
        for i in range(0, tokens.shape[0], a.trunk_batch):
            ids = tokens[i:i + a.trunk_batch].to(dev)
            outs.append(trunk_model.model(input_ids=ids, use_cache=False).last_hidden_state.float())
        return torch.cat(outs)

    # --- self-check: the head's decoder-layer arithmetic equals the trunk's layer `full_layer`
    with torch.no_grad():
        val = torch.from_numpy(load_tokens(data / "val.u16"))
        probe = val[: 4 * L].view(4, L).to(dev)
        cap = {}
        hk = trunk_model.model.layers[full_layer].register_forward_pre_hook(
            lambda m, args, kwargs: cap.__setitem__("x", args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True)
        hk2 = trunk_model.model.layers[full_layer].register_forward_hook(
            lambda m, i, o: cap.__setitem__("y", o[0] if isinstance(o, tuple) else o))
        trunk_model.model(input_ids=probe, use_cache=False)
        hk.remove(); hk2.remove()
        mine = head.layer(cap["x"].float(), torch.arange(L, device=dev))
        rel = ((mine - cap["y"].float()).norm() / cap["y"].float().norm()).item()
        say(f"self-check: head layer vs trunk layer {full_layer}: rel-L2 {rel:.2e}")
        log["selfcheck_layer_rel_l2"] = rel
        if rel > 1e-3:
            sys.exit("self-check failed: the head's layer does not reproduce the trunk's")

    # --- training windows and their trunk hidden states
    tr = load_tokens(data / "train.u16.xz" if (data / "train.u16.xz").exists() else data / "train.u16")
    if a.max_train_tokens:
        tr = tr[: a.max_train_tokens]
    n_win = len(tr) // L
    win = torch.from_numpy(tr[: n_win * L]).view(n_win, L)
    t0 = time.time()
    hid = hidden(win)
    win = win.to(dev)
    say(f"trunk hidden for {n_win} x {L} training tokens in {time.time() - t0:.1f}s "
        f"({hid.numel() * 4 / 2**30:.1f} GiB)")
    log["train_windows"], log["trunk_hidden_s"] = n_win, round(time.time() - t0, 1)

    # --- eval sets: held-out windows; trunk greedy continuations of held-out prompts
    nv = len(val) // L
    if a.max_val_windows:
        nv = min(nv, a.max_val_windows)
    vwin = val[: nv * L].view(nv, L)
    vhid = hidden(vwin)
    vwin = vwin.to(dev)
    with torch.no_grad():
        gp = vwin[:: max(1, nv // a.gen_prompts)][: a.gen_prompts, : a.gen_prompt_len].clone()
        seq = gp
        for _ in range(a.gen_len):
            lg = trunk_model(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1]
            seq = torch.cat([seq, lg.argmax(-1, keepdim=True)], 1)
        ghid = hidden(seq.cpu())
    say(f"eval sets: {nv} held-out windows; {seq.shape[0]} greedy continuations of {a.gen_len}")

    def lm(x):
        return F.linear(x, lm_w.to(x.dtype))

    @torch.no_grad()
    def evaluate(toks, hs, first=1, bs=32):
        """toks [N, T], hs [N, T, H]. Entry j of a window: input (x_{j+1}, h_j) at position j+1,
        target a_{j+2} = argmax lm(h_{j+1}). Entries whose input token index is < `first` are not
        counted (greedy set: only the generated part)."""
        acc = {k: 0.0 for k in ("n", "ok1", "n_ctx", "ok1_ctx", "n2", "ok12", "kl", "trunk_top1")}
        for i in range(0, toks.shape[0], bs):
            x, h = toks[i:i + bs], hs[i:i + bs]
            T = x.shape[1]
            a_next = lm(h).argmax(-1)                 # a_next[:, t] = a_{t+1}
            pos = torch.arange(1, T, device=dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp):
                out1, k1, v1 = head(F.embedding(x[:, 1:], emb_w), h[:, :-1], pos, want_kv=True)
                lg1 = lm(out1).float()
            d1 = lg1.argmax(-1)                       # entry j -> drafted x_{j+2}
            tgt1 = a_next[:, 1:]                      # a_{j+2}
            keep = torch.zeros_like(d1, dtype=torch.bool)
            keep[:, max(0, first - 1):] = True
            ok1 = (d1 == tgt1) & keep
            ctx = (x[:, 1:] == a_next[:, :-1]) & keep   # x_{j+1} == a_{j+1}
            pt = torch.log_softmax(lm(h[:, 1:]).float(), -1)
            kl = (pt.exp() * (pt - torch.log_softmax(lg1, -1))).sum(-1)
            acc["n"] += keep.sum().item(); acc["ok1"] += ok1.sum().item()
            acc["n_ctx"] += ctx.sum().item(); acc["ok1_ctx"] += (ok1 & ctx).sum().item()
            acc["kl"] += (kl * keep).sum().item()
            acc["trunk_top1"] += ((a_next[:, :-1] == x[:, 1:]) & keep).sum().item()
            # chain: entry j (j <= T-3): second input (x_{j+2}, out1_j) at position j+2, target a_{j+3}
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp):
                out2 = head.chain_step(F.embedding(x[:, 2:], emb_w), out1[:, :-1],
                                       torch.arange(2, T, device=dev), k1[:, :, :-1], v1[:, :, :-1])
                d2 = lm(out2).float().argmax(-1)
            valid = (x[:, 2:] == a_next[:, 1:-1]) & keep[:, :-1]   # x_{j+2} == a_{j+2}
            ok2 = (d2 == a_next[:, 2:])
            acc["n2"] += valid.sum().item()
            acc["ok12"] += (valid & ok1[:, :-1] & ok2).sum().item()
            acc["ok1_on_n2"] = acc.get("ok1_on_n2", 0) + (valid & ok1[:, :-1]).sum().item()
        r = {"positions": int(acc["n"]),
             "accept1": acc["ok1"] / acc["n"],
             "accept1_where_input_is_trunk_greedy": acc["ok1_ctx"] / max(1, acc["n_ctx"]),
             "positions_input_is_trunk_greedy": int(acc["n_ctx"]),
             "kl_trunk_to_mtp": acc["kl"] / acc["n"],
             "trunk_top1_vs_text": acc["trunk_top1"] / acc["n"],
             "chain2_positions": int(acc["n2"]),
             "chain2_both_ok": acc["ok12"] / max(1, acc["n2"]),
             "chain2_step2_ok_given_step1_ok": acc["ok12"] / max(1, acc["ok1_on_n2"]),
             "chain2_step1_ok": acc["ok1_on_n2"] / max(1, acc["n2"])}
        r["expected_accepted_of_2_drafts"] = r["chain2_step1_ok"] + r["chain2_both_ok"]
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}

    def full_eval():
        return {"heldout": evaluate(vwin, vhid),
                "trunk_greedy_continuations": evaluate(seq, ghid, first=a.gen_prompt_len),
                "train_sample": evaluate(win[:256], hid[:256])}

    log["eval_init"] = full_eval()
    say("init:", json.dumps(log["eval_init"]["heldout"]))

    # --- train
    decay = [p for n, p in head.p.items() if p.dim() >= 2]
    other = [p for n, p in head.p.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    pos = torch.arange(1, L, device=dev)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    hist, val_hist = [], []
    t0 = time.time()
    step = 0
    while step < a.steps:
        if step == 30 and a.time_budget:  # fit the schedule into the time budget
            per = (time.time() - t0) / 30
            fit = int(a.time_budget / per)
            if fit < a.steps:
                say(f"{per * 1e3:.1f} ms/step: steps {a.steps} -> {fit} to fit {a.time_budget:.0f}s")
                a.steps = max(fit, a.warmup + 1)
        lr = a.lr * (step + 1) / a.warmup if step < a.warmup else \
            a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - a.warmup) / max(1, a.steps - a.warmup))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, n_win, (a.batch,), generator=g).to(dev)
        x, h = win[idx], hid[idx]
        with torch.no_grad():
            pt = torch.log_softmax(lm(h[:, 1:]), -1)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp):
            out1 = head(F.embedding(x[:, 1:], emb_w), h[:, :-1], pos)
            lg = lm(out1).float()
        ls = torch.log_softmax(lg, -1)
        loss = (pt.exp() * (pt - ls)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            agree = (lg.argmax(-1) == pt.argmax(-1)).float().mean().item()
            hist.append({"step": step, "loss": round(loss.item(), 4), "agree": round(agree, 4), "lr": lr})
            if step % 250 == 0 or step == a.steps - 1:
                say(f"step {step} loss {loss.item():.4f} agree {agree:.4f} lr {lr:.2e}")
        if a.val_every and step % a.val_every == 0 and step:
            r = evaluate(vwin[:64], vhid[:64])
            val_hist.append({"step": step, "accept1": r["accept1"], "kl": r["kl_trunk_to_mtp"]})
            say(f"step {step} held-out (64 windows) accept1 {r['accept1']:.4f} kl {r['kl_trunk_to_mtp']:.4f}")
        step += 1
    train_s = time.time() - t0
    # measure what is shipped: weights rounded to bf16
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    log["eval_final"] = full_eval()
    say("final:", json.dumps(log["eval_final"]))
    log["steps"], log["train_s"] = a.steps, round(train_s, 1)
    log["final_loss_mean_last_10_logged"] = round(sum(r["loss"] for r in hist[-10:]) / len(hist[-10:]), 4)
    log["history"] = hist
    log["heldout64_history"] = val_hist
    log["total_s"] = round(time.time() - t_start, 1)
    from safetensors.torch import save_file
    save_file({k: v.to(torch.bfloat16).contiguous().cpu() for k, v in head.hf_state().items()},
              str(out / f"{a.name}-mtp.safetensors"), metadata={"format": "pt"})
    (out / f"{a.name}-train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    say("written", f"{a.name}-mtp.safetensors")


# ----------------------------------------------------------------------------- assemble / inspect

def cmd_assemble(a) -> None:
    from safetensors.torch import load_file, save_file

    src, dst = Path(a.model), Path(a.out)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    mtp = load_file(a.mtp)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors.index.json", "model.safetensors", "train_log.json"):
            shutil.copy(f, dst / f.name)
    idx = src / "model.safetensors.index.json"
    if idx.exists():  # sharded: the MTP tensors go into a shard of their own
        j = json.loads(idx.read_text())
        shutil.copy(a.mtp, dst / "model-mtp.safetensors")
        for k in mtp:
            j["weight_map"][k] = "model-mtp.safetensors"
        (dst / idx.name).write_text(json.dumps(j, indent=2) + "\n")
    else:
        t = load_file(str(src / "model.safetensors"))
        t.update(mtp)
        save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    conf = json.loads((src / "config.json").read_text())
    conf["mtp_num_hidden_layers"] = 1
    (dst / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    print(f"assembled {len(mtp)} MTP tensors into {dst.name}")


def cmd_inspect(a) -> None:
    import gguf

    res = {}
    for p in a.gguf:
        r = gguf.GGUFReader(p)
        kv = {}
        for f in r.fields.values():
            if f.name.startswith("tokenizer.ggml.") and f.name not in ("tokenizer.ggml.pre", "tokenizer.ggml.model"):
                continue
            try:
                v = f.contents()
            except Exception:
                v = "?"
            kv[f.name] = v
        ts = [{"name": t.name, "shape": [int(x) for x in t.shape], "type": t.tensor_type.name} for t in r.tensors]
        res[Path(p).name] = {"metadata": kv, "tensors": ts}
    print(json.dumps(res, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep")
    p.add_argument("--stdlib", required=True); p.add_argument("--tokenizer", required=True)
    p.add_argument("--meta", required=True); p.add_argument("--out", required=True)
    p = sub.add_parser("train")
    p.add_argument("--model", required=True); p.add_argument("--data", required=True)
    p.add_argument("--out", required=True); p.add_argument("--name", required=True)
    p.add_argument("--steps", type=int, default=3000); p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512); p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100); p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234); p.add_argument("--trunk-batch", type=int, default=64)
    p.add_argument("--max-train-tokens", type=int, default=0)
    p.add_argument("--max-val-windows", type=int, default=0)
    p.add_argument("--val-every", type=int, default=500)
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds for the training loop; the step count shrinks to fit (0: none)")
    p.add_argument("--gen-prompts", type=int, default=64); p.add_argument("--gen-prompt-len", type=int, default=64)
    p.add_argument("--gen-len", type=int, default=192)
    p.add_argument("--no-amp", dest="amp", action="store_false")
    p = sub.add_parser("assemble")
    p.add_argument("--model", required=True); p.add_argument("--mtp", required=True); p.add_argument("--out", required=True)
    p = sub.add_parser("inspect")
    p.add_argument("gguf", nargs="+")
    a = ap.parse_args()
    {"prep": cmd_prep, "train": cmd_train, "assemble": cmd_assemble, "inspect": cmd_inspect}[a.cmd](a)


if __name__ == "__main__":
    main()
