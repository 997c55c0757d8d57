"""The demo engine's commit history, as a list of edits to the files in ``engine/base``.

The first step lays down the base files; each later step edits them. A few steps
are *events* that tests and benchmarks know about (the harness is never told):

- ``regression``: decode becomes clearly slower (a longer context makes every
  decode step attend over a larger cache);
- ``build_failure``: ``python build.py`` fails; the next step fixes it;
- ``env_scrub``: workers start from an allow-listed environment, so ``DEMO_*``
  variables no longer reach them (the collective library's variables still do).

``--attention-mode`` never changes speed at any step on its own.

At every step (it is in the base files): an *interaction*. ``--attention-mode
decode`` together with ``NCCL_PROTO=Simple`` in the environment runs every plain
decode step twice, so tok/s drops; either setting alone changes nothing (the flag
is accepted and inert, as in the original investigation). ``harness explain``
finds the pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Union

#: Files of the base engine, as stored in the package -> path in the repository.
BASE_FILES = {
    "README.md": "README.md",
    "CHANGELOG.md": "CHANGELOG.md",
    "gitignore.txt": ".gitignore",
    "build.py": "build.py",
    "tokenizer.py": "tokenizer.py",
    "model.py": "model.py",
    "worker.py": "worker.py",
    "serve.py": "serve.py",
}


@dataclass(frozen=True)
class Replace:
    """Replace the one occurrence of ``old`` in ``path`` with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Append:
    path: str
    text: str


Edit = Union[Replace, Append]


@dataclass(frozen=True)
class Step:
    message: str
    edits: tuple[Edit, ...] = ()
    event: str | None = None


def _changelog(version: str, *items: str) -> Append:
    return Append("CHANGELOG.md", f"\n## {version}\n\n" + "".join(f"- {i}\n" for i in items))


def _bump(old: str, new: str) -> Replace:
    return Replace("serve.py", f'VERSION = "{old}"', f'VERSION = "{new}"')


_SCRUBBED_ENV = '''# Workers get only what the runtime and the collectives need, so a stray
# variable in the launcher's shell cannot change how they behave.
_ENV_KEEP = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "PYTHONHOME",
             "VIRTUAL_ENV", "LD_LIBRARY_PATH")
_ENV_PREFIXES = ("NCCL_", "TORCH_", "NVSHMEM_", "CUDA_", "PYTORCH_", "GLOO_", "OMP_", "MKL_")


def worker_env() -> dict[str, str]:
    """The environment every worker process starts with."""
    return {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith(_ENV_PREFIXES)}
'''

STEPS: tuple[Step, ...] = (
    Step("Initial import of the demo engine"),
    Step("README: document the HTTP endpoints", (
        Append("README.md", "\nEndpoints: `POST /v1/completions`, `POST /generate`, `GET /health`,\n"
                            "`GET /server_info`, `GET /metrics`.\n"),)),
    Step("tokenizer: document the id layout", (
        Replace("tokenizer.py", "Any other word maps", "Ids run from 0 to VOCAB - 1. Any other word maps"),)),
    Step("serve: name the helper threads", (
        Replace("serve.py", "threading.Thread(target=self._wait_ready, daemon=True)",
                'threading.Thread(target=self._wait_ready, name="wait-ready", daemon=True)'),
        Replace("serve.py", "threading.Thread(target=self._watch, daemon=True)",
                'threading.Thread(target=self._watch, name="watch-workers", daemon=True)'))),
    Step("worker: log the world size with the device at startup", (
        Replace("worker.py", 'log(f"worker rank {args.rank}/{args.world_size} ready on {device_type} "',
                'log(f"worker rank {args.rank} of {args.world_size} ready on {device_type} "'),)),
    Step("Release 0.3.1", (_bump("0.3.0", "0.3.1"),
                           _changelog("0.3.1", "Named helper threads; clearer startup log."))),
    Step("model: explain the rotate-half layout", (
        Replace("model.py", "    # x: [B, H, T, D]; cos/sin: [B, 1, T, D] (rotate-half layout)\n",
                "    # x: [B, H, T, D]; cos/sin: [B, 1, T, D] (rotate-half layout: the first half of\n"
                "    # each head pairs with the second half, as in GPT-NeoX)\n"),)),
    Step("build: print the artifact size", (
        Replace("build.py", "({len(KERNELS)} kernels, head_dim={head_dim})",
                "({len(KERNELS)} kernels, head_dim={head_dim}, "
                "{(out / 'kernels.json').stat().st_size} bytes)"),)),
    Step("serve: answer /v1/models with the served model name", (
        Replace("serve.py", '{"id": app.args.model_name, "object": "model", "owned_by": "demo"}',
                '{"id": app.args.model_name, "object": "model", "owned_by": "demo-engine"}'),)),
    Step("README: add a quick start for tensor parallelism", (
        Append("README.md", "\nTensor parallelism runs one worker process per rank:\n\n"
                            "    python serve.py --tp 2\n"),)),
    Step("worker: comment the request protocol", (
        Replace("worker.py", "        req = json.loads(line)\n",
                "        req = json.loads(line)  # {rid, prompt_ids, max_new_tokens, temperature, ignore_eos, seed}\n"),)),
    Step("Release 0.3.2", (_bump("0.3.1", "0.3.2"),
                           _changelog("0.3.2", "Documentation of the request protocol."))),
    Step("build: raise the default context length to 4096 tokens", (
        Replace("build.py", '"max_seq": 512,', '"max_seq": 4096,'),
        Append("README.md", "\nThe default context length is 4096 tokens.\n")), event="regression"),
    Step("serve: log the listening address once workers are up", (
        Replace("serve.py", 'log(f"server ready: {len(infos)} worker(s) on {self.info[\'device\']}")',
                'log(f"server ready: {len(infos)} worker(s) on {self.info[\'device\']}, '
                'http://{self.args.host}:{self.args.port}")'),)),
    Step("tokenizer: mention the end-of-sequence id in decode", (
        Replace("tokenizer.py", "def decode(ids: list[int]) -> str:\n",
                'def decode(ids: list[int]) -> str:\n    """Text of ``ids``; the end-of-sequence id renders as nothing."""\n'),)),
    Step("Release 0.4.0", (_bump("0.3.2", "0.4.0"),
                           _changelog("0.4.0", "Longer default context."))),
    Step("build: choose the attention tile from the head size", (
        Replace("build.py", 'KERNELS = ["rms_norm"',
                "# Attention tile per head size (elements); the kernels are specialised on it.\n"
                "ATTENTION_TILES = {64: 64, 128: 128}\n\n"
                'KERNELS = ["rms_norm"'),
        Replace("build.py", '"kernels": [{"name": k, "head_dim": head_dim} for k in KERNELS],',
                '"kernels": [{"name": k, "head_dim": head_dim, "tile": ATTENTION_TILES[head_dim]}\n'
                "                    for k in KERNELS],")), event="build_failure"),
    Step("build: add the tile for 32-wide heads", (
        Replace("build.py", "ATTENTION_TILES = {64: 64, 128: 128}",
                "ATTENTION_TILES = {32: 32, 64: 64, 128: 128}"),)),
    Step("worker: describe the shutdown paths", (
        Replace("worker.py", '    """Ask the kernel to kill us when the server dies; close the race by hand."""\n',
                '    """Ask the kernel to kill us when the server dies; close the race by hand.\n\n'
                "    The other way out is end-of-file on stdin, when the server closes the pipe.\n"
                '    """\n'),)),
    Step("serve: mention the SGLang alias of /server_info in the docstring", (
        Replace("serve.py", "GET /health, GET /server_info, GET /metrics",
                "GET /health, GET /server_info (alias /get_server_info), GET /metrics"),)),
    Step("Release 0.4.1", (_bump("0.4.0", "0.4.1"),
                           _changelog("0.4.1", "Attention tiles chosen per head size."))),
    Step("README: document the metrics endpoint", (
        Append("README.md", "\n`/metrics` exports `demo_generation_tokens_total`, `demo_requests_total`,\n"
                            "`demo_decode_cycles_total` and the `demo_decode_cycle_seconds` and\n"
                            "`demo_decode_batch_size` histograms.\n"),)),
    Step("serve: start workers from a minimal environment", (
        Replace("serve.py", '''def worker_env() -> dict[str, str]:
    """The environment every worker process starts with."""
    return dict(os.environ)
''', _SCRUBBED_ENV),), event="env_scrub"),
    Step("model: name the cache layout in a comment", (
        Replace("model.py", "        shape = (self.local_heads, length, self.head_dim)\n",
                "        # KV cache per layer: [local heads, positions, head dim].\n"
                "        shape = (self.local_heads, length, self.head_dim)\n"),)),
    Step("worker: clarify the speculative cycle docstring", (
        Replace("worker.py", '"""Draft ``spec_steps`` tokens with the first layers, verify them in one pass."""',
                '"""Draft ``spec_steps`` tokens with the first layers, verify them in one extend\n'
                '        pass of the full model, keep the longest matching prefix plus one."""'),)),
    Step("Release 0.4.2", (_bump("0.4.1", "0.4.2"),
                           _changelog("0.4.2", "Workers start from a minimal environment."))),
    Step("tokenizer: keep the word pattern next to the vocabulary", (
        Replace("tokenizer.py", "VOCAB = 512\nEOS = 0\n", "VOCAB = 512  # ids 0..511; ``w{i}`` is token i\nEOS = 0\n"),)),
    Step("serve: explain how requests reach the workers", (
        Replace("serve.py", '    """The worker processes and the channel to them: requests in, their events back."""\n',
                '    """The worker processes and the channel to them: requests in, their events back.\n\n'
                "    Every rank must see the same request stream, so each request goes to every\n"
                "    rank under one lock; rank 0 alone answers, and each of its events names its\n"
                "    request, since the batch runs many at once.\n"
                '    """\n'),)),
    Step("README: list the build artifact", (
        Append("README.md", "\n`build.py` writes `build/kernels.json` (model shape, kernel table,\n"
                            "source digest); `serve.py` refuses to start without it.\n"),)),
    Step("build: document the model table", (
        Replace("build.py", "MODEL = {\n", "# Shape of the served model; every worker builds its shard from this.\nMODEL = {\n"),)),
    Step("Release 0.5.0", (_bump("0.4.2", "0.5.0"),
                           _changelog("0.5.0", "Documentation pass."))),
    Step("serve: describe the engine in --help", (
        Replace("serve.py", 'argparse.ArgumentParser(description="demo inference engine")',
                'argparse.ArgumentParser(description="demo inference engine: a tiny transformer '
                'served over HTTP")'),)),
)


def base_files() -> dict[str, str]:
    """The engine's first version: repository path -> text."""
    root = resources.files("bisect_harness.demo") / "engine" / "base"
    return {repo_path: (root / name).read_text(encoding="utf-8") for name, repo_path in BASE_FILES.items()}


def apply_step(files: dict[str, str], step: Step) -> dict[str, str]:
    """Return a new file map with ``step``'s edits applied; each must match exactly once."""
    out = dict(files)
    for edit in step.edits:
        text = out.get(edit.path, "")
        if isinstance(edit, Append):
            out[edit.path] = text + edit.text
            continue
        count = text.count(edit.old)
        if count != 1:
            raise ValueError(f"demo history step {step.message!r}: {edit.path} contains "
                             f"{count} occurrences of {edit.old[:60]!r}, expected exactly 1")
        out[edit.path] = text.replace(edit.old, edit.new)
    return out
