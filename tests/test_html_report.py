"""``harness report``: the ledger as static HTML pages, read in a real headless browser.

One ledger, made once for the module by the real ``harness`` commands in this process
(boots answered by the mock backend: ``mock_boots.Planted``, the demo history's 1.9x
regression, and ``curve_boots.Curved``, a curve that wins at low load): two runs of a
hypothesis that bisects its confirmed regression, a load-curve run, and ten nights
of a nightly series whose first slow night alerts and bisects and whose last stores a
change-point pass. A second ledger holds 200 runs, copies of those rows made through
the ledger's session (:func:`copy_runs`).

The pages are opened in Chromium (the distribution's, driven by playwright's bundled
driver), one browser per xdist worker for the session; without a Chromium the tests
skip saying so, unless ``BISECT_HARNESS_REQUIRE_BROWSER=1`` (CI) makes that a failure.
Screenshots of the index and of a run page go to ``BISECT_HARNESS_SCREENSHOTS`` (else
the session's temporary folder) for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from urllib.parse import urldefrag, urlparse
from urllib.request import url2pathname

import pytest
from sqlalchemy import inspect as sa_inspect, select

from bisect_harness.demo import create_demo_repo
from bisect_harness.record.ledger import Boot, Ledger
from bisect_harness.report.cells import fmt
from bisect_harness.report.html import INDEX_PAGE, compare_page, run_page, series_page, write_site
from bisect_harness.report.html.markup import inline
from bisect_harness.report.series import nightly_series
from helpers import write_spec
from mock_boots import Planted, harness_here

DECODE_MS = {"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
             "reduce": "median", "unit": "ms", "better": "lower"}
#: Chromium's flags in a closed network (root needs --no-sandbox; the rest keep it from calling out)
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: the 200-run index must load and answer a click within these seconds on a busy 2-core host
INDEX_LOAD_S = 10.0

# one ledger per module: under `--dist loadgroup` its tests stay on one worker and make it once
pytestmark = pytest.mark.xdist_group("html-report")


def make_ledger(root: Path) -> dict:
    """A ledger of real runs (see the module doc): its URL, the ids of each kind of run,
    and the alerting night."""
    hist = create_demo_repo(root / "engine")
    i_reg = hist.index(hist.events["regression"])
    fast, slow = hist.shas[i_reg - 1], hist.shas[i_reg + 1]
    spec = write_spec(
        root / "decode.yaml", engine={"preset": "demo", "repo": str(hist.path), "metrics": [DECODE_MS]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 1, "warmup_requests": 1},
        defaults={"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 12},
        hypotheses=[{"id": "tuned", "baseline": {"commit": fast}, "treatment": {"commit": slow},
                     "metric": "decode_ms", "expect": "increase", "min_effect": "10%", "bisect": True},
                    {"id": "same", "baseline": {"commit": fast}, "treatment": {"commit": fast, "env": {"X": "1"}},
                     "metric": "decode_ms", "expect": "increase", "min_effect": "10%"}])
    planted = Planted(slow_from=hist.shas[i_reg:])
    db, cache = root / "r.db", root / "cache"
    url = f"sqlite:///{db}"
    common = ["--ledger", url, "--journal-dir", root / "exp", "--no-calibration", "--cache-dir", cache]

    def harness(*args, handler=planted, codes=(0,)):
        proc = harness_here(*args, *common, handler=handler, cwd=root)
        assert proc.returncode in codes, proc.stderr[-4000:]

    harness("run", spec)
    harness("run", spec)
    from curve_boots import drafting_boots, write_drafting_curve

    curve = write_drafting_curve(root / "curve.yaml")
    drafting = drafting_boots()
    harness("run", curve, handler=drafting)
    nights = [hist.shas[i] for i in range(i_reg - 5, i_reg)] + [hist.shas[i] for i in range(i_reg + 1, i_reg + 6)]
    for k, rev in enumerate(nights):
        last = k == len(nights) - 1
        harness("nightly", spec, "--rev", rev, "--metric", "decode_ms", "--min-effect", "0.25",
                *(["--changepoints"] if last else []), codes=(0, 4))
    with Ledger(url) as led:
        runs = sorted(led.runs(limit=1000), key=lambda r: r.id)
        alerts = [r.id for r in runs if r.kind == "nightly" and r.status == "alert"]
        return {"url": url, "root": root,
                "runs": [r.id for r in runs if r.kind == "run" and Path(r.spec_path).name == "decode.yaml"],
                "curve": next(r.id for r in runs if Path(r.spec_path).name == "curve.yaml"),
                "nightly": [r.id for r in runs if r.kind == "nightly"], "alerts": alerts}


def _columns(model) -> list[str]:
    return [a.key for a in sa_inspect(model).column_attrs if a.key != "id"]


def _copy(row, **changes):
    model = type(row)
    return model(**{**{k: getattr(row, k) for k in _columns(model)}, **changes})


def copy_runs(source_url: str, target_url: str, count: int) -> None:
    """Fill ``target_url`` with ``count`` runs, each a copy of a run of ``source_url`` in turn
    (its configs, boots, samples, hypotheses, verdict rows and calibrations; the boot ids
    a verdict used remapped), a day apart from the first."""
    import datetime as dt

    with Ledger(source_url) as src, Ledger(target_url) as dst:
        runs = sorted(src.runs(limit=1000), key=lambda r: r.id)
        start = runs[0].created_at
        for k in range(count):
            run = runs[k % len(runs)]
            when = start + dt.timedelta(hours=6 * k)
            new = _copy(run, created_at=when, finished_at=when + dt.timedelta(minutes=5))
            dst.session.add(new)
            dst.session.flush()
            configs, boots = {}, {}
            for c in run.configs:
                nc = _copy(c, run_id=new.id)
                dst.session.add(nc)
                dst.session.flush()
                configs[c.id] = nc.id
            for b in src.session.scalars(select(Boot).where(Boot.run_id == run.id).order_by(Boot.id)):
                if b.config_id not in configs:
                    continue
                nb = _copy(b, run_id=new.id, config_id=configs[b.config_id])
                dst.session.add(nb)
                dst.session.flush()
                boots[b.id] = nb.id
                dst.session.add_all(_copy(s, boot_id=nb.id) for s in b.samples)
            for h in run.hypotheses:
                nh = _copy(h, run_id=new.id, baseline_config_id=configs[h.baseline_config_id],
                           treatment_config_id=configs[h.treatment_config_id])
                dst.session.add(nh)
                dst.session.flush()
                for v in h.verdicts:
                    dst.session.add(_copy(v, hypothesis_id=nh.id,
                                          baseline_boot_ids=[boots.get(i, i) for i in v.baseline_boot_ids or []],
                                          treatment_boot_ids=[boots.get(i, i) for i in v.treatment_boot_ids or []]))
            dst.session.add_all(_copy(c, run_id=new.id) for c in run.calibrations)
            dst.commit()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> dict:
    return make_ledger(tmp_path_factory.mktemp("html-ledger"))


@pytest.fixture(scope="module")
def site(ledger) -> dict:
    out = ledger["root"] / "report"
    with Ledger(ledger["url"]) as led:
        written = write_site(led, out)
    return {**ledger, "out": out, "pages": written.pages}


# --------------------------------------------------------------------------- the browser


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for this worker's session, stopped at its end."""
    required = os.environ.get("BISECT_HARNESS_REQUIRE_BROWSER") == "1"
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright, why = None, "the playwright package is not installed (`pip install -e '.[test]'`)"
    else:
        why = "no Chromium on PATH (Debian: `apt-get install chromium`)" if path is None else ""
    if why:
        if required:
            pytest.fail(f"BISECT_HARNESS_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    pw = sync_playwright().start()
    try:
        args = CHROMIUM_ARGS + (["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])
        chromium = pw.chromium.launch(executable_path=path, headless=True, args=args)
    except Exception:
        pw.stop()
        raise
    try:
        yield chromium
    finally:
        chromium.close()
        pw.stop()


class Visit:
    """A page opened in the browser, with what it logged: console errors, uncaught
    errors, and every request that was not for a file of the report (refused)."""

    def __init__(self, browser, path: Path):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.fetched: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.context.route("**/*", self._route)
        self.go(path)

    def go(self, path: Path) -> "Visit":
        """Open ``path`` in the same tab, what the last page logged forgotten."""
        self.errors.clear()
        self.fetched.clear()
        self.page.goto(path.resolve().as_uri(), wait_until="load")
        return self

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith("file:") or url.startswith("data:"):
            route.continue_()
        else:
            self.fetched.append(url)
            route.abort()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser):
    opened: list[Visit] = []

    def open_(path: Path) -> Visit:
        opened.append(Visit(browser, path))
        return opened[-1]

    yield open_
    for v in opened:
        v.close()


def _local(url: str) -> tuple[Path, str]:
    base, frag = urldefrag(url)
    return Path(url2pathname(urlparse(base).path)), frag


# --------------------------------------------------------------------------- the tests


def test_every_page_loads_without_a_console_error_and_every_link_resolves(visit, site):
    """A crawl from the index reaches every page written; each loads with no console
    error, fetches nothing outside the folder, and each link names a file that exists
    and, with a fragment, an element of that page."""
    out = site["out"].resolve()
    todo, seen, anchors = [out / INDEX_PAGE], set(), []
    v = visit(out / INDEX_PAGE)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        v.go(path)
        assert v.errors == [], f"{path.relative_to(out)}: {v.errors}"
        assert v.fetched == [], f"{path.relative_to(out)} fetched {v.fetched}"
        for href in v.page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            target, frag = _local(href)
            assert href.startswith("file:") and target.is_file(), f"{path.relative_to(out)}: broken link {href}"
            assert out in target.parents, f"{path.relative_to(out)}: a link out of the report: {href}"
            todo.append(target)
            if frag:
                anchors.append((path, target, frag))
    assert {p.relative_to(out).as_posix() for p in seen} == set(site["pages"])
    for path, target, frag in anchors:
        assert f'id="{frag}"' in target.read_text(encoding="utf-8"), f"{path}: #{frag} is not in {target}"


def test_the_index_lists_every_run_newest_first_with_its_verdicts_counted(visit, site):
    v = visit(site["out"] / INDEX_PAGE)
    rows = v.page.eval_on_selector_all("#runs-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => "
                                       "c.textContent.trim()))")
    with Ledger(site["url"]) as led:
        runs = sorted(led.runs(limit=1000), key=lambda r: r.id, reverse=True)
        assert [int(r[0]) for r in rows] == [r.id for r in runs]
        for row, run in zip(rows, runs):
            outcomes = [h.verdict.outcome if h.verdict else None for h in run.hypotheses]
            assert [int(x) for x in row[5:8]] == [outcomes.count(w) for w in ("confirmed", "refuted", "inconclusive")]
            assert row[3] == run.kind and row[4].startswith(run.status)


def test_the_verdict_table_shows_what_the_ledger_holds(visit, site):
    run_id = site["runs"][0]
    v = visit(site["out"] / run_page(run_id))
    rows = v.page.eval_on_selector_all("#verdicts-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => "
                                       "c.textContent.trim()))")
    with Ledger(site["url"]) as led:
        hyps = led.run(run_id).hypotheses
        assert [r[0] for r in rows] == [h.hid for h in hyps]
        for row, h in zip(rows, hyps):
            vr = h.verdict
            assert row[3] == vr.outcome
            assert row[4] == fmt(vr.ratio, 4)
            assert row[5] == f"[{fmt(vr.ci_low, 4)}, {fmt(vr.ci_high, 4)}]"
        assert "confirmed" in [r[3] for r in rows]  # the planted regression, confirmed as the ledger says


def test_each_plot_draws_a_point_per_figure_the_ledger_holds(visit, site):
    """A hypothesis' plot: a circle per boot of its two configs with values of its
    metric; a curve's: a point per load point with a ratio; a series': a night each."""
    run_id = site["runs"][0]
    v = visit(site["out"] / run_page(run_id))
    with Ledger(site["url"]) as led:
        for k, h in enumerate(led.run(run_id).hypotheses, start=1):
            used = set((h.verdict.baseline_boot_ids or []) + (h.verdict.treatment_boot_ids or []))
            boots = [b for cfg in (h.baseline, h.treatment) for b in cfg.boots
                     if (b.run_id == run_id or b.id in used) and any(h.metric in s.metrics for s in b.samples)]
            drawn = v.page.locator(f"#h-{k} svg.plot circle.boot").count()
            assert drawn == len(boots) > 0
            assert v.page.locator(f"#h-{k} svg.plot circle.boot[fill='none']").count() == sum(
                b.id not in used for b in boots)
        curve_run = led.run(site["curve"])
        points = [h for h in curve_run.hypotheses if h.verdict and h.verdict.ratio is not None]
        cv = visit(site["out"] / run_page(curve_run.id))
        assert cv.page.locator("section.curve svg.plot circle.point").count() == len(points) == 4
        assert cv.errors == []
        night = led.run(site["nightly"][-1])
        series = next(c.series for c in night.configs if c.series)
        nights = nightly_series(led, series, "decode_ms", up_to_run=night.id)
    sv = visit(site["out"] / series_page(series))
    assert sv.page.locator("svg.plot circle.night").count() == len(nights) >= len(site["nightly"])
    assert {n.run_id for n in nights} == set(site["nightly"])
    assert sv.page.locator("svg.plot circle.night[fill='#d62728']").count() == sum(
        n.status == "alert" for n in nights) > 0


def test_the_series_page_links_each_alert_to_its_bisection_and_shows_the_stored_change_points(visit, site):
    with Ledger(site["url"]) as led:
        last = led.run(site["nightly"][-1])
        series = next(c.series for c in last.configs if c.series)
        stored = last.summary["changepoints"]["points"]
    v = visit(site["out"] / series_page(series))
    links = v.page.eval_on_selector_all("a.bisection-link", "els => els.map(e => e.href)")
    assert len(links) >= len(site["alerts"]) > 0
    for href in links:
        target, frag = _local(href)
        assert target.name == f"{site['alerts'][0]}.html" or target.stem in map(str, site["alerts"])
        page = visit(target)
        assert page.page.locator(f"#{frag} h2").inner_text().startswith("Bisection")
    assert v.page.locator("#changepoints-table tbody tr").count() == len(stored) > 0
    assert v.page.locator("svg.plot line.change-point").count() == len(stored)
    with Ledger(site["url"]) as led:
        nights = nightly_series(led, series, "decode_ms", up_to_run=last.id)
    runs = v.page.eval_on_selector_all("#nights-table tbody tr", "rs => rs.map(r => +r.dataset.run)")
    assert runs == [n.run_id for n in nights] and set(runs) == set(site["nightly"])


def test_the_compare_page_says_what_harness_compare_decides(visit, site):
    from bisect_harness.report.compare import compare_runs

    a, b = site["runs"]
    v = visit(site["out"] / compare_page(a, b))
    shown = v.page.eval_on_selector_all("table.compare tbody tr", "rs => rs.map(r => [r.cells[0].textContent.trim(), "
                                        "r.cells[7].textContent.trim()])")
    with Ledger(site["url"]) as led:
        decided = compare_runs(led, a, b, metric="decode_ms")
    assert shown == [[r.label, r.verdict.outcome.value] for r in decided]


def test_a_click_on_a_column_head_sorts_the_table(visit, site):
    v = visit(site["out"] / INDEX_PAGE)
    ids = "() => [...document.querySelectorAll('#runs-table tbody tr')].map(r => +r.dataset.run)"
    newest_first = v.page.evaluate(ids)
    assert newest_first == sorted(newest_first, reverse=True)
    v.page.click("#runs-table thead th:nth-child(1)")
    assert v.page.evaluate(ids) == sorted(newest_first)
    v.page.click("#runs-table thead th:nth-child(1)")
    assert v.page.evaluate(ids) == newest_first
    run = visit(site["out"] / run_page(site["runs"][0]))
    ratios = "() => [...document.querySelectorAll('#verdicts-table tbody tr')].map(r => +r.cells[4].dataset.sort)"
    run.page.click("#verdicts-table thead th:nth-child(5)")
    assert run.page.evaluate(ratios) == sorted(run.page.evaluate(ratios))
    run.page.click("#verdicts-table thead th:nth-child(5)")
    got = run.page.evaluate(ratios)
    assert got == sorted(got, reverse=True) and len(set(got)) > 1


def test_the_index_stays_usable_with_200_runs_and_screenshots_are_taken(visit, site, tmp_path, tmp_path_factory):
    """200 runs: the index lists them all, loads and sorts within :data:`INDEX_LOAD_S`,
    its filter keeps only the rows that hold the words typed; screenshots of the index and
    of a run page are written for a person to look at."""
    url = f"sqlite:///{tmp_path / 'many.db'}"
    copy_runs(site["url"], url, 200)
    out = tmp_path / "report"
    with Ledger(url) as led:
        written = write_site(led, out)
        nightly = sum(r.kind == "nightly" for r in led.runs(limit=1000))
    started = time.monotonic()
    v = visit(out / INDEX_PAGE)
    rows = "#runs-table tbody tr"
    assert v.page.locator(rows).count() == 200
    loaded_s = time.monotonic() - started
    shots = Path(os.environ.get("BISECT_HARNESS_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    v.page.screenshot(path=str(shots / "report-index.png"))  # as it opens: newest first
    clicked = time.monotonic()
    v.page.click("#runs-table thead th:nth-child(1)")
    assert v.page.evaluate("() => +document.querySelector('#runs-table tbody tr').dataset.run") == 1
    assert loaded_s + (time.monotonic() - clicked) < INDEX_LOAD_S
    assert v.errors == [] and v.fetched == []
    v.page.fill("#filter", "nightly")
    assert v.page.locator(f"{rows}:not([hidden])").count() == nightly > 0
    assert v.page.inner_text("#shown") == str(nightly)
    v.page.fill("#filter", "")
    assert v.page.locator(f"{rows}:not([hidden])").count() == 200
    assert (out / INDEX_PAGE).stat().st_size < 512 * 1024 and len(written.pages) > 200
    run = visit(site["out"] / run_page(site["runs"][0]))
    run.page.screenshot(path=str(shots / "report-run.png"), full_page=True)
    for name in ("report-index.png", "report-run.png"):
        assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshots: {shots / 'report-index.png'} {shots / 'report-run.png'}")


# --------------------------------------------------------------------------- without a browser


def test_harness_report_writes_the_asked_comparison_and_refuses_an_unknown_run(site, tmp_path):
    from mock_boots import harness_in_process

    a, b = site["runs"]
    nightly = site["nightly"][0]
    done = harness_in_process("report", "--ledger", site["url"], "--out", tmp_path / "r", "--compare", nightly, b,
                              cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / compare_page(nightly, b)).is_file() and "largest" in done.stdout
    assert (tmp_path / "r" / compare_page(a, b)).is_file()  # the run before it of the same file
    refused = harness_in_process("report", "--ledger", site["url"], "--out", tmp_path / "s", "--compare", a, 9999,
                                 cwd=tmp_path)
    assert refused.returncode == 2 and "run 9999 is not in the ledger" in refused.stderr


def test_a_journal_sentence_becomes_html_without_its_markup_leaking():
    assert str(inline("**confirmed** `a<b>` x \\| y")) == "<strong>confirmed</strong> <code>a&lt;b&gt;</code> x | y"
    assert str(inline("<script>alert(1)</script>")) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert str(inline("`**not bold**` and **bold `code` here**")) == (
        "<code>**not bold**</code> and <strong>bold <code>code</code> here</strong>")
