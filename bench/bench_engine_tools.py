"""SGLang's real ``bench_serving`` beside the harness's own client, on one demo boot.

    python bench/bench_engine_tools.py [--wheel-dir DIR] [--device cpu|cuda] [--samples 4] [--requests 8]
        [--prompt-tokens 32] [--output-tokens 64] [--concurrency 2] [--api generate|completions]
        [--sglang-version 0.5.23] [--quick] [--keep]

CI does not run this bench: it needs SGLang's released wheel. With ``--wheel-dir DIR``
everything is installed from DIR alone (``pip --no-index --find-links DIR``), so the
run needs no network; fill DIR once with::

    pip download --no-deps -d DIR sglang==0.5.23 aiohttp aiohappyeyeballs aiosignal \\
        frozenlist multidict propcache yarl msgspec pybase64 pyzmq

(add any of orjson, tqdm, requests, urllib3, certifi, charset-normalizer and idna
that the interpreter lacks; the bench itself needs transformers and tokenizers, the
project's ``test`` extra). Without ``--wheel-dir`` the bench's setup fetches the
same packages from the package index (the only traffic that leaves the host; the
benchmark itself talks to 127.0.0.1 only). Nothing is installed into the interpreter's site-packages: the
wheel goes to a throwaway ``pip install --no-deps --target`` folder in the bench's
temporary directory, with only those light client libraries that the interpreter
lacks (never torch or any CUDA package).

How the real file runs. ``python -m sglang.bench_serving`` (a re-export of
``sglang/benchmark/serving.py``) needs aiohttp, msgspec, numpy, orjson, requests,
tqdm and transformers, but its package ``__init__`` files import SGLang's whole
runtime (torch, triton, zmq, FlashInfer...), and the module imports two names from
the runtime: ``FAKE_BOOTSTRAP_HOST`` from ``sglang.srt.disaggregation.utils`` (which
imports torch.distributed and the model configs) and ``resolve_base_url`` from
``sglang.srt.utils.network`` (psutil and zmq only). A ``sitecustomize`` on the
tool's ``PYTHONPATH`` registers ``sglang``, ``sglang.srt``, ``sglang.srt.utils`` and
``sglang.srt.disaggregation`` as bare packages over the wheel's folders (their
``__init__`` files are not run), gives ``sglang.srt.disaggregation.utils`` the one
constant read from the wheel's own source, and, where the ``datasets`` library is
absent, a ``datasets`` whose ``load_dataset`` raises (only the MMMU dataset uses
it). Every file of the benchmark itself (``bench_serving.py``,
``sglang/benchmark/*``, ``sglang/srt/utils/network.py``) runs unmodified.

Tokenizer. The tool draws ``--dataset-name random-ids`` prompts through a Hugging
Face tokenizer (``--tokenizer``, else the server's ``/model_info``, else the model
name, which would be fetched from the Hub). The demo engine's tokenizer is
word-level (token ``i`` is the word ``w{i}``, 512 of them), so the bench writes the
same vocabulary as a ``tokenizers`` WordLevel tokenizer into its temporary folder
and passes it as ``benchmark.tool_args: [--tokenizer, DIR]``, as a user would;
``HF_HUB_OFFLINE=1`` keeps the tool's chat-template probe of the model name off
the network.

What runs. One demo boot at HEAD; the harness client's warmup; then ``--samples``
pairs of sample windows, the order inside each pair alternating: (a) the
harness's own client (``ClientRunner``, as a run measures), (b) the
``sglang-bench-serving`` tool through ``boot.benchtools.sample_runner`` exactly as
a run invokes it (argv from ``SglangBenchServing.options``, its JSONL result read
and mapped by ``SglangBenchServing.read``/``metrics``), with the same request
count, lengths, concurrency and warmup. Per pair, the ratio tool / ours of each
figure; the medians over pairs are printed.

What differs by definition (read from ``sglang/benchmark/serving.py`` 0.5.23):

- ``tok_s`` <- ``output_throughput``: the server-reported output tokens
  (``meta_info.completion_tokens`` / ``usage``) over ``benchmark_duration``, from
  just before the first request task is made (after the warmup and a 1 s sleep) to
  after a blocking ``GET /server_info`` that follows the last response (for the
  ``sglang*`` backends, to read ``avg_spec_accept_length``); ours: the same tokens
  over the sample window, first request sent to last stream closed. So the tool's
  window also holds that round trip and its asyncio task set-up.
- TTFT: the tool stamps its start before ``session.post`` on a new
  ``aiohttp.ClientSession`` made per request, so every TTFT holds a TCP connect;
  ours reuses one keep-alive connection pool per boot. The tool stamps the first
  chunk whose ``text`` is non-empty; ours the first chunk that carries output.
- ITL (``--backend sglang``): the tool splits each chunk's gap evenly over the tokens it brought (as
  ours does) and pools them over requests; mean and p99 over that pool, as ours.
- TPOT: ``(latency - ttft) / (output_len - 1)`` per request, where ``latency`` is
  stamped at the last line read (``[DONE]`` included); ours: the same with e2e
  stamped at the end of the stream. Means over requests, p99 by numpy's linear
  interpolation in both.
- Each request's output is retokenised by the tool (``total_output_tokens_retokenized``)
  for a figure the harness does not map.
- With ``--api completions`` (the tool's ``--backend sglang-oai``) the tool sends no
  ``stream_options``, so a server that reports usage only on request (the demo,
  vLLM) gives it no count: each request's tokens are taken as the requested
  ``max_tokens``, and its ITL is one value per chunk with text, not per token.

vLLM's ``vllm bench serve`` cannot be run this way (tried on the vllm-0.33.0
wheel): ``vllm/__init__.py`` imports ``vllm.env_override``, which imports torch;
with that ``__init__`` bypassed as above, ``vllm/benchmarks/serve.py`` imports
``vllm.benchmarks.datasets``, whose ``datasets.py`` imports ``vllm.lora.utils``,
which reaches ``vllm.model_executor.layers``, the attention backends, the KV
transfer connectors and ``vllm.v1.request`` -> ``xgrammar`` (apache-tvm-ffi), next to
the compiled ``vllm._C`` extension: the engine itself, not a client. Running it
would mean installing vLLM with torch (a GPU host's job), so ``vllm-bench-serve``
stays tested through the stand-in (tests/bench_tool_standin.py).

What the runs showed (docs/hypotheses-format.md has the figures): the means agree
within the host's noise; the p99 TTFT of ours runs higher because the demo engine
admits one request at a time under a lock that is not first-come-first-served, and
our client's next request (on a pooled connection) sometimes overtakes the one
waiting, where the tool's (a new connection per request) arrives later.

The last line is one JSON object: the per-pair median ratios, both sides' medians
and the setup used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_harness.engines.benchtools import Endpoint, sample_runner  # noqa: E402
from bisect_harness.engines.server import ServerProcess, free_port  # noqa: E402
from bisect_harness.demo import create_demo_repo  # noqa: E402
from bisect_harness.engines.presets import get_preset  # noqa: E402
from bisect_harness.model import BenchmarkSpec  # noqa: E402
import bisect_harness.run.executor  # noqa: E402,F401  (what a run has loaded before a sample)

DEMO = get_preset("demo")
#: The benchmark client's own imports that an interpreter may lack, with aiohttp's
#: dependencies (pip name, import name). All are small pure or binary wheels.
LIGHT_DEPS = [("aiohttp", "aiohttp"), ("aiohappyeyeballs", "aiohappyeyeballs"), ("aiosignal", "aiosignal"),
              ("frozenlist", "frozenlist"), ("multidict", "multidict"), ("propcache", "propcache"),
              ("yarl", "yarl"), ("msgspec", "msgspec"), ("pybase64", "pybase64"), ("pyzmq", "zmq"),
              ("orjson", "orjson"), ("tqdm", "tqdm"), ("requests", "requests"), ("urllib3", "urllib3"),
              ("certifi", "certifi"), ("charset-normalizer", "charset_normalizer"), ("idna", "idna")]
#: Figures compared, ours and the tool's, under the harness's names.
FIGURES = ("tok_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
           "itl_p99_ms", "tpot_p99_ms")

SITECUSTOMIZE = '''\
"""Run sglang.bench_serving from the wheel without SGLang's runtime (see the bench's docstring)."""
import ast
import importlib.machinery
import importlib.util
import os
import sys
import types

_spec = importlib.machinery.PathFinder.find_spec("sglang")
if _spec is not None and _spec.submodule_search_locations:
    _root = list(_spec.submodule_search_locations)[0]
    for _name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        _mod = types.ModuleType(_name)
        _mod.__path__ = [os.path.join(_root, *_name.split(".")[1:])]
        sys.modules[_name] = _mod
    _consts = types.ModuleType("sglang.srt.disaggregation.utils")
    with open(os.path.join(_root, "srt", "disaggregation", "utils.py")) as _f:
        for _node in ast.parse(_f.read()).body:
            if isinstance(_node, ast.Assign) and [getattr(t, "id", None) for t in _node.targets] == \\
                    ["FAKE_BOOTSTRAP_HOST"]:
                _consts.FAKE_BOOTSTRAP_HOST = ast.literal_eval(_node.value)
    if not hasattr(_consts, "FAKE_BOOTSTRAP_HOST"):
        raise ImportError("FAKE_BOOTSTRAP_HOST not found in sglang/srt/disaggregation/utils.py")
    sys.modules[_consts.__name__] = _consts
    if importlib.util.find_spec("datasets") is None:
        _ds = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise RuntimeError("the datasets library is not installed (only the MMMU dataset needs it)")

        _ds.load_dataset = load_dataset
        sys.modules["datasets"] = _ds
'''


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _pip(args: list[str], log: Path) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
            *args]
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(argv) + "\n").encode())
        f.flush()
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=900,
                            start_new_session=True).returncode
    if rc != 0:
        raise SystemExit(f"pip install failed (exit {rc}); see {log}")


def install_tool(tmp: Path, version: str, wheel_dir: Path | None) -> tuple[Path, list[str], dict]:
    """The sglang wheel and the light deps the interpreter lacks into ``tmp``; the shim.
    Returns (the folder on the tool's PYTHONPATH first, the PYTHONPATH list, what was installed)."""
    log = tmp / "pip.log"
    index = ["--no-index", "--find-links", str(wheel_dir)] if wheel_dir is not None else []
    pkgs, deps = tmp / "sglang-pkg", tmp / "sglang-deps"
    _pip([*index, "--target", str(pkgs), f"sglang=={version}"], log)
    missing = [pip_name for pip_name, mod in LIGHT_DEPS if not _importable(mod)]
    if missing:
        _pip([*index, "--target", str(deps), *missing], log)
    shim = tmp / "sglang-shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return shim, [str(shim), str(pkgs), str(deps)], {"sglang": version, "installed_deps": missing,
                                                      "from": "wheel_dir" if wheel_dir else "index"}


def write_tokenizer(path: Path) -> Path:
    """The demo engine's word-level vocabulary (token i is ``w{i}``) as a HF tokenizer folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    sys.path.insert(0, str(ROOT / "bisect_harness" / "demo" / "engine" / "base"))
    import tokenizer as demo_tok  # the demo engine's own module: its VOCAB

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(demo_tok.VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(str(path))
    return path


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def _median(values) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def run(args, tmp: Path) -> dict:
    _shim, pythonpath, installed = install_tool(tmp, args.sglang_version,
                                               Path(args.wheel_dir).resolve() if args.wheel_dir else None)
    tokdir = write_tokenizer(tmp / "demo-tokenizer")
    hist = create_demo_repo(tmp / "engine")
    tree = tmp / "head"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), hist.head], cwd=hist.path, check=True,
                   capture_output=True)
    subprocess.run([a.format(python=sys.executable) for a in DEMO.build], cwd=tree, check=True, capture_output=True)

    common = dict(api=args.api, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                  requests_per_sample=args.requests, concurrency=args.concurrency, warmup_requests=args.warmup)
    ours_spec = BenchmarkSpec(**common)
    tool_spec = BenchmarkSpec(**common, tool="sglang-bench-serving", tool_args=("--tokenizer", str(tokdir)))
    tool_env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    tool_env.update(PYTHONPATH=os.pathsep.join(pythonpath), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                    NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONWARNINGS="ignore")

    port = free_port()
    argv = [a.format(python=sys.executable, host="127.0.0.1", port=port) for a in DEMO.launch]
    argv += ["--device", args.device]
    base = f"http://127.0.0.1:{port}"
    endpoint = Endpoint(base, host="127.0.0.1", port=port)
    pairs: list[dict] = []
    # NVLink multicast off, as the other benches boot the demo on a GPU host
    server_env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"}
    with ServerProcess(argv, env=server_env, cwd=tree, log_path=tmp / "server.log", base_url=base,
                       health_path=DEMO.health_path, ready_timeout_s=DEMO.ready_timeout_s):
        ours = sample_runner(ours_spec, endpoint, python=sys.executable, env=os.environ, cwd=tmp,
                             log_path=tmp / "ours.log")
        tool = sample_runner(tool_spec, endpoint, python=sys.executable, env=tool_env, cwd=tmp,
                             log_path=tmp / "boot.log")
        ours.warmup()
        tool.warmup()  # a no-op: the tool warms up inside its first run (--warmup-requests)
        with ours.session() as mine, tool.session() as theirs:
            for i in range(args.samples):
                order = (("ours", mine), ("tool", theirs)) if i % 2 == 0 else (("tool", theirs), ("ours", mine))
                got = {}
                for name, runner in order:
                    t0 = time.monotonic()
                    detail = runner.sample(i)
                    got[name] = {"metrics": dict(detail.result.metrics), "requests": detail.result.requests,
                                 "output_tokens": detail.result.output_tokens, "errors": detail.result.errors,
                                 "window_s": detail.result.duration_s, "wall_s": time.monotonic() - t0}
                pairs.append({"first": order[0][0], **got})
                print(f"pair {i + 1}/{args.samples}: tok_s ours {got['ours']['metrics']['tok_s']:.1f} "
                      f"tool {got['tool']['metrics']['tok_s']:.1f}; ttft_ms ours "
                      f"{got['ours']['metrics']['ttft_ms']:.2f} tool {got['tool']['metrics']['ttft_ms']:.2f}",
                      flush=True)
        raw = tool.provenance()["bench_tool"]["runs"]
    for p, r in zip(pairs, raw):
        p["tool_raw"] = {k: r["result"].get(k) for k in ("output_throughput", "mean_ttft_ms", "mean_itl_ms",
                                                          "mean_tpot_ms", "p99_ttft_ms", "p99_itl_ms",
                                                          "total_output_tokens", "total_output_tokens_retokenized",
                                                          "duration", "completed", "backend", "dataset_name")}
    (tmp / "pairs.json").write_text(json.dumps(pairs, indent=1))
    ratios = {f: _median(_ratio(p["tool"]["metrics"][f], p["ours"]["metrics"][f]) for p in pairs)
              for f in FIGURES}
    medians = {side: {f: _median(p[side]["metrics"][f] for p in pairs) for f in FIGURES} for side in ("ours", "tool")}
    tokens_equal = all(p["ours"]["output_tokens"] == p["tool"]["output_tokens"] == args.requests * args.output_tokens
                       for p in pairs)
    return {"ratios_tool_over_ours": ratios, "medians": medians, "tokens_equal": tokens_equal,
            "errors": sum(p["ours"]["errors"] + p["tool"]["errors"] for p in pairs),
            "tool_wall_s_median": _median(p["tool"]["wall_s"] for p in pairs),
            "ours_wall_s_median": _median(p["ours"]["wall_s"] for p in pairs),
            "tool_argv": raw[0]["argv"] if raw else None, "installed": installed, "pairs": pairs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", help="install sglang and the light deps from this folder only (no network)")
    ap.add_argument("--sglang-version", default="0.5.23")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the demo engine's --device")
    ap.add_argument("--samples", type=int, default=4, help="pairs of sample windows (ours, the tool)")
    ap.add_argument("--requests", type=int, default=8, help="requests per sample")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--api", choices=["generate", "completions"], default="generate",
                    help="generate: the tool's --backend sglang (/generate); completions: sglang-oai")
    ap.add_argument("--quick", action="store_true", help="2 pairs of 4 requests of 32 tokens")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, tool results)")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.requests, args.output_tokens = 2, 4, 32
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-tools-"))
    try:
        res = run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    r, m = res["ratios_tool_over_ours"], res["medians"]
    print(f"\nmedian ratio tool/ours over {args.samples} pairs (device {args.device}, api {args.api}, "
          f"{args.requests} requests x "
          f"{args.output_tokens} tokens, concurrency {args.concurrency}):")
    for f in FIGURES:
        print(f"  {f:12s} {r[f]:.4f}   (ours {m['ours'][f]:.3f}, tool {m['tool'][f]:.3f})")
    print(f"  same token counts: {res['tokens_equal']}, errors {res['errors']}, wall per sample: ours "
          f"{res['ours_wall_s_median']:.2f} s, tool {res['tool_wall_s_median']:.2f} s")
    summary = {"device": args.device, "api": args.api, "samples": args.samples, "requests": args.requests,
               "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
               "concurrency": args.concurrency, "machine": platform.machine(),
               "seconds": round(time.monotonic() - started, 1), "installed": res["installed"],
               "tool_argv": res["tool_argv"],
               "ratios_tool_over_ours": {k: round(v, 4) for k, v in r.items()},
               "medians": {s: {k: round(v, 4) for k, v in d.items()} for s, d in m.items()},
               "tokens_equal": res["tokens_equal"], "errors": res["errors"],
               "wall_s_median": {"ours": round(res["ours_wall_s_median"], 3),
                                 "tool": round(res["tool_wall_s_median"], 3)}}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
