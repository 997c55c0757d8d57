"""Build step: writes build/kernels.json, the model and kernel table the server loads.

Run from the repository root: ``python build.py``. The server refuses to start
without the artifact.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

MODEL = {
    "vocab": 512,
    "d_model": 256,
    "n_layers": 4,
    "n_heads": 8,
    "d_ff": 1024,
    "max_seq": 512,
    "rope_theta": 10000.0,
    "draft_layers": 1,
    "deep_scale": 0.1,
}

COMM = {"default_chunk": 128}

# The device a forward pass is paced to when the workers run on a CPU (milliseconds):
# per layer run, per token per layer, per token per layer per 1,024 cache positions
# attended over, per collective call. The fixed cost per layer dominates a pass of
# one token, so a lone request leaves the device mostly idle (a batch, or a verify
# pass over a few draft tokens, costs little more); from about eight sequences a
# batch's tokens dominate and every extra token is paid for.
DEVICE = {"layer_ms": 2.0, "token_ms": 0.02, "attention_ms_per_1k": 0.15, "collective_ms": 0.04}

KERNELS = ["rms_norm", "rope", "masked_attention", "silu_mlp", "all_reduce"]


def source_digest() -> str:
    h = hashlib.sha256()
    for name in ("model.py", "worker.py", "serve.py", "tokenizer.py"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()


def main() -> int:
    head_dim = MODEL["d_model"] // MODEL["n_heads"]
    if MODEL["d_model"] % MODEL["n_heads"]:
        print(f"build error: d_model {MODEL['d_model']} is not divisible by n_heads {MODEL['n_heads']}",
              file=sys.stderr)
        return 1
    out = HERE / "build"
    out.mkdir(exist_ok=True)
    artifact = {
        "format": 1,
        "model": MODEL,
        "comm": COMM,
        "device": DEVICE,
        "kernels": [{"name": k, "head_dim": head_dim} for k in KERNELS],
        "source_digest": source_digest(),
    }
    tmp = out / "kernels.json.tmp"
    tmp.write_text(json.dumps(artifact, indent=2) + "\n")
    tmp.replace(out / "kernels.json")
    print(f"build: wrote {out / 'kernels.json'} ({len(KERNELS)} kernels, head_dim={head_dim})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
