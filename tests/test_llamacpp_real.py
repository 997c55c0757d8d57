"""A real llama.cpp server (``llama-server``, built for the CPU from the llama.cpp
tree vendored in the llama-cpp-python 0.3.36 source package) through the
``llamacpp`` preset, on a tiny random-weight GGUF made here.

``.ci/install-llamacpp DIR`` builds it (CI does); the tests find it at
``$BISECT_HARNESS_LLAMACPP/bin/llama-server`` and skip when it is absent, unless
``BISECT_HARNESS_REQUIRE_REAL_ENGINES=1``.

The trap they hold the harness to: ``-md DRAFT`` alone is accepted by this
llama.cpp and speculative decoding stays off (it wants ``--spec-type
draft-simple`` too); the shipped mechanism check must say so on every such boot
(the draft model loaded at start, no draft token over the measured window: "set
up at start, not seen in the window"), and must say "engaged in the window" when
drafting really runs. Its log patterns are the lines this server prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import psutil
import pytest

from helpers import harness, last_json, query, write_spec
from tinygguf import build_tiny_gguf

pytestmark = pytest.mark.slow

ROOT = Path(os.environ.get("BISECT_HARNESS_LLAMACPP", Path.home() / ".cache" / "bisect-harness" / "llamacpp"))
SERVER = ROOT / "bin" / "llama-server"


def _require() -> None:
    if not SERVER.exists():
        msg = f"no llama-server at {SERVER} (build it with .ci/install-llamacpp {ROOT})"
        if os.environ.get("BISECT_HARNESS_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    _require()
    d = tmp_path_factory.mktemp("gguf")
    return build_tiny_gguf(d / "target.gguf", layers=4), build_tiny_gguf(d / "draft.gguf", layers=4, keep_layers=1)


def _env() -> dict[str, str]:
    """The harness's env as a user has it: llama-server on PATH."""
    return {**os.environ, "PATH": f"{SERVER.parent}{os.pathsep}{os.environ['PATH']}"}


def _engine(target: Path | str) -> dict:
    # ctx-size: the tiny model's training context (a larger one is capped there: a flag mismatch)
    return {"preset": "llamacpp", "ready_timeout_s": 60,
            "flags": {"model": str(target), "ctx-size": 512, "threads": 1, "parallel": 1},
            "metrics": [
                # the server's own decode rate, from the timings of each stream's last chunk
                {"name": "server_decode_tok_s", "from": "response", "chunk": "last",
                 "field": "timings.predicted_per_second", "better": "higher"},
                {"name": "predicted_rate", "from": "prometheus", "metric": "llamacpp:tokens_predicted_total",
                 "kind": "rate", "better": "higher"}]}


BENCH = {"prompt_tokens": 16, "output_tokens": 64, "concurrency": 1, "requests_per_sample": 2,
         "warmup_requests": 1}


def test_the_draft_trap_is_caught_and_real_drafting_is_seen(models, tmp_path):
    target, draft = models
    (tmp_path / "target.gguf").symlink_to(target)  # named as a user does, beside the file: {spec_dir}
    hyps = [
        {"id": "md-only", "baseline": {}, "treatment": {"flags": {"model-draft": str(draft)}},
         "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
        # flash attention on, at verbosity 4: the only level at which llama-server says so
        {"id": "md-simple", "baseline": {}, "treatment": {"flags": {"model-draft": str(draft),
                                                                      "spec-type": "draft-simple",
                                                                      "flash-attn": "on", "verbosity": 4}},
         "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
    ]
    spec = write_spec(tmp_path / "h.yaml", engine=_engine("{spec_dir}/target.gguf"), benchmark=BENCH,
                      hypotheses=hyps, defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 2})
    db = tmp_path / "r.db"
    r = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                "--journal-dir", tmp_path / "experiments", cwd=tmp_path, env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = {h["id"]: h for h in last_json(r.stdout)["hypotheses"]}

    rows = query(db, "SELECT c.flags, b.status, b.marks, b.provenance, b.flag_report FROM boots b "
                     "JOIN configs c ON c.id = b.config_id")
    by_kind: dict[str, list] = {"plain": [], "md": [], "simple": []}
    for flags, status, marks, prov, flag_rep in rows:
        flags, marks, prov, flag_rep = map(json.loads, (flags, marks, prov, flag_rep))
        assert status == "ok", (flags, status)
        kind = "simple" if "spec-type" in flags else "md" if "model-draft" in flags else "plain"
        by_kind[kind].append((marks, prov, flag_rep))
        # the engine's version per boot: /props build_info
        assert prov["engine_version"]["values"].get("server_info.build_info"), prov["engine_version"]
        # the model's path compared as the server got it ({spec_dir} rendered), the slots, and
        # the context against the context of a slot /props reports
        checked = {c["flag"]: c["status"] for c in flag_rep["checks"]}
        assert checked.get("model") == "matched" and checked.get("parallel") == "matched", flag_rep
        assert checked.get("ctx-size") == "matched", flag_rep
        assert "flag_mismatch" not in marks
    assert all(len(v) == 2 for v in by_kind.values()), {k: len(v) for k, v in by_kind.items()}
    for marks, prov, _ in by_kind["plain"]:
        assert "mechanism_not_seen" not in marks and "mechanisms" not in prov
    for marks, prov, _ in by_kind["md"]:  # accepted, the draft model loaded, never drafted
        assert "mechanism_not_seen" in marks and "mechanism_not_engaged" not in marks, marks
        (m,) = prov["mechanisms"]
        assert m["name"] == "speculative decoding" and m["state"] == "set_up_not_seen", m
        assert m["window"] == "llamacpp:spec_decode_num_draft_tokens_total +0 over the window", m
        assert "loading draft model '" in m["startup"], m
    for marks, prov, _ in by_kind["simple"]:  # drafting really runs
        assert not {"mechanism_not_engaged", "mechanism_not_seen"} & set(marks), marks
        spec, fa = prov["mechanisms"]
        assert spec["name"] == "speculative decoding" and spec["state"] == "engaged", spec
        assert spec["window"].startswith("llamacpp:spec_decode_num_draft_tokens_total +"), spec
        assert "llamacpp:spec_decode_num_accepted_tokens_total +" in spec["window"], spec
        # flash attention: set up at start (its -lv 4 line), nothing over the window says it ran
        assert fa["name"] == "flash attention" and fa["state"] == "not_observable", fa
        assert "llama_context: flash_attn            = enabled" in fa["startup"], fa

    assert "mechanism_not_seen" in out["md-only"]["checks"]["word"], out["md-only"]
    assert out["md-only"]["mechanisms"] == {"treatment": {"speculative decoding": {"set_up_not_seen": 2}}}
    assert out["md-simple"]["mechanisms"]["treatment"] == {"speculative decoding": {"engaged": 2},
                                                           "flash attention": {"not_observable": 2}}
    assert out["md-simple"]["checks"]["counts"]["mechanisms"] == 2
    # /props answers for the model, the slots and the context, not the rest: those are
    # named, never read as checked
    for h in out.values():
        word, counts = h["checks"]["word"], h["checks"]["counts"]
        assert "ok (flags" not in word and "ok (env, flags" not in word, word
        assert counts["flags"] == 0 and counts["flags_compared"] == 3, counts  # model, ctx-size, parallel
        assert {"threads", "model-draft"} <= set(counts["not_reported"]), counts
        assert "ctx-size" not in counts["not_reported"], counts
        assert "flags: 3 compared, " in word and "not reported (" in word and "model-draft" in word, word
        assert "ctx-size" not in word, word
    journal = next((tmp_path / "experiments").glob("*-run1.md")).read_text()
    assert "**not reported**: threads" in journal and "**not reported**: ctx-size" not in journal
    assert "speculative decoding: **set up at start, not seen in the window**" in journal
    assert "speculative decoding: engaged in the window, flash attention: not observable" in journal
    # the window line llama-server prints when a slot that drafted finishes matches the preset's pattern
    from bisect_harness.observe.mechanisms import Window, check
    from bisect_harness.engines.presets import get_preset

    logs = [p.read_text(errors="replace") for p in (tmp_path / "experiments").rglob("*.log")]
    drafted = [t for t in logs if "draft acceptance = " in t]
    assert drafted, "no boot log holds llama-server's draft acceptance line"
    spec_check = [m for m in get_preset("llamacpp").mechanisms if m.name == "speculative decoding"]
    (r,) = check(spec_check, {"model-draft": "d.gguf"}, Window(log=drafted[0]))
    assert r.state == "engaged" and "accepted /" in r.window, r

    # the server's own figures are collected beside the client's (how well they agree is a
    # GPU measurement: this model decodes faster than a stream's chunks can be timed apart)
    figures = query(db, "SELECT json_extract(metrics, '$.decode_tok_s'), json_extract(metrics, "
                        "'$.server_decode_tok_s'), json_extract(metrics, '$.tok_s'), "
                        "json_extract(metrics, '$.predicted_rate') FROM samples s JOIN boots b ON b.id = s.boot_id "
                        "JOIN configs c ON c.id = b.config_id WHERE c.flags NOT LIKE '%model-draft%'")
    assert figures
    for decode, server_decode, tok_s, rate in figures:
        assert server_decode is not None and server_decode > 0 and rate is not None and rate > 0
        assert 0.25 < tok_s / rate < 4.0, (tok_s, rate)
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"]


def test_a_run_explains_a_real_slowdown_by_the_two_flags_that_make_it_together(models, tmp_path):
    """``explain: true`` against the real server: the slow launch adds a draft model,
    ``--spec-type draft-simple`` and an env variable llama.cpp never reads. Drafting
    with a draft this model rejects slows decoding several times, and only the two
    flags together draft at all (``-md`` alone is the trap above): the explanation's
    search, stepped by the run and booting the real server, names both flags, each
    shown by leaving it out, and never the inert variable."""
    target, draft = models
    hyps = [{"id": "tuned", "baseline": {},
             "treatment": {"flags": {"model-draft": str(draft), "spec-type": "draft-simple"},
                           "env": {"BH_INERT_TUNING": "1"}},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%", "explain": True}]
    spec = write_spec(tmp_path / "h.yaml", engine=_engine(target), benchmark=BENCH, hypotheses=hyps,
                      defaults={"boots_per_arm": 3, "max_boots_per_arm": 6, "samples_per_boot": 2})
    db = tmp_path / "r.db"
    r = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                "--journal-dir", tmp_path / "experiments", cwd=tmp_path, env=_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (h,) = last_json(r.stdout)["hypotheses"]
    assert h["verdict"] == "confirmed" and h["effect"] < 0.6, h
    ex = h["explanation"]
    assert ex["members"] == ["flag:model-draft", "flag:spec-type"], ex
    assert "env:BH_INERT_TUNING" not in ex["members"] + ex["opposite"], ex
    assert ex["stopped"] in ("explained", "undecided"), ex
    (record,) = json.loads(query(db, "SELECT summary FROM runs")[0][0])["explain"]
    every = {d["name"] for d in record["differences"]}
    left_out = {tuple(sorted(every - set(t["treatment"]))): t for t in record["tests"] if t["purpose"] == "leave out"}
    for name in ("flag:model-draft", "flag:spec-type"):  # left out, the slow launch is fast again
        t = left_out[(name,)]
        assert t["outcome"] == "confirmed" and t["ratio"] > 1.5, t
    # every boot of the search is a real boot of the server, checked like the run's own
    statuses = {s for (s,) in query(db, "SELECT status FROM boots")}
    assert statuses == {"ok"}, statuses
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"]


def test_check_flags_reads_llama_servers_help(models, tmp_path):
    target, draft = models
    hyps = [{"id": "fa", "baseline": {}, "treatment": {"flags": {"flash-attn": "on"}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "ok.yaml", engine=_engine(target), benchmark=BENCH, hypotheses=hyps)
    r = harness("run", spec, "--dry-run", "--check-flags", "--json", cwd=tmp_path, env=_env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (check,) = last_json(r.stdout)["flag_check"]
    assert check["options"] > 50 and not check["error"], check
    hyps[0]["treatment"]["flags"] = {"spec-typo": "draft-simple"}
    spec = write_spec(tmp_path / "typo.yaml", engine=_engine(target), benchmark=BENCH, hypotheses=hyps)
    r = harness("run", spec, "--dry-run", "--check-flags", cwd=tmp_path, env=_env(), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--spec-typo: not accepted" in r.stdout


def test_the_real_server_speaks_each_api_it_has(models, tmp_path):
    """llama-server's native ``/completion`` (what its 2023 versions alone had), its
    OpenAI completions and its OpenAI chat, each read by its own kind (``boot.apis``)
    from one real server: the same 24 tokens a request, counted by the server and by
    the stream alike."""
    from bisect_harness.measure.client import measure_sample_detail
    from bisect_harness.engines.server import ServerProcess, free_port
    from bisect_harness.model import BenchmarkSpec

    target, _ = models
    port = free_port()
    # flash attention off, said at verbosity 4: the preset's start-up pattern reads it
    argv = [str(SERVER), "--model", str(target), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "512",
            "--threads", "1", "--parallel", "1", "--flash-attn", "off", "--verbosity", "4"]
    with ServerProcess(argv, env=_env(), cwd=tmp_path, log_path=tmp_path / "server.log",
                       base_url=f"http://127.0.0.1:{port}", ready_timeout_s=60) as server:
        for api in ("llamacpp", "completions", "chat"):
            bench = BenchmarkSpec(api=api, model="tiny", prompt_tokens=8, output_tokens=24, requests_per_sample=2,
                                  warmup_requests=0, ignore_eos=True)
            detail = measure_sample_detail(server.base_url, bench)
            errors = [r.error for r in detail.requests]
            assert detail.result.errors == 0 and detail.result.output_tokens == 48, (api, errors)
            for req in detail.requests:
                assert req.output_tokens == 24 and req.usage_mismatch is None, (api, req)
            if api == "llamacpp":  # the native endpoint's own timings, per request
                timings = detail.responses[0]["timings"]
                assert timings["predicted_n"] == 24 and timings["predicted_per_second"] > 0, timings
        # prompts in tokens: the words fitted with the server's own /tokenize, and the
        # server's count of each prompt as sent agrees within the BOS token
        import httpx

        from bisect_harness.measure.prompt_size import size_prompts

        bench = BenchmarkSpec(api="llamacpp", prompt_tokens=40, output_tokens=4, requests_per_sample=2,
                              warmup_requests=0, ignore_eos=True)
        with httpx.Client() as http:
            size = size_prompts(http, server.base_url, bench)
        # the fit is to the nearest word: this vocabulary spends several tokens on a word
        per_word = size.tokens / size.words
        assert size.unit == "tokens" and abs(size.tokens - 40) <= per_word / 2 + 1 and "/tokenize" in size.via, size
        assert size.words != 40, "the tiny model's vocabulary splits words: the fit is not the identity"
        detail = measure_sample_detail(server.base_url, bench, prompt=size)
        counts = [r.prompt_tokens for r in detail.requests]  # each prompt's own words: recorded per request
        assert counts[0] in (size.tokens, size.tokens + 1), (counts, size)  # the first prompt, plus BOS
        assert all(abs(n - 40) <= per_word + 2 for n in counts), counts
        assert detail.result.metrics["prompt_tokens"] == sum(counts) / len(counts)
    from bisect_harness.observe.mechanisms import Window, check
    from bisect_harness.engines.presets import get_preset

    (fa,) = check([m for m in get_preset("llamacpp").mechanisms if m.name == "flash attention"], {"flash-attn": "on"},
                  Window(startup_log=(tmp_path / "server.log").read_text(errors="replace")))
    assert fa.state == "not_engaged" and "flash_attn            = disabled" in fa.startup, fa


def test_a_boots_samples_hit_no_prefix_cache_unless_the_file_asks_for_reuse(models, tmp_path):
    """llama-server keeps each slot's last prompt and serves a repeated prefix from it
    (its log: ``prompt eval time = 2.90 ms / 1 tokens``). A boot's samples send prompts
    of their own: the server computes every prompt token in every sample
    (``timings.prompt_n`` alike, ``timings.cache_n`` a few tokens: the BOS, the first
    word's space and now and then a letter, bytes in this vocabulary), and the time to
    first token is alike.
    With ``benchmark.prompt_reuse: true`` the second sample's prompt comes from the cache.
    One server, both ways (a boot's prompts are numbered by its id)."""
    from bisect_harness.engines.benchtools import ClientRunner, Endpoint
    from bisect_harness.engines.server import ServerProcess, free_port
    from bisect_harness.model import BenchmarkSpec

    target, _ = models
    port = free_port()
    argv = [str(SERVER), "--model", str(target), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "1024",
            "--threads", "1", "--parallel", "1"]
    bench = BenchmarkSpec(api="llamacpp", prompt_tokens=300, output_tokens=4, requests_per_sample=1,
                          warmup_requests=1, ignore_eos=True)
    runs = {}
    with ServerProcess(argv, env=_env(), cwd=tmp_path, log_path=tmp_path / "server.log",
                       base_url=f"http://127.0.0.1:{port}", ready_timeout_s=60) as server:
        for boot, reuse in ((1, False), (2, True)):
            runner = ClientRunner(dataclasses.replace(bench, prompt_reuse=reuse), Endpoint(server.base_url), boot)
            runner.warmup()
            with runner.session():
                runs[reuse] = [runner.sample(i).result.metrics for i in range(3)]
            size = runner.prompt
            assert size.unit == "tokens" and abs(size.tokens - 300) < 30, size
            assert size.spread == 0 if not reuse else size.unique is False, size
    fresh, reused = runs[False], runs[True]
    # every sample computes its whole prompt but the few tokens any two share in this vocabulary
    # of bytes (the BOS, the first word's space, now and then its first letter)
    whole = fresh[0]["prompt_tokens"]
    assert all(m["prompt_tokens"] == whole for m in fresh), fresh
    assert all(m["cached_prompt_tokens"] + m["prompt_tokens_evaluated"] == whole for m in fresh), fresh
    computed = [m["prompt_tokens_evaluated"] for m in fresh]
    assert max(computed) - min(computed) <= 2 and min(computed) >= whole - 8, computed
    # the time to first token alike (none served from the cache; the bound allows a shared host),
    # and above what a sample the cache serves takes (measured: 12-24 ms against 1.4-3.6 ms;
    # medians compared, so one slow read on a busy host decides nothing)
    ttft, served = sorted(m["ttft_ms"] for m in fresh), sorted(m["ttft_ms"] for m in reused)
    assert ttft[-1] < 6 * ttft[0] and ttft[1] > 1.5 * served[1], (ttft, served)
    # reused: the warm-up sent the samples' prompt, so every sample finds it in the slot
    assert reused[0]["prompt_tokens"] == reused[1]["prompt_tokens"]
    assert reused[1]["cached_prompt_tokens"] >= reused[1]["prompt_tokens"] - 2, reused[1]
    assert reused[1]["prompt_tokens_evaluated"] <= 2, reused[1]


def test_a_boots_warm_ups_are_sized_like_its_samples(models, tmp_path, monkeypatch):
    """The warm-up requests a boot sends first are fitted to ``prompt_tokens`` as its
    samples are (once, they went out in words before the fitting: 217 and 241 tokens
    evaluated against 64 asked). Read from the server's own log: each request's
    ``prompt eval time = ... / N tokens``, the warm-ups first."""
    import re

    from bisect_harness.backends.procedure import run_boot
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    target, _ = models
    monkeypatch.setenv("PATH", _env()["PATH"])
    spec = write_spec(tmp_path / "hypotheses.yaml", engine=_engine(target),
                      benchmark={"api": "llamacpp", "prompt_tokens": 40, "output_tokens": 8, "requests_per_sample": 2,
                                 "warmup_requests": 2, "ignore_eos": True},
                      defaults={"samples_per_boot": 1},
                      hypotheses=[{"id": "t", "baseline": {}, "treatment": {"flags": {"threads": 2}},
                                   "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])
    plan = make_plan(load_spec(spec), cache_dir=tmp_path / "cache")
    log = tmp_path / "boot.log"
    out = run_boot(plan.boot_request(plan.configs[0], boot_id=1, seq=1, log_path=log))
    assert out.status == "ok", (out.failure, out.log_tail)
    size = out.evidence.prompt
    assert size["unit"] == "tokens" and size["words"] != 40, size  # the fit is not the identity here
    per_word = size["tokens"] / size["words"]
    evaluated = [int(n) for n in re.findall(r"prompt eval time = +[0-9.]+ ms / +(\d+) tokens", log.read_text())]
    assert len(evaluated) == 4, evaluated  # two warm-ups, then the sample's two requests
    assert all(abs(n - 40) <= per_word + 2 for n in evaluated), (evaluated, size)


def test_a_ctx_size_is_compared_with_the_slots_the_real_server_reports(models, tmp_path, monkeypatch):
    """``--ctx-size`` is the server's total, ``/props`` the context of one slot beside the
    slot count: one boot of each config, through the plan and the boot procedure as a run
    makes them. 512 on the model trained at 512 is what the server holds; 1024 there is
    not (llama-server caps every slot at the training context, saying so in its log): a
    flag mismatch, the boot marked. 1000 over three slots of a model trained at 4096 is
    slots of 512 (1000 padded to 1024, a third padded to 512): what the total gives."""
    from bisect_harness.backends.procedure import run_boot
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    target, _ = models
    wide = build_tiny_gguf(tmp_path / "wide.gguf", layers=2, ctx=4096)
    monkeypatch.setenv("PATH", _env()["PATH"])
    hyps = [{"id": "capped", "baseline": {}, "treatment": {"flags": {"ctx-size": 1024}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
            {"id": "slots", "baseline": {"flags": {"model": str(wide), "ctx-size": 1000, "parallel": 3}},
             "treatment": {"flags": {"model": str(wide), "ctx-size": 1000, "parallel": 3, "threads": 2}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "hypotheses.yaml", engine=_engine(target),
                      benchmark={"prompt_tokens": 8, "output_tokens": 4, "requests_per_sample": 1,
                                 "warmup_requests": 0},
                      defaults={"samples_per_boot": 1}, hypotheses=hyps)
    plan = make_plan(load_spec(spec), cache_dir=tmp_path / "cache")
    seen = {}
    for i, config in enumerate(plan.configs, start=1):
        key = (config.arm.flags["ctx-size"], config.arm.flags["parallel"])
        if key in seen:  # the same context and slots with another thread count: booted once
            continue
        log = tmp_path / f"boot{i}.log"
        out = run_boot(plan.boot_request(config, boot_id=i, seq=i, log_path=log))
        assert out.status == "ok", (out.failure, out.log_tail)
        (ctx,) = [c for c in out.flag_report["checks"] if c["flag"] == "ctx-size"]
        seen[key] = (ctx, out.marks, log.read_text(errors="replace"))
    assert set(seen) == {(512, 1), (1024, 1), (1000, 3)}, seen
    ctx, marks, _ = seen[(512, 1)]
    assert ctx["status"] == "matched" and ctx["effective"] == {"n_ctx": 512, "total_slots": 1}, ctx
    assert "flag_mismatch" not in marks
    ctx, marks, log = seen[(1024, 1)]
    assert ctx["status"] == "mismatched" and ctx["effective"] == {"n_ctx": 512, "total_slots": 1}, ctx
    assert "flag_mismatch" in marks, marks
    assert "the slot context (1024) exceeds the training context of the model (512) - capping" in log
    ctx, marks, _ = seen[(1000, 3)]
    assert ctx["status"] == "matched" and ctx["effective"] == {"n_ctx": 512, "total_slots": 3}, ctx
    assert "flag_mismatch" not in marks
