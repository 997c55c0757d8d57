"""A tiny decoder-only transformer, sharded for tensor parallelism.

Weights are random but seeded: every rank builds the full matrices from the same
generator and keeps its own slice, so outputs do not depend on the TP degree
(up to float summation order).

A forward pass runs a batch of sequences at once: their tokens go through every
matmul together (one ``[batch x tokens, d_model]`` product per weight), and each
sequence attends over its own KV cache (:class:`KVCache`), as a continuous-batching
engine's ragged attention does. Attention runs over the whole cache with a
position mask. That keeps every decode step the same shape, which is what lets
the step be captured in a CUDA graph; the price is that decode cost grows with
``max_seq``.

On a CPU the host and the "device" are the same cores, and the server, the
client measuring it and everything else on the host take turns with the model:
a step's time would be the host's scheduling as much as the model's work. So a
forward pass on a CPU is paced to the time a device would take for it
(:class:`DeviceTime`, from the build's ``device`` table: per layer, per token,
per cache position attended over, per collective call): the pass computes, then
waits out the rest of its modeled time, as a host waits for its GPU. A pass's
time is a fixed cost per layer (reading the weights, launching the kernels) plus
a cost per token of the batch: one sequence's step leaves most of the device
idle, so a batch of eight costs far less than eight steps, until the per-token
work dominates and the batch is compute-bound. The host's work between two passes
(picking the tokens, sending them, logging) overlaps the device's next pass, as an
engine's overlap scheduler has it, so a step takes its modeled time and no more
while that work and the real compute fit in it. What changes the work changes the
time the same way (a longer cache, a second pass, fewer collectives, more tokens
in the batch). A paced pass attends over the positions its sequence has written
so far (the masked rest adds nothing) while its modeled time charges the whole
cache, and each sequence's cache holds only the positions it can use; on a GPU
the passes run unpaced, over whole caches of ``max_seq`` positions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True)
class DeviceTime:
    """The modeled device time of one forward pass, in milliseconds."""

    layer_ms: float
    token_ms: float
    attention_ms_per_1k: float
    collective_ms: float

    def pass_ms(self, *, tokens: int, layers: int, cache_positions: int, calls: int) -> float:
        """A pass of ``tokens`` tokens (over every sequence of the batch) through ``layers``
        layers, each token attending over ``cache_positions`` positions, with ``calls``
        collective calls."""
        per_layer = self.layer_ms + tokens * (self.token_ms + self.attention_ms_per_1k * cache_positions / 1024)
        return layers * per_layer + calls * self.collective_ms


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_seq: int
    rope_theta: float
    draft_layers: int
    deep_scale: float
    comm_chunk: int
    device: DeviceTime

    @classmethod
    def from_kernels(cls, kernels: dict) -> "ModelConfig":
        m = kernels["model"]
        return cls(
            vocab=int(m["vocab"]),
            d_model=int(m["d_model"]),
            n_layers=int(m["n_layers"]),
            n_heads=int(m["n_heads"]),
            d_ff=int(m["d_ff"]),
            max_seq=int(m["max_seq"]),
            rope_theta=float(m["rope_theta"]),
            draft_layers=int(m["draft_layers"]),
            deep_scale=float(m["deep_scale"]),
            comm_chunk=int(kernels["comm"]["default_chunk"]),
            device=DeviceTime(**{k: float(v) for k, v in kernels["device"].items()}),
        )


class Comm:
    """Sum-reduction across the tensor-parallel group.

    The default path reduces in fixed-size buckets (``comm_chunk`` elements), the
    conservative setting that works on any transport. ``tuned`` reduces each
    tensor in one collective, and skips the collective for a group of one.
    """

    def __init__(self, world_size: int, tuned: bool, chunk: int):
        self.world_size = world_size
        self.tuned = tuned
        self.chunk = chunk
        self.calls = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tuned:
            if self.world_size > 1:
                dist.all_reduce(x)
                self.calls += 1
            return x
        flat = x.view(-1)
        for start in range(0, flat.numel(), self.chunk):
            dist.all_reduce(flat[start:start + self.chunk])
            self.calls += 1
        return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(cfg: ModelConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = cfg.d_model // cfg.n_heads
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device), angles.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, D]; cos/sin: [B, 1, T, D] (rotate-half layout)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class TinyLM:
    """The model of one tensor-parallel rank; each sequence brings its own KV cache (:meth:`new_cache`)."""

    def __init__(self, cfg: ModelConfig, *, rank: int, world_size: int, seed: int,
                 device: torch.device, comm: Comm):
        if cfg.n_heads % world_size or cfg.d_ff % world_size:
            raise ValueError(f"tp={world_size} must divide n_heads={cfg.n_heads} and d_ff={cfg.d_ff}")
        self.cfg, self.rank, self.world_size, self.device, self.comm = cfg, rank, world_size, device, comm
        d, hd = cfg.d_model, cfg.d_model // cfg.n_heads
        self.head_dim = hd
        self.local_heads = cfg.n_heads // world_size
        gen = torch.Generator().manual_seed(seed)

        def randn(*shape, scale):
            return torch.randn(*shape, generator=gen) * scale

        heads = slice(rank * self.local_heads * hd, (rank + 1) * self.local_heads * hd)
        ff_local = cfg.d_ff // world_size
        ff = slice(rank * ff_local, (rank + 1) * ff_local)
        self.embed = randn(cfg.vocab, d, scale=1.0).to(device)
        self.layers = []
        for i in range(cfg.n_layers):
            wq, wk, wv = (randn(d, d, scale=d ** -0.5) for _ in range(3))
            wo = randn(d, d, scale=d ** -0.5)
            w1 = randn(d, cfg.d_ff, scale=d ** -0.5)
            w2 = randn(cfg.d_ff, d, scale=cfg.d_ff ** -0.5)
            # Deeper layers write less into the residual stream, so the first
            # layers alone predict the next token most of the time (self-speculation:
            # the draft agrees with greedy decoding on about 85% of tokens at deep_scale 0.1).
            scale = 1.0 if i < cfg.draft_layers else cfg.deep_scale
            self.layers.append({
                "wqkv": torch.cat([wq[:, heads], wk[:, heads], wv[:, heads]], dim=1).contiguous().to(device),
                "wo": (wo[heads, :] * scale).contiguous().to(device),
                "w1": w1[:, ff].contiguous().to(device),
                "w2": (w2[ff, :] * scale).contiguous().to(device),
                "ln1": torch.ones(d, device=device),
                "ln2": torch.ones(d, device=device),
            })
        self.ln_f = torch.ones(d, device=device)
        self.lm_head = randn(d, cfg.vocab, scale=d ** -0.5).to(device)
        self.cos, self.sin = rope_tables(cfg, device)
        self.key_pos = torch.arange(cfg.max_seq, device=device)
        self.paced = device.type == "cpu"  # see the module docstring
        self._free_at = float("-inf")  # when the modeled device finished the last pass (perf_counter)

    def new_cache(self, length: int) -> "KVCache":
        """An empty KV cache of ``length`` positions for one sequence."""
        shape = (self.local_heads, length, self.head_dim)
        return KVCache([torch.zeros(shape, device=self.device) for _ in range(self.cfg.n_layers)],
                       [torch.zeros(shape, device=self.device) for _ in range(self.cfg.n_layers)])

    def device_idle(self) -> None:
        """Nothing ran since the last pass: the next one starts when it is launched (no host
        work overlaps it)."""
        self._free_at = float("-inf")

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, caches: list["KVCache"],
                n_layers: int | None = None) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for ``tokens`` ``[B, T]`` at ``positions`` ``[B, T]``: row ``b``
        is one sequence, whose K/V go into ``caches[b]`` and whose queries attend over it.

        ``n_layers`` < all runs the early-exit draft model (the first layers and
        the shared head).
        """
        cfg = self.cfg
        launch, calls = time.perf_counter(), self.comm.calls
        B, T = tokens.shape
        x = self.embed[tokens].view(B * T, cfg.d_model)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [B, 1, T, D]
        # A paced pass (on a CPU) reads a cache only as far as its sequence has written it:
        # its modeled time charges the whole cache, the fixed-shape step a device runs, and the
        # cores stay free for the server and the client. On a GPU the step reads all of it.
        if self.paced:
            spans = [int(p) + 1 for p in positions.max(dim=1).values.tolist()]
        else:
            spans = [cache.length for cache in caches]
        masks = [(self.key_pos[None, :span] <= positions[b][:, None])[None] for b, span in enumerate(spans)]
        for i, layer in enumerate(self.layers[: n_layers or cfg.n_layers]):
            h = rms_norm(x, layer["ln1"])
            # [3, B, H, T, D]: one product for the whole batch
            qkv = (h @ layer["wqkv"]).view(B, T, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = apply_rope(qkv[0], cos, sin), apply_rope(qkv[1], cos, sin), qkv[2]
            heads = []
            for b, cache in enumerate(caches):  # ragged attention: each sequence over its own cache
                cache.k[i].index_copy_(1, positions[b], k[b])
                cache.v[i].index_copy_(1, positions[b], v[b])
                heads.append(F.scaled_dot_product_attention(q[b], cache.k[i][:, :spans[b]],
                                                            cache.v[i][:, :spans[b]], attn_mask=masks[b]))
            attn = torch.stack(heads).transpose(1, 2).reshape(B * T, -1)  # [B x T, H x D]
            x = x + self.comm.all_reduce(attn @ layer["wo"])
            h = rms_norm(x, layer["ln2"])
            x = x + self.comm.all_reduce(F.silu(h @ layer["w1"]) @ layer["w2"])
        logits = (rms_norm(x, self.ln_f) @ self.lm_head).view(B, T, cfg.vocab)
        if self.paced:
            self._pace(launch, cfg.device.pass_ms(tokens=B * T, layers=min(n_layers or cfg.n_layers, cfg.n_layers),
                                                  cache_positions=cfg.max_seq, calls=self.comm.calls - calls) / 1e3)
        return logits

    def _pace(self, launch: float, seconds: float) -> None:
        """Wait out the modeled time of a pass launched at ``launch``. It started on the device
        when the last one finished, where the host came back within a pass's time (its work
        in between overlapped), else at its launch; it ends ``seconds`` after its start, or
        when its real work did, if that was later."""
        start = self._free_at if launch - self._free_at < seconds else launch
        rest = start + seconds - time.perf_counter()
        if rest > 0:
            time.sleep(rest)
            self._free_at = start + seconds  # the device's end; waking up late is the host's
        else:
            self._free_at = time.perf_counter()


class KVCache:
    """One sequence's keys and values, per layer: ``k[i]`` and ``v[i]`` of layer ``i``."""

    __slots__ = ("k", "v")

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor]):
        self.k, self.v = k, v

    @property
    def length(self) -> int:
        """How many positions it holds."""
        return self.k[0].shape[1]
