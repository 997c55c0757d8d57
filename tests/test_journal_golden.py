"""The journal's shape, pinned by golden files (as pyperf and Otava test their output).

Each scenario of ``journal_scenarios`` runs the real hypothesis loop, bisection or
explanation on a real ledger (the boots from the mock backend, seeded) and renders
its journal; the text, normalized, must equal ``tests/golden/<scenario>.md``. A
change to the journal's wording or layout shows up here as a diff to read. To
accept a change on purpose, write the files again and review the diff:

    BISECT_HARNESS_REGEN_GOLDEN=1 python -m pytest tests/test_journal_golden.py

Beside the files, each journal is held to what it claims: the summary's figures are
the ledger's, the answer of a busy-host bisection and its steps are in its first
screen, a comparison's two numbers never print alike, one look count per sentence.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bisect_harness.model import shown_apart
from bisect_harness.report.cells import boots_per_arm, effect, probability
from helpers import query
from journal_scenarios import SCENARIOS, Rendered

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("BISECT_HARNESS_REGEN_GOLDEN") == "1"
FIRST_SCREEN = 40


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Rendered]:
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in SCENARIOS.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_journal_matches_its_golden_file(rendered, name):
    path = GOLDEN / f"{name}.md"
    text = rendered[name].text
    if REGEN:
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: BISECT_HARNESS_REGEN_GOLDEN=1 writes it"
    golden = path.read_text()
    if text != golden:
        diff = [f"line {i + 1}:\n  golden: {a}\n  now:    {b}"
                for i, (a, b) in enumerate(zip(golden.splitlines(), text.splitlines())) if a != b][:5]
        pytest.fail(f"{name}: the journal differs from {path.name} ({len(golden.splitlines())} lines golden, "
                    f"{len(text.splitlines())} now); BISECT_HARNESS_REGEN_GOLDEN=1 writes it again.\n"
                    + "\n".join(diff))


def _summary(text: str) -> list[str]:
    part = text.split("## Summary\n\n", 1)[1]
    return [line[2:] for line in part.split("\n\n", 1)[0].splitlines()]


def test_each_hypothesis_is_one_summary_line_whose_figures_are_the_ledgers(rendered):
    r = rendered["verdicts"]
    rows = query(r.db, "SELECT h.hid, v.outcome, v.ratio, v.ci_low, v.ci_high, v.baseline_boot_ids, "
                       "v.treatment_boot_ids FROM hypotheses h JOIN verdicts v ON v.hypothesis_id = h.id "
                       "WHERE v.id = (SELECT MAX(id) FROM verdicts WHERE hypothesis_id = h.id) ORDER BY h.id")
    assert {row[1] for row in rows} == {"confirmed", "refuted", "inconclusive"}
    lines = _summary(r.text)
    assert len(lines) == len(rows)
    for line, (hid, outcome, ratio, lo, hi, b, t) in zip(lines, rows):
        assert line.startswith(f"`{hid}` (tok_s, increase >= ")
        shown = f"**{outcome}**, {effect(ratio, lo, hi)}, {boots_per_arm(json.loads(b), json.loads(t))}"
        assert shown in line, line
        lead = f"**{outcome.capitalize()}: {effect(ratio, lo, hi)}, {boots_per_arm(json.loads(b), json.loads(t))}.**"
        section = r.text.split(f"### `{hid}`", 1)[1].split("\n### ", 1)[0]
        paragraphs = [x for x in section.split("\n\n") if x.strip() and not x.startswith("> ")]
        assert paragraphs[0].startswith(lead), section[:400]  # the section opens with the answer
    marked = query(r.db, "SELECT COUNT(*) FROM boots WHERE marks LIKE '%usage_mismatch%'")[0][0]
    assert marked and f"| `usage_mismatch` | {marked} |" in r.text


def test_a_busy_bisection_answers_and_shows_its_steps_in_the_first_screen(rendered):
    r = rendered["busy-bisection"]
    (result,) = [json.loads(x) for (x,) in query(r.db, "SELECT result FROM bisections")]
    booted = query(r.db, "SELECT id, marks FROM boots ORDER BY id")
    busy = [i for i, marks in booted if "host_busy" in json.loads(marks)]
    assert len(busy) >= 20 and result["culprit"], "the scenario is a search on a busy host that finds its culprit"
    first = r.text.splitlines()[:FIRST_SCREEN]
    culprit = f"Culprit: `{result['culprit'][:12]}`"
    assert any(culprit in line for line in first), "\n".join(first)
    assert f"P {probability(result['probability'])}" in _summary(r.text)[0]
    assert f"{len(busy)} of its {len(booted)} boots on a busy host" in _summary(r.text)[0]
    table = r.text.split("The steps by commit", 1)[1].split("\n\n", 2)[1].splitlines()
    assert table[0].startswith("| commit |") and len(table) > 4
    end = r.text.splitlines().index(table[-1])
    assert end < FIRST_SCREEN, f"the step table ends at line {end + 1}"
    assert f"`{result['culprit'][:12]}` **culprit**" in table[2 + sorted(
        {p for (p,) in query(r.db, "SELECT DISTINCT \"commit\" FROM bisect_probes")},
        key=result_order(r)).index(result["culprit"])]
    # the busy boots: one table row each, with their figures; no paragraph of sentences with process lists
    rows = [line for line in r.text.split("boots ran on a busy host", 1)[1].split("</details>", 1)[0].splitlines()
            if re.match(r"\| \d+ \| ", line)]
    assert [int(line.split(" | ")[0][2:]) for line in rows] == busy
    assert "host busy during" not in r.text and max(len(line) for line in first) < 400


def result_order(r: Rendered):
    (commits,) = [json.loads(x) for (x,) in query(r.db, "SELECT commits FROM bisections")]
    return commits.index


def test_an_explanation_leads_with_its_set(rendered):
    r = rendered["explanation"]
    (summary,) = [json.loads(x) for (x,) in query(r.db, "SELECT summary FROM runs")]
    (rec,) = summary["explain"]
    assert rec["members"] == ["env:A", "env:B"]
    (line,) = _summary(r.text)
    e = rec["effect"]
    assert f"`env:A` + `env:B` together ({effect(e['ratio'], *e['ci'])} of the fast arm), the minimal set" in line
    assert "p 0.0000" not in r.text  # a p-value too small for four decimals is printed in e-notation


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_one_look_count_per_sentence_and_comparisons_print_apart(rendered, name):
    text = rendered[name].text
    assert "look(s)" not in text
    for sentence in re.split(r"(?<=[.;])\s", text):
        assert len(re.findall(r"\blooks? \d+", sentence)) <= 1, sentence
    compared = re.findall(r"p ?= ?([0-9.e+-]+),? (?:<=|vs|>|level per look) ([0-9.e+-]+)", text)
    assert compared, "the scenario prints at least one comparison"
    for a, b in compared:
        assert a != b, (a, b)


def test_two_numbers_print_with_the_digits_that_tell_them_apart():
    assert shown_apart(0.00196, 0.002) == ("0.00196", "0.002")  # was "0.002 <= 0.002"
    assert shown_apart(0.00092, 0.011) == ("0.00092", "0.011")
    assert shown_apart(0.05, 0.05) == ("0.05", "0.05")
    assert effect(0.6049, 0.5512, 0.6647) == "0.60x [0.55, 0.66]"
    assert effect(1.0049, 1.0011, 1.0098) == "1.005x [1.001, 1.010]"  # two decimals would print 1.00 twice
    assert effect(1.02, None, None) == "1.02x (no interval yet)"
    assert probability(0.9996) == "0.9996" and probability(1 - 1e-12) == "> 0.99999999"
    assert probability(1.0) == "> 0.99999999"  # a posterior of 1.0 is the float's rounding, not certainty
