"""A tiny random-weight Llama as a GGUF file, for llama.cpp's ``llama-server``.

Written with the ``gguf`` package (llama.cpp's own writer); nothing downloaded.
The vocabulary is SentencePiece-shaped (``tokenizer.ggml.model = llama``): the
three special tokens, the 256 byte tokens llama.cpp falls back on, then the
word list of ``tinyllama`` as ``▁word`` pieces. ``layers`` below the target's
gives a draft model that is a truncated copy of it (the same first layers,
embeddings and head), as a speculative-decoding draft is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tinyllama import WORDS


def _vocab() -> tuple[list[str], list[float], list[int]]:
    import gguf

    T = gguf.TokenType
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [T.UNKNOWN, T.CONTROL, T.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(T.BYTE)
    for i, w in enumerate(dict.fromkeys(WORDS)):
        tokens.append("\u2581" + w)
        scores.append(-1.0 - i * 1e-3)
        types.append(T.NORMAL)
    return tokens, scores, [int(t) for t in types]


def build_tiny_gguf(path: str | Path, *, layers: int = 2, hidden: int = 64, heads: int = 2, kv_heads: int = 2,
                    ff: int = 128, ctx: int = 512, seed: int = 0, keep_layers: int | None = None,
                    f16: bool = False) -> Path:
    """Write the model to ``path``. The weights are drawn for ``layers`` layers from
    ``seed``; ``keep_layers`` writes only the first of them (a truncated copy);
    ``f16`` stores the matrices as float16 (norms stay float32, as llama.cpp's converter does)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab, hd = len(tokens), hidden // heads
    kept = layers if keep_layers is None else keep_layers

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(np.float16 if f16 else np.float32)

    tensors: list[tuple[str, np.ndarray]] = [("token_embd.weight", w(n_vocab, hidden))]
    for i in range(layers):
        block = [(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32)),
                 (f"blk.{i}.attn_q.weight", w(hidden, hidden)),
                 (f"blk.{i}.attn_k.weight", w(kv_heads * hd, hidden)),
                 (f"blk.{i}.attn_v.weight", w(kv_heads * hd, hidden)),
                 (f"blk.{i}.attn_output.weight", w(hidden, hidden)),
                 (f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32)),
                 (f"blk.{i}.ffn_gate.weight", w(ff, hidden)),
                 (f"blk.{i}.ffn_up.weight", w(ff, hidden)),
                 (f"blk.{i}.ffn_down.weight", w(hidden, ff))]
        if i < kept:
            tensors += block
    head = w(n_vocab, hidden)
    head[:3] = 0  # the special tokens never win: random weights would end a stream at once
    tensors += [("output_norm.weight", np.ones(hidden, np.float32)), ("output.weight", head)]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-llama-{kept}l")
    writer.add_context_length(ctx)
    writer.add_embedding_length(hidden)
    writer.add_block_count(kept)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hd)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    for name, arr in tensors:
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
