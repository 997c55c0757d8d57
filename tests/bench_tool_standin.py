"""A stand-in for the engines' own benchmark clients, for tests (neither engine installs here).

``standin_bin(dir)`` lays down a ``vllm`` executable (``vllm bench serve ...``) and a
``sglang`` package with ``sglang/bench_serving.py`` (``python -m sglang.bench_serving``)
that both run :func:`main`. It parses the options the harness passes with the same
names, types and defaults as the real tools (argparse, so an option they do not have
exits 2 as theirs would), sends real streamed requests to the server, measures them
the way the tools do, and writes a result shaped like theirs, with their key names:

* vLLM 0.33.0, ``vllm/benchmarks/serve.py``: ``add_cli_args`` (options; dataset
  options from ``vllm/benchmarks/datasets/datasets.py`` ``add_dataset_parser``),
  ``calculate_metrics`` (TTFT, TPOT = (latency - ttft) / (output_len - 1), ITL = every
  chunk gap pooled, output_throughput = output tokens / duration), ``benchmark()``'s
  ``result`` dict and ``process_one_metric`` (``mean_/median_/std_/pNN_<metric>_ms``),
  ``main_async`` (``result_json``, one JSON object written to
  ``--result-dir``/``--result-filename`` with ``--save-result``; per-request lists
  dropped without ``--save-detailed``);
* SGLang 0.5.23, ``sglang/benchmark/serving.py`` (re-exported by
  ``sglang/bench_serving.py``): ``cli_main`` (options), ``calculate_metrics``,
  ``benchmark()``'s ``result`` dict (``mean_/median_/std_/p90_/p95_/p99_<metric>_ms``,
  ``mean_e2e_latency_ms``...), appended as one JSON line to ``--output-file``.

Both read the API key from ``OPENAI_API_KEY`` and send it as a bearer token, as the
real tools do (vLLM: ``endpoint_request_func.py``; SGLang: ``get_auth_headers``).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np


def _vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm bench serve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--dataset-name", type=str, default="random")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=str, default="0.0")
    p.add_argument("--label", type=str, default=None)
    p.add_argument("--backend", type=str, default="openai", choices=["vllm", "openai", "openai-chat"])
    p.add_argument("--base-url", type=str, default=None)
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", type=str, default="/v1/completions")
    p.add_argument("--header", metavar="KEY=VALUE", nargs="*")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--model", type=str, default=None)
    p.add_argument("--tokenizer", type=str)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true")
    p.add_argument("--result-dir", type=str, default=None)
    p.add_argument("--result-filename", type=str, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--percentile-metrics", type=str, default=None)
    p.add_argument("--metric-percentiles", type=str, default="99")
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--ready-check-timeout-sec", type=int, default=0)
    return p


def _sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_serving")
    p.add_argument("--backend", type=str, default="sglang",
                   choices=["sglang", "sglang-native", "sglang-oai", "vllm"])
    p.add_argument("--base-url", type=str, default=None)
    p.add_argument("--host", type=str, default="0.0.0.0")
    p.add_argument("--port", type=int)
    p.add_argument("--ready-check-timeout-sec", type=int, default=60)
    p.add_argument("--dataset-name", type=str, default="sharegpt",
                   choices=["sharegpt", "custom", "openai", "random", "random-ids", "generated-shared-prefix"])
    p.add_argument("--model", type=str)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", default=1024, type=int)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--output-file", type=str)
    p.add_argument("--output-details", action="store_true")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--tag", type=str, default=None)
    return p


class _Out:
    def __init__(self):
        self.success, self.ttft, self.latency, self.itl, self.output_len, self.prompt_len = False, 0.0, 0.0, [], 0, 0
        self.error = ""


def _one(http: httpx.Client, url: str, body: dict, headers: dict) -> _Out:
    out = _Out()
    st = time.perf_counter()
    last = st
    try:
        with http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}"
                return out
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                now = time.perf_counter()
                if data.get("usage"):
                    out.output_len = data["usage"].get("completion_tokens", out.output_len)
                    out.prompt_len = data["usage"].get("prompt_tokens", 0)
                for choice in data.get("choices") or ():
                    if choice.get("text"):
                        if out.ttft == 0.0:
                            out.ttft = now - st
                        else:
                            out.itl.append(now - last)  # vLLM/SGLang: every chunk gap
                        last = now
        out.latency = time.perf_counter() - st
        out.success = out.ttft > 0
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    return out


def _run(url: str, n: int, concurrency: int, body: dict, headers: dict) -> tuple[list[_Out], float]:
    outs: list[_Out | None] = [None] * n
    it = iter(range(n))
    lock = threading.Lock()
    t0 = time.perf_counter()
    with httpx.Client(timeout=300, trust_env=False) as http:
        def worker():
            while True:
                with lock:
                    i = next(it, None)
                if i is None:
                    return
                outs[i] = _one(http, url, body, headers)
        threads = [threading.Thread(target=worker) for _ in range(max(1, min(concurrency, n)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return [o for o in outs if o is not None], time.perf_counter() - t0


def _stats(values: list[float], percentiles: list[float], name: str, style: str) -> dict:
    v = values or [0]
    out = {f"mean_{name}_ms": float(np.mean(v) * 1000), f"median_{name}_ms": float(np.median(v) * 1000),
           f"std_{name}_ms": float(np.std(v) * 1000)}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p) * 1000)
    return out


def main(tool: str, argv: list[str]) -> int:
    args = (_vllm_parser() if tool == "vllm" else _sglang_parser()).parse_args(argv)
    if args.base_url:
        base = args.base_url
    else:
        base = f"http://{args.host}:{args.port}"
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if tool == "vllm":
        url, output_len, ignore_eos = base + args.endpoint, args.random_output_len, args.ignore_eos
        warmups = args.num_warmups
    else:
        if args.backend in ("sglang", "sglang-native"):
            print("this stand-in serves the OpenAI backends only", file=sys.stderr)
            return 2
        url, output_len, ignore_eos = base + "/v1/completions", args.random_output_len, not args.disable_ignore_eos
        warmups = args.warmup_requests
    model = args.model
    if model is None:
        model = httpx.get(base + "/v1/models", headers=headers, trust_env=False).json()["data"][0]["id"]
    body = {"model": model, "prompt": " ".join(["word"] * args.random_input_len), "max_tokens": output_len,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos,
            "temperature": args.temperature if args.temperature is not None else 0.0}
    print(f"{tool} stand-in: {args.num_prompts} prompts to {url}, concurrency {args.max_concurrency}")
    if warmups:
        _run(url, warmups, args.max_concurrency or warmups, body, headers)
    outs, duration = _run(url, args.num_prompts, args.max_concurrency or args.num_prompts, body, headers)
    ok = [o for o in outs if o.success]
    lens = [o.output_len for o in ok]
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls = [g for o in ok for g in o.itl]
    e2e = [o.latency for o in ok]
    common = {"duration": duration, "completed": len(ok), "total_input_tokens": sum(o.prompt_len for o in ok),
              "total_output_tokens": sum(lens), "request_throughput": len(ok) / duration,
              "output_throughput": sum(lens) / duration,
              "max_output_tokens_per_s": float(max(lens or [0])), "max_concurrent_requests": args.max_concurrency}
    if tool == "vllm":
        pct = [float(p) for p in args.metric_percentiles.split(",")]
        selected = (args.percentile_metrics or "ttft,tpot,itl").split(",")
        result = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": args.backend,
                  "backend": args.backend, "label": args.label, "model_id": model, "tokenizer_id": model,
                  "num_prompts": args.num_prompts, "request_rate": "inf" if args.request_rate == float("inf")
                  else args.request_rate, "burstiness": 1.0, "max_concurrency": args.max_concurrency,
                  **common, "failed": len(outs) - len(ok), "request_goodput": None,
                  "total_token_throughput": (common["total_input_tokens"] + sum(lens)) / duration,
                  "latencies": e2e, "queue_times": [0.0] * len(outs), "rtfx": 0.0}
        for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2e)):
            if name in selected:
                result.update(_stats(values, pct, name, "vllm"))
        if args.save_result:
            path = Path(args.result_dir or ".") / (args.result_filename or "vllm-result.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
    else:
        result = {"tag": args.tag, "backend": args.backend, "dataset_name": args.dataset_name,
                  "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
                  "sharegpt_output_len": None, "random_input_len": args.random_input_len,
                  "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
                  "server_info": None, **common, "total_input_text_tokens": common["total_input_tokens"],
                  "total_input_vision_tokens": 0, "total_output_tokens_retokenized": sum(lens),
                  "input_throughput": common["total_input_tokens"] / duration,
                  "total_throughput": (common["total_input_tokens"] + sum(lens)) / duration,
                  "concurrency": sum(e2e) / duration, "accept_length": None}
        for name, values in (("e2e_latency", e2e), ("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
            result.update(_stats(values, [90, 95, 99], name, "sglang"))
        result["max_itl_ms"] = float(max(itls or [0]) * 1000)
        with open(args.output_file or "sglang-result.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


def standin_bin(root: Path) -> tuple[Path, Path]:
    """``root/bin/vllm`` and ``root/site/sglang/bench_serving.py``; returns (bin dir, site dir)."""
    here = Path(__file__).resolve().parent
    bin_dir, site = root / "bin", root / "site"
    (site / "sglang").mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(here)!r})\n"
                    "from bench_tool_standin import main\n"
                    "assert sys.argv[1:3] == ['bench', 'serve'], sys.argv\n"
                    "sys.exit(main('vllm', sys.argv[3:]))\n")
    vllm.chmod(vllm.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "bench_serving.py").write_text(
        f"import sys\nsys.path.insert(0, {str(here)!r})\nfrom bench_tool_standin import main\n"
        "if __name__ == '__main__':\n    sys.exit(main('sglang', sys.argv[1:]))\n")
    return bin_dir, site
