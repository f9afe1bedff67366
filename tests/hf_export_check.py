#!/usr/bin/env python3
"""Checks a `keel-ckpt export --format hf` directory as a Hugging Face loader would see it.

  tests/hf_export_check.py OUT gpt2|llama LAYERS HIDDEN

model.safetensors: an 8-byte little-endian header length, a JSON header whose every tensor is
F32 with data_offsets that tile the data exactly; names and shapes of GPT2LMHeadModel
(transformer.h.<l>.attn.c_attn.weight is [C, 3C], Conv1D keeps [in, out]) or LlamaForCausalLM
(model.layers.<l>.self_attn.q_proj.weight is [C, C]); config.json's model_type and layer count.
Where `import transformers, torch` works, the directory is also loaded with from_pretrained
and run on a fixed batch (finite logits of the right shape); otherwise that part is skipped,
saying why. Prints one line; exit 0 when the header checks pass.
"""
import json
import os
import struct
import sys


def main():
    out, kind, layers, hidden = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    raw = open(os.path.join(out, "model.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    data = len(raw) - 8 - n
    names = [k for k in head if k != "__metadata__"]
    spans = sorted(tuple(head[k]["data_offsets"]) for k in names)
    bad = [k for k in names if head[k]["dtype"] != "F32"]
    if bad:
        sys.exit(f"FAIL: {bad[0]} is {head[bad[0]]['dtype']}, not F32")
    at = 0
    for b, e in spans:
        if b != at:
            sys.exit(f"FAIL: data_offsets leave a gap or overlap at byte {at}")
        at = e
    if at != data:
        sys.exit(f"FAIL: tensors hold {at} bytes, the file's data {data}")
    for k in names:
        count = 1
        for d in head[k]["shape"]:
            count *= d
        b, e = head[k]["data_offsets"]
        if e - b != 4 * count:
            sys.exit(f"FAIL: {k}: shape {head[k]['shape']} but {e - b} bytes")
    cfg = json.load(open(os.path.join(out, "config.json")))
    if kind == "gpt2":
        probe, want, nl = "transformer.h.0.attn.c_attn.weight", [hidden, 3 * hidden], cfg.get("n_layer")
    else:
        probe, want, nl = "model.layers.0.self_attn.q_proj.weight", [hidden, hidden], cfg.get(
            "num_hidden_layers")
    if cfg.get("model_type") != kind or nl != layers:
        sys.exit(f"FAIL: config.json model_type {cfg.get('model_type')}, layers {nl}")
    if probe not in head or head[probe]["shape"] != want:
        sys.exit(f"FAIL: {probe}: {head.get(probe, {}).get('shape')}, want {want}")
    line = f"ok: {len(names)} F32 tensors, {data} bytes, model_type {kind}"
    try:
        import torch
        import transformers
    except ImportError as e:
        print(line + f"; transformers load skipped: {e}")
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    tokens = torch.tensor([[(7 * i + 3) % cfg["vocab_size"] for i in range(16)]])
    logits = model(tokens).logits
    if logits.shape != (1, 16, cfg["vocab_size"]) or not torch.isfinite(logits).all():
        sys.exit(f"FAIL: transformers logits {tuple(logits.shape)}")
    print(line + f"; transformers {transformers.__version__} loads it: logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
