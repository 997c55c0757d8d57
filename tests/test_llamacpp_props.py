"""The flag check against what llama-server's ``/props`` really returns, and against
vLLM's ``/v1/models``.

``fixtures/engines/llamacpp-0.3.36-props-*.json`` are ``GET /props`` bodies of the real
llama-server (llama.cpp vendored in llama-cpp-python 0.3.36, built by
``.ci/install-llamacpp``), each launched from the flags its header names through the
``llamacpp`` preset's argv: the total context over one, three and four slots, split and
unified, capped by ``--kv-unified-per-slot`` and by the model's training context, and
the sampling settings. ``--ctx-size`` is the total, ``/props`` the context of one slot:
:mod:`bisect_harness.observe.provenance.slot_context` is the rule, checked here against
the server's answers and against llama.cpp's own arithmetic, old and new.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_harness.engines import presets
from bisect_harness.observe.provenance import MATCHED, MISMATCHED, NOT_REPORTED, FlagReport, flag_report, values_match
from bisect_harness.observe.provenance.slot_context import slot_bounds, slot_context_matches

ENGINES = Path(__file__).parent / "fixtures" / "engines"
PROPS = sorted(ENGINES.glob("llamacpp-0.3.36-props-*.json"))


def recorded(path: Path) -> tuple[dict, dict]:
    """(the flags the server was launched with, its /props body) of a recorded fixture."""
    lines = path.read_text().splitlines()
    flags = json.loads(next(ln for ln in lines if ln.startswith("# flags: "))[len("# flags: "):])
    return flags, json.loads("\n".join(ln for ln in lines if not ln.startswith("#")))


def props(case: str) -> tuple[dict, dict]:
    return recorded(ENGINES / f"llamacpp-0.3.36-props-{case}.json")


def check(preset_name: str, flags: dict, info: dict | None) -> FlagReport:
    """The flag report exactly as a boot makes it: every flag planned (plan/build.py), one
    the preset has no key for listed as not reported (backends/procedure.py)."""
    preset = presets.get_preset(preset_name)
    return flag_report(flags, info, aliases={f: presets.info_key(f, preset) for f in flags},
                       compare={f: presets.compare_mode(f, preset) for f in flags})


def statuses(rep: FlagReport) -> dict[str, str]:
    return {c.flag: c.status for c in rep.checks}


# --------------------------------------------------------------------------- the recorded servers


def test_every_recording_is_there():
    assert {p.name.split("props-")[1][:-5] for p in PROPS} == {
        "c512-np1", "c1024-np1-capped", "c1000-np3", "c2048-np4", "c2048-np4-kvu", "c2048-npauto",
        "c2048-np4-kvu-per-slot600", "sampling"}


@pytest.mark.parametrize("case, slot, slots", [
    ("c512-np1", 512, 1),
    ("c1000-np3", 512, 3),  # 1000 padded to 1024, a third (341) padded to 512: 1536 in all
    ("c2048-np4", 512, 4),  # split over four slots
    ("c2048-np4-kvu", 2048, 4),  # unified: every slot sees the whole total
    ("c2048-npauto", 2048, 4),  # --parallel left out: four slots and a unified cache
    ("c2048-np4-kvu-per-slot600", 600, 4),  # capped by --kv-unified-per-slot
])
def test_the_context_a_server_was_given_is_compared_with_its_slot(case, slot, slots):
    flags, body = props(case)
    assert (body["default_generation_settings"]["n_ctx"], body["total_slots"]) == (slot, slots)
    rep = check("llamacpp", flags, body)
    c = rep.check("ctx-size")
    assert c.status == MATCHED and c.key == "default_generation_settings.n_ctx", rep.describe()
    assert c.effective == {"n_ctx": slot, "total_slots": slots}
    assert rep.ok and statuses(rep)["model"] == MATCHED
    if "parallel" in flags:
        assert statuses(rep)["parallel"] == MATCHED
    # what /props does not say stays not reported, never matched
    unreported = {f for f, s in statuses(rep).items() if s == NOT_REPORTED}
    assert unreported == {"kv-unified", "kv-unified-per-slot"} & set(flags)
    assert FlagReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep


@pytest.mark.parametrize("case, wrong", [
    ("c512-np1", 1024), ("c512-np1", 256),
    ("c1000-np3", 4096), ("c1000-np3", 200),  # the slot of 512 is neither 4096's share nor 200's
    ("c2048-np4", 8192), ("c2048-np4", 1024),
    ("c2048-np4-kvu", 4096), ("c2048-npauto", 4096), ("c2048-npauto", 1024),
])
def test_a_context_the_server_does_not_hold_is_a_mismatch(case, wrong):
    flags, body = props(case)
    rep = check("llamacpp", {**flags, "ctx-size": wrong}, body)
    assert statuses(rep)["ctx-size"] == MISMATCHED and not rep.ok
    assert f"--ctx-size: requested {wrong}, server has default_generation_settings.n_ctx=" in rep.describe()


def test_what_props_cannot_tell_apart_is_believed():
    """/props does not say whether the cache is unified: 2048 a slot over four slots is
    2048 unified, or 8192 split. Either is what the flag would give, so either matches."""
    flags, body = props("c2048-np4-kvu")
    assert statuses(check("llamacpp", {**flags, "ctx-size": 8192}, body))["ctx-size"] == MATCHED


def test_the_cap_of_a_slot_is_read_from_the_flags():
    flags, body = props("c2048-np4-kvu-per-slot600")
    uncapped = {f: v for f, v in flags.items() if f != "kv-unified-per-slot"}
    assert statuses(check("llamacpp", uncapped, body))["ctx-size"] == MISMATCHED  # 600 is no share of 2048
    assert statuses(check("llamacpp", {**uncapped, "--kv-unified-per-slot": "600"}, body))["ctx-size"] == MATCHED


def test_a_slot_the_model_capped_is_not_what_was_asked():
    """``-c 1024`` on a model trained at 512: llama-server logs "the slot context (1024)
    exceeds the training context of the model (512) - capping" and every slot holds 512.
    ``/props`` does not carry the training context; the flag did not take, and says so."""
    flags, body = props("c1024-np1-capped")
    rep = check("llamacpp", flags, body)
    assert statuses(rep) == {"model": MATCHED, "ctx-size": MISMATCHED, "parallel": MATCHED}
    assert rep.check("ctx-size").effective == {"n_ctx": 512, "total_slots": 1}
    assert statuses(check("llamacpp", {**flags, "ctx-size": 512}, body))["ctx-size"] == MATCHED


def test_the_sampling_settings_and_the_alias_are_compared_as_the_server_holds_them():
    flags, body = props("sampling")
    assert body["default_generation_settings"]["params"]["temperature"] == 0.30000001192092896
    assert body["model_alias"] == "tiny-a"  # --alias tiny-b,tiny-a: the first of the sorted set
    rep = check("llamacpp", flags, body)
    got = statuses(rep)
    # `slots: false` is left out of the argv (llama.cpp's false is an omitted flag) and
    # llama-server keeps /slots on: the flag did not take, and the check says so
    assert got.pop("slots") == MISMATCHED and rep.check("slots").effective is True
    assert set(got.values()) == {MATCHED}, rep.describe()
    # the same values, one off, are mismatches
    for flag, other in (("temp", 0.31), ("top-k", 8), ("mirostat-ent", 4.4), ("alias", "tiny-c"),
                        ("ignore-eos", False), ("ctx-size", 1024)):
        assert statuses(check("llamacpp", {**flags, flag: other}, body))[flag] == MISMATCHED, flag


def test_every_key_the_preset_reads_is_in_what_the_server_returns():
    """A key spelt wrong would leave its flag not reported for ever: each one the preset
    maps is in the recorded body (the sampling launch set them all but the ctx-size's)."""
    preset = presets.get_preset("llamacpp")
    _, body = props("sampling")
    from bisect_harness.measure.values import lookup

    for flag, key in preset.info_keys.items():
        lookup(body, key)  # KeyError names the part that is missing
    assert set(presets.COMPARE_MODES) >= set(preset.info_compare.values())


def test_what_props_does_not_carry_is_not_reported():
    flags, body = props("sampling")
    asked = {"model-draft": "d.gguf", "spec-type": "draft-simple", "n-gpu-layers": 99, "threads": 4,
             "flash-attn": "on", "batch-size": 512, "n-predict": 64, "chat-template": "chatml", "seed": 42}
    rep = check("llamacpp", asked, body)
    assert set(statuses(rep).values()) == {NOT_REPORTED} and all(c.key == "" for c in rep.checks)


# --------------------------------------------------------------------------- the rule itself


def _new_slot(total: int, slots: int, unified: bool) -> int:
    """llama.cpp 0.3.36's slot (src/llama-context.cpp), uncapped."""
    n_ctx = -(-total // 256) * 256
    return n_ctx if unified else -(-(n_ctx // slots) // 256) * 256


def _old_slot(total: int, slots: int, pad: int) -> int:
    """Earlier builds: the total padded to ``pad`` (32, or 256 with flash attention; 1:
    none), split over the slots unpadded (server.cpp ``n_ctx / params.n_parallel``)."""
    return (-(-total // pad) * pad) // slots


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 7, 8])
def test_the_bounds_hold_every_rule_llama_cpp_had(slots):
    for total in (*range(64, 4200, 37), 512, 1024, 4096, 8192, 32768):
        ok = [_new_slot(total, slots, True), _new_slot(total, slots, False),
              *(_old_slot(total, slots, pad) for pad in (1, 32, 256))]
        for slot in ok:
            took, shown = slot_context_matches(total, slot, {"total_slots": slots}, {})
            assert took is True, (total, slots, slot)
        assert shown == {"n_ctx": ok[-1], "total_slots": slots}
        # a server that ignored the flag holds its default: another figure altogether, where a
        # slot gets a padding's worth (256) at least (below that the padding makes totals alike),
        # but where a slot's share of the one is the other whole (a unified cache of one total
        # and a split one of the other look alike in /props: see the test below)
        for default in (4096, 8192):
            if total >= 256 * slots and (total * 2 <= default or total >= default * 2) \
                    and abs(default // slots - total) > 256 and abs(total // slots - default) > 256:
                for slot in (default, _new_slot(default, slots, False)):
                    took, _ = slot_context_matches(total, slot, {"total_slots": slots}, {})
                    assert took is False, (total, slots, slot)


def test_slot_bounds_and_what_cannot_be_told():
    assert slot_bounds(1000, 3) == ((1000, 1024), (333, 512))
    assert slot_bounds(2048, 4, per_slot=600) == ((600, 600), (512, 512))
    # 0 is the model's own context, which /props does not report; nonsense is not compared
    for asked, slot in ((0, 512), ("1k", 512), (512, None), (512, "x")):
        assert slot_context_matches(asked, slot, {"total_slots": 1}, {})[0] is None
    # no slot count (builds before total_slots): the whole total in a slot is believed,
    # a share of it cannot be told
    assert slot_context_matches(1000, 1024, {}, {})[0] is True
    assert slot_context_matches(1000, 512, {}, {})[0] is None
    rep = flag_report({"ctx-size": 1000}, {"default_generation_settings": {"n_ctx": 512}},
                      aliases={"ctx-size": "default_generation_settings.n_ctx"}, compare={"ctx-size": "slot_context"})
    assert rep.check("ctx-size").status == NOT_REPORTED and rep.ok


@pytest.mark.parametrize("a, b, mode, eq", [
    (0.3, 0.30000001192092896, "float32", True),
    ("0.9", 0.8999999761581421, "float32", True),
    (0.3, 0.30000001192092896, "equal", False),  # why the mode: the C float is not the asked double
    (0.31, 0.30000001192092896, "float32", False),
    (7, 7, "float32", True), ("x", "x", "float32", True),
    ("tiny-b,tiny-a", "tiny-a", "one_of", True), (["q", "r"], "q", "one_of", True),
    ("tiny", "tiny", "one_of", True), ("tiny-b,tiny-a", "tiny-c", "one_of", False),
])
def test_values_match_float32_and_one_of(a, b, mode, eq):
    assert values_match(a, b, mode) is eq


def test_the_slot_context_is_no_value_to_value_comparison():
    with pytest.raises(ValueError, match="flag_report"):
        values_match(1024, 512, "slot_context")


# --------------------------------------------------------------------------- vLLM without /server_info


def test_vllms_model_list_answers_the_model_its_name_and_max_model_len():
    text = (ENGINES / "vllm-0.32.0-v1_models.json").read_text()
    body = json.loads("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))
    flags = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "served-model-name": ["qwen", "q"], "max-model-len": 2048,
             "tp": 1, "enforce-eager": True}
    rep = check("vllm", flags, body)
    assert statuses(rep) == {"model": MATCHED, "served-model-name": MATCHED, "max-model-len": MATCHED,
                             "tp": NOT_REPORTED, "enforce-eager": NOT_REPORTED}, rep.describe()
    assert rep.check("max-model-len").key == "max_model_len"
    assert statuses(check("vllm", {"max-model-len": 4096, "model": "other"}, body)) == {
        "max-model-len": MISMATCHED, "model": MISMATCHED}
    # several served names, several cards: which one a flag means is not known
    two = {**body, "data": body["data"] * 2}
    assert statuses(check("vllm", {"max-model-len": 2048}, two)) == {"max-model-len": NOT_REPORTED}
    assert "/v1/models" in presets.get_preset("vllm").server_info_paths
