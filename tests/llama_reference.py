#!/usr/bin/env python3
"""Checks the Llama example plugin's forward loss against an independent reference.

keel_model_test's LlamaPlugin.DumpForTorchReference writes the plugin's parameters, one batch
and the loss the plugin computed on it; this script rebuilds the same model (RMSNorm, rotary
q/k with pairs (2i, 2i+1) rotated by t*theta^(-2i/HS), causal attention, SwiGLU, untied head,
cross-entropy over the real vocabulary) and compares the losses to 1e-5 relative.

  tests/llama_reference.py --test-binary build/bin/keel_model_test --impl torch
  tests/llama_reference.py --test-binary build/bin/keel_model_test --impl python

--impl torch (PyTorch, float64) exits 77 with "skipped: torch not installed" when `import
torch` fails (CTest's SKIP_RETURN_CODE); --impl python is the same model in plain float64
Python, which runs everywhere.
"""
import argparse
import array
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77


def load_dump(test_binary):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "llama.dump")
        env = dict(os.environ, KEEL_LLAMA_DUMP=path)
        proc = subprocess.run(
            [test_binary, "--gtest_filter=LlamaPlugin.DumpForTorchReference"],
            env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(path):
            sys.exit("the dump test failed:\n" + proc.stdout + proc.stderr)
        with open(path, "rb") as f:
            header = json.loads(f.readline())
            blob = array.array("f")
            blob.frombytes(f.read())
    tensors, at = {}, 0
    for t in header["tensors"]:
        n = math.prod(t["shape"])
        tensors[t["name"]] = (t["shape"], blob[at:at + n].tolist())
        at += n
    if at != len(blob):
        sys.exit(f"dump holds {len(blob)} floats, the header describes {at}")
    return header, tensors


def loss_torch(h, tensors):
    import torch
    import torch.nn.functional as F

    d = torch.float64
    P = {k: torch.tensor(v, dtype=d).reshape(shape) for k, (shape, v) in tensors.items()}
    B, T, C, NH = h["B"], h["T"], h["hidden_size"], h["num_heads"]
    HS, V, eps, theta = C // NH, h["vocab_size"], h["rms_eps"], h["rope_theta"]
    tokens = torch.tensor(h["tokens"]).reshape(B, T)
    targets = torch.tensor(h["targets"]).reshape(B, T)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    freqs = theta ** (-torch.arange(0, HS, 2, dtype=d) / HS)  # [HS/2]
    ang = torch.arange(T, dtype=d)[:, None] * freqs[None, :]  # [T, HS/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

    def rope(x):  # [B, T, NH, HS]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    x = P["embed.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(h["num_layers"]):
        p = lambda n: P[f"h.{l}.{n}"]  # noqa: E731
        qkv = rms(x, p("attn_norm.weight")) @ p("attn.qkv.weight").T
        q, k, v = (t.reshape(B, T, NH, HS) for t in qkv.split(C, dim=-1))
        q, k = rope(q).transpose(1, 2), rope(k).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.proj.weight").T
        gate, up = (rms(x, p("mlp_norm.weight")) @ p("mlp.gate_up.weight").T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ p("mlp.down.weight").T
    logits = rms(x, P["norm.weight"]) @ P["lm_head.weight"].T
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1)).item()


def loss_python(h, tensors):
    B, T, C, NH = h["B"], h["T"], h["hidden_size"], h["num_heads"]
    HS, V, Fd, eps, theta = C // NH, h["vocab_size"], h["ffn_hidden_size"], h["rms_eps"], h["rope_theta"]

    def mat(name):  # rows of a 2-D tensor
        shape, v = tensors[name]
        return [v[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]

    def vec(name):
        return tensors[name][1]

    def matvec(W, x):
        return [sum(w * xi for w, xi in zip(row, x)) for row in W]

    def rms(x, w):
        s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        return [v * s * wi for v, wi in zip(x, w)]

    def rope(x, t):  # one head, in place
        for i in range(HS // 2):
            a = t * theta ** (-2.0 * i / HS)
            x0, x1 = x[2 * i], x[2 * i + 1]
            x[2 * i], x[2 * i + 1] = x0 * math.cos(a) - x1 * math.sin(a), x0 * math.sin(a) + x1 * math.cos(a)

    embed = mat("embed.weight")
    total = 0.0
    for b in range(B):
        xs = [list(embed[h["tokens"][b * T + t]]) for t in range(T)]
        for l in range(h["num_layers"]):
            W = {n: mat(f"h.{l}.{n}") for n in ("attn.qkv.weight", "attn.proj.weight",
                                                 "mlp.gate_up.weight", "mlp.down.weight")}
            qs, ks, vs = [], [], []
            for t, x in enumerate(xs):
                qkv = matvec(W["attn.qkv.weight"], rms(x, vec(f"h.{l}.attn_norm.weight")))
                heads = [[qkv[j * C + hh * HS:j * C + (hh + 1) * HS] for hh in range(NH)] for j in range(3)]
                for hh in range(NH):
                    rope(heads[0][hh], t)
                    rope(heads[1][hh], t)
                qs.append(heads[0]), ks.append(heads[1]), vs.append(heads[2])
            new = []
            for t, x in enumerate(xs):
                y = []
                for hh in range(NH):
                    s = [sum(a * c for a, c in zip(qs[t][hh], ks[j][hh])) / math.sqrt(HS) for j in range(t + 1)]
                    m = max(s)
                    e = [math.exp(v - m) for v in s]
                    z = sum(e)
                    y += [sum(e[j] / z * vs[j][hh][i] for j in range(t + 1)) for i in range(HS)]
                x = [a + c for a, c in zip(x, matvec(W["attn.proj.weight"], y))]
                gu = matvec(W["mlp.gate_up.weight"], rms(x, vec(f"h.{l}.mlp_norm.weight")))
                hid = [g / (1.0 + math.exp(-g)) * u for g, u in zip(gu[:Fd], gu[Fd:])]
                new.append([a + c for a, c in zip(x, matvec(W["mlp.down.weight"], hid))])
            xs = new
        head = mat("lm_head.weight")[:V]
        for t, x in enumerate(xs):
            logits = matvec(head, rms(x, vec("norm.weight")))
            m = max(logits)
            lse = m + math.log(sum(math.exp(v - m) for v in logits))
            total += lse - logits[h["targets"][b * T + t]]
    return total / (B * T)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test-binary", required=True, help="keel_model_test")
    ap.add_argument("--impl", choices=["torch", "python"], default="torch")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    if a.impl == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("skipped: torch not installed")
            return SKIP
    header, tensors = load_dump(a.test_binary)
    want = (loss_torch if a.impl == "torch" else loss_python)(header, tensors)
    got = header["loss"]
    rel = abs(got - want) / abs(want)
    print(f"keel llama plugin loss {got:.9f}, {a.impl} reference {want:.9f}, relative {rel:.2e}")
    if not rel <= a.rtol:
        print(f"FAIL: relative difference above {a.rtol}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
