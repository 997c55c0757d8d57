"""Make the experiment's two models beside this file (models/, ignored by git): a
random-weight f16 Llama of TinyLlama's shape (22 layers, 2048 wide, 32 heads, 4 KV
heads, 5632 FFN; a small word vocabulary) and, as its draft, a truncated copy of it
(its first 2 layers, the same embeddings and head)."""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "tests"))
from tinygguf import build_tiny_gguf  # noqa: E402

shape = dict(layers=22, hidden=2048, heads=32, kv_heads=4, ff=5632, ctx=4096, seed=0, f16=True)
build_tiny_gguf(here / "models" / "target.gguf", **shape)
build_tiny_gguf(here / "models" / "draft.gguf", keep_layers=2, **shape)
print("models:", *(f"{p.name} {p.stat().st_size / 2**30:.2f} GiB" for p in sorted((here / "models").glob("*.gguf"))))
