"""A config that never booted is "not measured" (exit 3), a help argv that cannot
run fails ``--check-flags`` (exit 2), an interpreter's own scripts come first on
PATH, and the mechanism checks read the engine's evidence as declared."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bisect_harness.evidence import BootEvidence
from bisect_harness.observe import mechanisms
from bisect_harness.observe.mechanisms import InfoField, Mechanism, StartupLine, Window
from bisect_harness.measure.sources.prometheus import parse_prometheus
from bisect_harness.engines.presets import canonical_flag, get_preset
from bisect_harness.engines.envs import CommitEnv

from helpers import harness, last_json, query, write_spec

MISSING = "/nonexistent/bin/vllm"
HYP = [{"id": "h1", "baseline": {}, "treatment": {"env": {"FOO": "1"}}, "metric": "tok_s",
        "expect": "decrease", "min_effect": "10%"}]
BENCH = {"prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 1, "warmup_requests": 0}


def test_a_launch_that_never_boots_is_not_measured_and_exits_3(tmp_path):
    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "openai", "launch": [MISSING, "serve", "--port", "{port}"],
                                                   "ready_timeout_s": 10},
                      benchmark=BENCH, hypotheses=HYP, defaults={"boot_retries": 1})
    db = tmp_path / "r.db"
    r = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=120)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    err = " ".join(r.stderr.split())
    assert "1 of 1 hypotheses not measured" in err
    assert f"launch argv: {MISSING} serve --port" in err and "No such file or directory" in err
    (h,) = last_json(r.stdout)["hypotheses"]
    assert h["verdict"] == "not measured" and h["measured"] is False
    assert h["checks"]["counts"] == {"env": 0, "flags": 0, "mechanisms": 0, "flags_compared": 0,
                                     "flags_not_reported": 0, "not_reported": []}
    assert not h["checks"]["word"].startswith("ok")  # "unchecked" (or what a busy host added)
    # every boot is in the ledger, failed ones too; the verdict row keeps three outcomes
    assert [s for (s,) in query(db, "SELECT status FROM boots")] == ["failed"] * 4
    assert query(db, "SELECT outcome, test FROM verdicts") == [("inconclusive", "not measured")]
    journal = next((tmp_path / "exp").glob("*-run1.md")).read_text()
    assert "**not measured**" in journal


def test_check_flags_fails_when_the_help_argv_cannot_run(tmp_path):
    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "openai", "launch": [MISSING, "serve", "--port", "{port}"]},
                      benchmark=BENCH, hypotheses=HYP)
    r = harness("run", spec, "--dry-run", "--check-flags", cwd=tmp_path, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert f"the help argv `{MISSING} serve --port 0 --help` could not be read" in err
    assert "no flag was checked" in err


def test_a_shared_interpreter_puts_its_own_scripts_first(tmp_path):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    env = CommitEnv(python=str(venv_bin / "python")).apply({"PATH": f"/usr/bin{os.pathsep}{venv_bin}"})
    assert env["PATH"].split(os.pathsep) == [str(venv_bin), "/usr/bin"]


# ---------------------------------------------------------------- mechanism checks

# llama.cpp's /metrics as tools/server/server-task.cpp writes it (llama-cpp-python 0.3.36's tree)
LLAMACPP_METRICS = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 192
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {drafted}
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
"""


def _scrape(drafted: int, accepted: int = 0):
    return parse_prometheus(LLAMACPP_METRICS.format(drafted=drafted, accepted=accepted))


def _llamacpp(flags: dict, before=None, after=None, log: str = "", startup: str = ""):
    preset = get_preset("llamacpp")
    canon = {canonical_flag(k, preset): v for k, v in flags.items()}
    return mechanisms.check(preset.mechanisms, canon, Window(before=before, after=after, log=log, startup_log=startup))


def test_the_draft_flag_alone_is_caught_by_its_counter_over_the_window():
    (r,) = _llamacpp({"-md": "/m/draft.gguf"}, _scrape(0), _scrape(0))
    assert (r.name, r.flags, r.state) == ("speculative decoding", ("model-draft",), "not_engaged")
    assert r.evidence == "llamacpp:spec_decode_num_draft_tokens_total +0 over the window"
    # the draft model loaded at start and never drafted: set up, not seen
    (r,) = _llamacpp({"-md": "/m/draft.gguf"}, _scrape(0), _scrape(0),
                     startup="0.00.014.693 I common_speculative_init_result: loading draft model 'd.gguf'\n")
    assert r.state == "set_up_not_seen" and "loading draft model" in r.startup
    # drafted in the warm-up only: still not engaged in the window
    (r,) = _llamacpp({"md": "/m/draft.gguf", "spec-type": "draft-simple"}, _scrape(87), _scrape(87))
    assert r.state == "not_engaged"
    (r,) = _llamacpp({"md": "/m/draft.gguf", "spec-type": "draft-simple"}, _scrape(87, 3), _scrape(207, 93))
    assert r.state == "engaged" and r.flags == ("model-draft", "spec-type")
    assert r.evidence == ("llamacpp:spec_decode_num_draft_tokens_total +120 over the window, "
                          "llamacpp:spec_decode_num_accepted_tokens_total +90 (acceptance 75%)")


def test_without_metrics_the_window_log_decides_else_not_observable_never_a_pass():
    # the line llama-server really prints when a slot that drafted finishes (server-context.cpp)
    log = ("0.00.541.501 I slot print_timing: id  0 | task 0 | draft acceptance = 0.97938 (  190 accepted /   194 "
           "generated), mean len =  1.98\n")
    (r,) = _llamacpp({"model-draft": "/m/d.gguf"}, log=log)
    assert r.state == "engaged" and "draft acceptance = 0.97938" in r.evidence
    (r,) = _llamacpp({"model-draft": "/m/d.gguf"}, startup=log)  # printed before the window: not evidence
    assert r.state == "not_observable" and "no evidence" in r.evidence
    assert mechanisms.marks([r]) == []


def test_flash_attention_has_only_start_up_evidence():
    assert _llamacpp({"ctx-size": 512, "flash-attn": "off"}) == []
    (r,) = _llamacpp({"flash-attn": "on"}, startup="0.00.007.757 I llama_context: flash_attn            = disabled\n")
    assert (r.name, r.state) == ("flash attention", "not_engaged") and "could not run" in r.evidence
    (r,) = _llamacpp({"flash-attn": "on"}, startup="0.00.007.757 I llama_context: flash_attn            = enabled\n")
    assert r.state == "not_observable" and r.evidence.startswith("set up at start")


def test_start_up_fields_and_the_last_start_up_line_win():
    m = Mechanism("CUDA graphs", ("x",), evidence=(), startup=(
        InfoField("a.b", lambda v: None if v is None else v != "NONE"),
        StartupLine(set_up="captured", not_set_up="disabled")), source="test")
    assert mechanisms.check([m], {"x": 1}, Window(server_info={"a": {"b": "NONE"}}))[0].state == "not_engaged"
    assert mechanisms.check([m], {"x": 1}, Window(server_info={"a": {}},
                                                  startup_log="graphs captured\nthen graphs disabled\n"))[0].state \
        == "not_engaged"
    assert mechanisms.check([m], {"x": 1}, Window(startup_log="disabled\ncaptured\n"))[0].state == "not_observable"
    assert mechanisms.check([m], {"y": 1}, Window()) == []


def test_vllm_declares_its_cuda_graph_claim_and_reads_cudagraph_mode_at_start():
    preset = get_preset("vllm")
    graphs = next(m for m in preset.mechanisms if m.name == "CUDA graphs")
    assert graphs.claimed_by({"enforce-eager": False}) == ("enforce-eager",)
    assert graphs.claimed_by({"enforce-eager": True}) == ()
    info = {"vllm_config": {"compilation_config": {"cudagraph_mode": "NONE"}}}
    (r,) = mechanisms.check([graphs], {"enforce-eager": False}, Window(server_info=info))
    assert r.state == "not_engaged"
    info["vllm_config"]["compilation_config"]["cudagraph_mode"] = "FULL_AND_PIECEWISE"
    (r,) = mechanisms.check([graphs], {"enforce-eager": False}, Window(server_info=info))
    assert r.state == "not_observable"  # set up; without --cudagraph-metrics nothing says it ran


def test_sglang_speculative_attention_mode_claims_no_cuda_graphs():
    preset = get_preset("sglang")
    graphs = next(m for m in preset.mechanisms if m.name == "CUDA graphs")
    flags = {canonical_flag("speculative_attention_mode", preset): "decode"}
    log = ("[2025-12-01 10:00:00 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4\n"
           "[2025-12-01 10:00:08 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=7.91 s\n")
    (r,) = mechanisms.check([graphs], flags, Window(server_info={"disable_cuda_graph": False}, startup_log=log))
    assert r.state == "not_observable" and r.flags == () and r.on_by_default  # a capture is not a replay
    assert "Capture target verify CUDA graph end" in r.startup
    (r,) = mechanisms.check([graphs], flags, Window(server_info={"disable_cuda_graph": True}, startup_log=log))
    assert r.state == "not_engaged"


def test_the_checks_word_says_what_was_checked_and_never_ok_for_nothing():
    from bisect_harness.evidence import Finding, FindingKind
    from bisect_harness.report.journal import checks_cell, checks_word

    assert checks_word({"env": 0, "flags": 0, "mechanisms": 0}) == "unchecked"
    assert checks_word({"env": 2, "flags": 0, "mechanisms": 1}) == "ok (env, mechanisms)"
    assert checks_cell([], 0, {"env": 0, "flags": 0, "mechanisms": 0}) == "unchecked"
    marked = Finding(FindingKind.MARKED_BOOT, "treatment boot 3: mechanism_not_engaged", side="treatment", boots=(3,),
                     figures={"marks": ["mechanism_not_engaged"]})
    assert checks_cell([marked], 0, {"env": 0, "flags": 0, "mechanisms": 1}) == "**mechanism_not_engaged x1**"


def _flag_boot(i, *checks, env_vars=()):
    """A good boot whose flag report holds ``checks`` (flag, key, requested, effective, status)."""
    from types import SimpleNamespace

    from bisect_harness.observe.provenance import FlagCheck, FlagReport

    rep = FlagReport(tuple(FlagCheck(*c) for c in checks)).to_dict()
    env = {"vars": [{"name": v} for v in env_vars], "state": "ok"} if env_vars else None
    return SimpleNamespace(id=i, status="ok", env_report=env, flag_report=rep, evidence=BootEvidence())


def test_a_flag_the_server_does_not_report_is_never_ok():
    """llama.cpp's /props echoes the model and the slots, not --flash-attn: the flag is
    planned, listed as not reported, and every word a verdict shows (the checks column,
    --json, the boot table, the mechanism layer) says so, never "ok" or "yes" for it."""
    from bisect_harness.decide.verdict import checks_done
    from bisect_harness.decide.layers import flag_layer
    from bisect_harness.observe.provenance import NOT_REPORTED, flag_report
    from bisect_harness.cli.summary import _checks_json
    from bisect_harness.evidence import Finding, FindingKind
    from bisect_harness.record.ledger import VerdictRow
    from bisect_harness.report.config_view import flag_cell
    from bisect_harness.report.journal import checks_cell, checks_word

    # the planned check as local._verify makes it: a flag with no key (None) is never looked up by name
    rep = flag_report({"model": "/m.gguf", "flash-attn": "auto"}, {"model_path": "/m.gguf", "flash_attn": "auto"},
                      aliases={"model": "model_path", "flash-attn": None})
    assert [(c.flag, c.status) for c in rep.checks] == [("model", "matched"), ("flash-attn", NOT_REPORTED)]
    assert rep.checks[1].key == "" and len(rep.compared) == 1

    llama = ("model", "model_path", "/m.gguf", "/m.gguf", "matched")
    fa = ("flash-attn", "", "auto", None, "not_reported")
    boots = [_flag_boot(1, llama, fa, env_vars=("X",)), _flag_boot(2, llama, fa, env_vars=("X",))]
    counts = checks_done(boots)
    assert counts["flags"] == 0 and counts["flags_compared"] == 1 and counts["flags_not_reported"] == 1
    assert counts["not_reported"] == ["flash-attn"] and counts["env"] == 2
    word = checks_word(counts)
    assert word == "ok (env), flags: 1 compared, 1 not reported (flash-attn)", word
    assert checks_word(checks_done([_flag_boot(1, fa)])) == "unchecked, flags: 1 not reported (flash-attn)"
    # every planned flag compared: then, and only then, "flags" is ok
    assert checks_word(checks_done([_flag_boot(1, llama)])) == "ok (flags)"
    # beside a boot's marks too, never hidden
    busy = Finding(FindingKind.MARKED_BOOT, "treatment boot 3: host_busy", side="treatment", boots=(3,),
                   figures={"marks": ["host_busy"]})
    cell = checks_cell([busy], 0, counts)
    assert cell == "**host_busy x1**, flags: 1 compared, 1 not reported (flash-attn)", cell
    verdict = VerdictRow(warnings=[], stats={"checks": counts})
    out = _checks_json(verdict)
    assert out["word"] == word and out["counts"]["not_reported"] == ["flash-attn"]
    assert "ok (flags)" not in out["word"]
    # the boot table's cell and the mechanism layer
    cell = flag_cell(boots[0].flag_report)
    assert cell == "1 matched; **not reported**: flash-attn" and not cell.startswith("yes"), cell
    assert flag_cell(_flag_boot(1, llama).flag_report) == "yes (1 compared, all matched)"
    layer = flag_layer(boots)
    assert layer["accepted"] == "unknown" and layer["not_reported"] == ["flash-attn"], layer
    assert flag_layer([_flag_boot(1, llama)])["accepted"] == "yes"
    # a verdict recorded before the harness counted not-reported flags does not claim them either
    assert checks_word({"env": 1, "flags": 2, "mechanisms": 0}).startswith("ok (env), flags: some compared")


def test_the_plan_checks_every_flag_even_one_the_preset_cannot_look_up(tmp_path):
    from bisect_harness.spec import load_spec
    from bisect_harness.plan.build import make_plan

    hyps = [{"id": "fa", "baseline": {}, "treatment": {"flags": {"flash-attn": "auto", "parallel": 2}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "llamacpp", "flags": {"model": "m.gguf"}},
                      benchmark=BENCH, hypotheses=hyps)
    plan = make_plan(load_spec(spec), cache_dir=tmp_path / "cache")
    treat = plan.recipe(plan.hypotheses[0].treatment).request
    keys = {flag: key for flag, _v, key, _m in treat.flag_checks}
    assert keys == {"model": "model_path", "flash-attn": None, "parallel": "total_slots"}, keys
