#!/usr/bin/env python3
"""A reference forward of a Hugging Face export, written for the test, in plain float64 Python.

  tests/hf_reference.py HF_DIR TRAIN_SHARD SEQUENCES

Reads HF_DIR/model.safetensors and config.json as transformers would (GPT2LMHeadModel: Conv1D
weights [in, out], fused c_attn q|k|v, tanh GELU, tied head; LlamaForCausalLM: Linear weights
[out, in], RMSNorm, rotate-half rotary embeddings, SwiGLU, untied head), and prints the mean
cross-entropy of the first SEQUENCES windows of the llm.c shard (inputs tokens[i*T:(i+1)*T],
targets one further): what keel reports as the loss of step 1 of a job that starts from
HF_DIR with data.order sequential. So the names, transposes and the rotary reorder of an
export are checked against the conventions of the field, not against keel's own reader.
(Where transformers and torch are installed the same directory loads in them too:
tests/hf_export_check.py.)
"""
import json
import math
import os
import struct
import sys


def load(dirname):
    raw = open(os.path.join(dirname, "model.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        flat = struct.unpack(f"<{(e - b) // 4}f", raw[8 + n + b:8 + n + e])
        shape = t["shape"]
        if len(shape) == 1:
            out[name] = list(flat)
        else:
            cols = shape[1]
            out[name] = [list(flat[r * cols:(r + 1) * cols]) for r in range(shape[0])]
    return out, json.load(open(os.path.join(dirname, "config.json")))


def get(w, name):
    return w[name] if name in w else w[name.split(".", 1)[1]]


def transpose(m):
    return [list(c) for c in zip(*m)]


def linear(x, rows, bias=None):  # y = rows · x (+ bias): rows is [out, in]
    y = [sum(a * b for a, b in zip(r, x)) for r in rows]
    return [a + b for a, b in zip(y, bias)] if bias else y


def layernorm(x, w, b, eps=1e-5):
    m = sum(x) / len(x)
    v = sum((a - m) ** 2 for a in x) / len(x)
    s = 1 / math.sqrt(v + eps)
    return [(a - m) * s * g + c for a, g, c in zip(x, w, b)]


def rmsnorm(x, w, eps=1e-5):
    s = 1 / math.sqrt(sum(a * a for a in x) / len(x) + eps)
    return [a * s * g for a, g in zip(x, w)]


def attend(qs, ks, vs, nh):  # causal, per head; each [T][C]
    T, C = len(qs), len(qs[0])
    hs = C // nh
    out = [[0.0] * C for _ in range(T)]
    for h in range(nh):
        sl = slice(h * hs, (h + 1) * hs)
        for t in range(T):
            q = qs[t][sl]
            sc = [sum(a * b for a, b in zip(q, ks[u][sl])) / math.sqrt(hs) for u in range(t + 1)]
            mx = max(sc)
            p = [math.exp(s - mx) for s in sc]
            z = sum(p)
            for u in range(t + 1):
                w = p[u] / z
                for i, a in enumerate(vs[u][sl]):
                    out[t][h * hs + i] += w * a
    return out


def rope(x, nh, theta):  # rotate-half, as transformers' Llama
    T, C = len(x), len(x[0])
    hs = C // nh
    out = [row[:] for row in x]
    for t in range(T):
        for h in range(nh):
            for i in range(hs // 2):
                a = t * theta ** (-2 * i / hs)
                c, s = math.cos(a), math.sin(a)
                x1, x2 = x[t][h * hs + i], x[t][h * hs + i + hs // 2]
                out[t][h * hs + i] = x1 * c - x2 * s
                out[t][h * hs + i + hs // 2] = x2 * c + x1 * s
    return out


def gpt2(w, cfg, tokens):
    C, L, nh = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]
    wte, wpe = get(w, "transformer.wte.weight"), get(w, "transformer.wpe.weight")
    x = [[a + b for a, b in zip(wte[tok], wpe[t])] for t, tok in enumerate(tokens)]
    gelu = lambda a: 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    for l in range(L):
        p = lambda n: get(w, f"transformer.h.{l}.{n}")
        h = [layernorm(r, p("ln_1.weight"), p("ln_1.bias")) for r in x]
        qkv = [linear(r, transpose(p("attn.c_attn.weight")), p("attn.c_attn.bias")) for r in h]
        y = attend([r[:C] for r in qkv], [r[C:2 * C] for r in qkv], [r[2 * C:] for r in qkv], nh)
        proj = transpose(p("attn.c_proj.weight"))
        x = [[a + b for a, b in zip(r, linear(yy, proj, p("attn.c_proj.bias")))] for r, yy in zip(x, y)]
        h = [layernorm(r, p("ln_2.weight"), p("ln_2.bias")) for r in x]
        fc, fp = transpose(p("mlp.c_fc.weight")), transpose(p("mlp.c_proj.weight"))
        m = [linear([gelu(a) for a in linear(r, fc, p("mlp.c_fc.bias"))], fp, p("mlp.c_proj.bias")) for r in h]
        x = [[a + b for a, b in zip(r, mm)] for r, mm in zip(x, m)]
    x = [layernorm(r, get(w, "transformer.ln_f.weight"), get(w, "transformer.ln_f.bias")) for r in x]
    return [linear(r, wte) for r in x]


def llama(w, cfg, tokens):
    L, nh, theta = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["rope_theta"]
    emb = get(w, "model.embed_tokens.weight")
    x = [emb[tok][:] for tok in tokens]
    silu = lambda a: a / (1 + math.exp(-a))
    for l in range(L):
        p = lambda n: get(w, f"model.layers.{l}.{n}")
        h = [rmsnorm(r, p("input_layernorm.weight")) for r in x]
        q = rope([linear(r, p("self_attn.q_proj.weight")) for r in h], nh, theta)
        k = rope([linear(r, p("self_attn.k_proj.weight")) for r in h], nh, theta)
        v = [linear(r, p("self_attn.v_proj.weight")) for r in h]
        y = attend(q, k, v, nh)
        x = [[a + b for a, b in zip(r, linear(yy, p("self_attn.o_proj.weight")))] for r, yy in zip(x, y)]
        h = [rmsnorm(r, p("post_attention_layernorm.weight")) for r in x]
        g = [linear(r, p("mlp.gate_proj.weight")) for r in h]
        u = [linear(r, p("mlp.up_proj.weight")) for r in h]
        m = [linear([silu(a) * b for a, b in zip(gg, uu)], p("mlp.down_proj.weight")) for gg, uu in zip(g, u)]
        x = [[a + b for a, b in zip(r, mm)] for r, mm in zip(x, m)]
    x = [rmsnorm(r, get(w, "model.norm.weight")) for r in x]
    return [linear(r, get(w, "lm_head.weight")) for r in x]


def main():
    w, cfg = load(sys.argv[1])
    raw = open(sys.argv[2], "rb").read()
    sequences = int(sys.argv[3])
    T = cfg.get("n_positions", cfg.get("max_position_embeddings"))
    count = struct.unpack("<i", raw[8:12])[0]
    tokens = struct.unpack(f"<{count}H", raw[1024:1024 + 2 * count])
    forward = gpt2 if cfg["model_type"] == "gpt2" else llama
    total, n = 0.0, 0
    for s in range(sequences):
        window = tokens[s * T:(s + 1) * T + 1]
        for logits, target in zip(forward(w, cfg, window[:T]), window[1:]):
            mx = max(logits)
            total += mx + math.log(sum(math.exp(a - mx) for a in logits)) - logits[target]
            n += 1
    print(f"{total / n:.9f}")


if __name__ == "__main__":
    main()
