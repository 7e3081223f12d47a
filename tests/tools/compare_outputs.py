#!/usr/bin/env python3
"""Compares two outputs of meshtrain commands; prints the worst difference, exits 1 beyond the tolerance.
  compare_outputs.py grads A.safetensors B.safetensors TOL   every f32 value, relative to each tensor's largest magnitude
  compare_outputs.py losses A.jsonl B.jsonl TOL [rel]          per-step "loss" of two train metrics files (absolute or relative)
"""
import json
import struct
import sys


def load_f32(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        assert v["dtype"] == "F32", (path, k, v["dtype"])
        lo, hi = v["data_offsets"]
        out[k] = (v["shape"], struct.unpack(f"<{(hi - lo) // 4}f", b[8 + n + lo:8 + n + hi]))
    return out


def grads(a_path, b_path, tol):
    a, b = load_f32(a_path), load_f32(b_path)
    assert set(a) == set(b), set(a) ^ set(b)
    worst, where = 0.0, ""
    for k in a:
        assert a[k][0] == b[k][0], (k, a[k][0], b[k][0])
        scale = max(1e-30, max(abs(x) for x in a[k][1]))
        d = max(abs(x - y) for x, y in zip(a[k][1], b[k][1])) / scale
        if d > worst:
            worst, where = d, k
    print(f"max relative gradient difference {worst:.2e} ({where or 'none'})")
    return worst <= tol


def losses(a_path, b_path, tol, rel):
    a = [json.loads(line) for line in open(a_path)]
    b = [json.loads(line) for line in open(b_path)]
    assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
    diffs = [abs(x["loss"] - y["loss"]) / (abs(x["loss"]) if rel else 1.0) for x, y in zip(a, b)]
    worst = max(diffs)
    print(f"max {'relative ' if rel else ''}|loss diff| {worst:.2e} over {len(a)} steps (step {diffs.index(worst) + 1})")
    return worst <= tol


if __name__ == "__main__":
    kind, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if kind == "grads":
        ok = grads(a, b, tol)
    elif kind == "losses":
        ok = losses(a, b, tol, len(sys.argv) > 5 and sys.argv[5] == "rel")
    else:
        sys.exit(f"unknown comparison {kind}")
    sys.exit(0 if ok else 1)
