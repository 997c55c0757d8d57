"""The journal's "Configs and boots" section: each config's recipe, and each boot's
checks and evidence in words.

A config is printed as it was asked for (commit, launch template, env) and as it ran
(its first boot's command, the interpreter and the code its boots reported); a boot
as one row of its config's table (did the env reach every worker process, did the
flags take effect, did the mechanisms engage in the measured window, its marks) and
the details folded under it, each a sentence from the boot's stored evidence
(``BootEvidence``, typed) or its checks: why it failed, what its sources and checks
said, the host's figures while it ran, how it stopped, the command it ran as.
"""

from __future__ import annotations

from dataclasses import dataclass

from bisect_harness.evidence import BootEvidence
from bisect_harness.measure.prompt_size import reuse_text
from bisect_harness.observe import engine_identity, host_state, mechanisms
from bisect_harness.observe.provenance import EnvReport, FlagReport
from bisect_harness.record.ledger import Boot
from bisect_harness.report import reproduce
from bisect_harness.report.cells import fmt as _fmt, md as _md

__all__ = ["BootLine", "ConfigSection", "config_section", "env_cell", "flag_cell", "mechanism_cell",
           "requests_text"]


@dataclass(frozen=True)
class BootLine:
    """One boot of a config in its table, and the details folded under it."""

    id: int
    status: str
    ready: str
    samples: int
    env: str
    flags: str
    mechanisms: str
    marks: str
    details: tuple[str, ...]
    log_tail: str


@dataclass(frozen=True)
class ConfigSection:
    """One config as the page prints it: its recipe, how its first boot ran, the
    interpreter and the code its boots reported, its status, and its boots."""

    id: int
    label: str
    commit: str
    argv: str
    ran_as: str
    env: str
    reported: str
    python: str
    status: str
    failure: str | None
    log_tail: str
    boots: tuple[BootLine, ...]


def config_section(c) -> ConfigSection:
    """Config row ``c`` and its boots, as the page prints them."""
    return ConfigSection(
        id=c.id, label=c.label, commit=c.commit or "(installed server)", argv=" ".join(c.argv or []),
        ran_as=(f"boot {c.boots[0].id}: `{reproduce.boot_command(c.boots[0])}`" if c.boots
                else "not recorded (no boot started)"),
        env=" ".join(f"{k}={v}" for k, v in (c.env or {}).items()),
        reported=_md(engine_identity.describe(c.boots)), python=_md(_environment_text(c.boots)),
        status=c.status if c.status != "pending" else "measured", failure=c.failure,
        log_tail=(c.log_tail or "").strip(), boots=tuple(_boot_line(b) for b in c.boots))


def _boot_line(b: Boot) -> BootLine:
    ev = b.evidence
    return BootLine(
        id=b.id, status=b.status, ready=_fmt(b.ready_s, 1), samples=len(b.samples),
        env=env_cell(b.env_report), flags=flag_cell(b.flag_report), mechanisms=mechanism_cell(ev.mechanisms),
        marks=", ".join(b.marks or []) or "-", details=tuple(_boot_details(b, ev)),
        log_tail=(b.log_tail or "").strip() if b.status != "ok" else "")


def _boot_details(b: Boot, ev: BootEvidence) -> list[str]:
    """The lines folded under a boot: why it failed, what its checks and evidence say
    (``ev``: its stored provenance, typed), and the command it ran as."""
    details = [f"- failure: {b.failure}"] if b.failure else []
    details += [f"- metric source: {p}" for p in b.source_problems or []]
    if ev.flag_not_accepted:  # the commit's parser refused the argv: not a crash
        refused = ev.flag_not_accepted
        details.append(f"- flag not accepted at this commit: `{refused['engine_message']}`"
                       + "".join(f" ({n})" for n in refused.get("notes") or []))
    if ev.sources_not_applicable:
        details.append("- metric sources whose `when` excludes this config (not collected): "
                       + ", ".join(ev.sources_not_applicable))
    if b.env_report and not b.env_report.get("ok", True):
        described = EnvReport.from_dict(b.env_report).describe()
        details += [f"- env: `{line.strip()}`" for line in described.splitlines()[1:]]
    if ev.mechanisms:  # what the flags claim to engage, by the engine's own evidence
        details.append("- mechanisms: " + _md(mechanisms.summary(ev.mechanisms)))
    if ev.prompt:  # tokens where the server counted them, else words, said as such
        details.append("- " + _md(_prompt_text(ev.prompt)))
    if ev.gpu_sampling:
        details.append(f"- sampled during the benchmark: {_sampling_text(ev.gpu_sampling)}")
    busy = host_state.boot_line(b)
    if busy:
        details.append(f"- contention during the benchmark: {_md(busy)}")
    stop = ev.stop or {}
    if not stop.get("clean", True):  # how the server ended at the harness's stop
        details.append(f"- stop: {_md(stop.get('note', ''))}")
    details += [f"- {_md(line)}" for line in _boot_facts(ev)]
    details += [f"- before the boot: {_md(note)}" for note in (ev.checkout or {}).get("remade") or []]
    if ev.checkout_changed:  # marked checkout_changed: never counted as the commit
        details.append(f"- the checkout changed while the boot ran: {_md('; '.join(ev.checkout_changed))}")
    failed = requests_text(ev.request_retries)
    if failed:  # requests that produced nothing: sent again, or failed in the end
        details.append(f"- requests: {_md(failed)}")
    details.append(f"- ran as: `{reproduce.boot_command(b)}`")
    return details


def env_cell(report: dict | None) -> str:
    """Did every requested env var reach every process of the server's tree?"""
    if not report:
        return "n/a"
    rep = EnvReport.from_dict(report)
    n = len(rep.processes)
    if not rep.vars:
        return f"(no env requested; {n} processes)"
    if rep.state == "ok":
        return f"yes ({len(rep.vars)} vars in all {len(rep.readable_pids)} processes)"
    if rep.state == "unverified":
        seen = f"; present in all {len(rep.readable_pids)} readable" if rep.readable_pids else ""
        return "**unverified**: " + _md(rep.unverified_text() + seen)
    bad = []
    for v in rep.vars:
        if not v.ok:
            where = [rep.process(pid).name for pid in (*v.absent, *v.mismatched)]
            bad.append(f"{v.name} missing in {len(where)} of {n} processes")
    return "**NO**: " + _md("; ".join(bad) or rep.note or "no process could be read")


def flag_cell(report: dict | None) -> str:
    """Did each requested flag show up in the server's effective arguments? ``yes``
    only when every flag was compared; a flag the server did not report says so."""
    if not report:
        return "n/a"
    rep = FlagReport.from_dict(report)
    if not rep.checks:
        return "- (no flags)"
    if rep.mismatched:
        return "**NO**: " + _md("; ".join(f"{c.flag}: asked {c.requested!r}, server has {c.effective!r}"
                                          for c in rep.mismatched))
    if not rep.not_reported:
        return f"yes ({len(rep.matched)} compared, all matched)"
    matched = f"{len(rep.matched)} matched; " if rep.matched else ""
    return _md(matched) + "**not reported**: " + _md(", ".join(c.flag for c in rep.not_reported))


def mechanism_cell(results) -> str:
    """Did what the boot's flags claim (or its engine runs by default) run in the
    measured window? The state in words (``mechanisms.WORDS``); ``-`` when nothing
    was checked. A record older than the window check (``unknown``) reads not observable."""
    if not results:
        return "-"
    loud = ("not_engaged", "set_up_not_seen")
    return _md(", ".join(f"{r['name']}: " + (f"**{mechanisms.WORDS[r['state']]}**" if r["state"] in loud
                                             else mechanisms.WORDS.get(r["state"], mechanisms.WORDS["not_observable"]))
                         for r in results))


def requests_text(seen: dict | None) -> str | None:
    """The boot's failed requests (``BootEvidence.request_retries``) in words, or None."""
    if not seen:
        return None
    parts = []
    if seen.get("retries"):
        parts.append(f"{seen['retries']} tries of {seen['requests']} requests produced nothing and were sent "
                     f"again within their sample (first: {seen.get('example')})")
    if seen.get("failed"):
        parts.append(f"{seen['failed']} requests failed after their retries (first: {seen.get('failed_example')})")
    per = seen.get("samples") or {}
    if per:
        parts.append("by sample: " + ", ".join(f"{k}: {v.get('retries', 0)} sent again, {v.get('failed', 0)} failed"
                                               for k, v in sorted(per.items(), key=lambda kv: int(kv[0]))))
    return "; ".join(parts) or None


def _sampling_text(d: dict) -> str:
    """One line per boot: CPU load and, per GPU, clocks, temperature, power, throttling."""
    def rng(stat: dict | None, unit: str) -> str:
        if not stat:
            return "n/a"
        lo, hi = stat.get("min"), stat.get("max")
        return f"{lo:.0f}-{hi:.0f}{unit}" if lo is not None and hi is not None else "n/a"

    cpu = d.get("cpu", {})
    parts = [f"{d.get('n_samples', 0)} samples over {d.get('duration_s', 0):.1f}s",
             f"CPU busy {rng(cpu.get('cpu_percent'), '%')}", f"load1 {rng(cpu.get('load1'), '')}"]
    for g in d.get("gpus", []):
        st = g.get("stats", {})
        throttle = ", ".join(g.get("throttle_reasons_seen", [])) or "none"
        parts.append(f"GPU{g.get('index')}: SM {rng(st.get('sm_clock_mhz'), ' MHz')} "
                     f"(max {g.get('sm_clock_max_mhz')}), {rng(st.get('temperature_c'), ' C')}, "
                     f"{rng(st.get('power_w'), ' W')}, throttle: {throttle}")
    if d.get("note"):
        parts.append(d["note"])
    return _md("; ".join(parts))


def _environment_text(boots) -> str:
    """The interpreter(s) a config's boots ran with, and whether each was the commit's own."""
    seen = []
    for b in boots:
        env = b.evidence.environment
        if env:
            rel = env.get("release")
            if rel and rel.get("image"):  # an image through a runtime: which, by its digest
                text = (f"{rel.get('package')} {rel.get('version')} as the image `{rel.get('image')}` through "
                        f"{rel.get('runtime')}, digest {rel.get('digest') or 'not known before it ran'}")
            elif rel:  # a released build: which file, by its hash, and the version installed
                text = (f"`{env['python']}` (the release's own venv over `{env['base_python']}`: "
                        f"{rel.get('package')} {rel.get('version')} installed from `{rel.get('file')}`, "
                        f"sha256 {str(rel.get('sha256'))[:16]}…)")
            elif env["mode"] == "venv":
                text = f"`{env['python']}` (the commit's own venv over `{env['base_python']}`)"
            else:
                text = f"`{env['python']}` (shared by every commit)"
            if text not in seen:
                seen.append(text)
    return "; ".join(seen)


def _prompt_text(prompt: dict) -> str:
    """A boot's prompt length (``prompt_size.PromptSize``), in the unit it really is in, and
    whether each sample's prompts were its own (a boot recorded before they were says nothing)."""
    if prompt.get("unit") == "tokens":
        text = (f"prompts: {prompt.get('tokens')} tokens ({prompt.get('words')} words; {prompt.get('asked')} asked), "
                f"counted by the server's {prompt.get('via')}")
    else:
        text = (f"prompts: {prompt.get('words')} words ({prompt.get('asked')} prompt_tokens asked): the server has no "
                "tokenizer endpoint, so the count is in words, not tokens")
    if "unique" not in prompt:
        return text
    return f"{text}; {reuse_text(bool(prompt['unique']), prompt.get('spread'))}"


def _boot_facts(ev: BootEvidence) -> list[str]:
    """Facts of a boot that are not marks, and what a mark left missing, as sentences
    from its evidence: a log that could not be written, a server's steady off-by-one
    between its text chunks and its token count, the collective libraries' own sockets
    beyond loopback."""
    out = []
    log = ev.log or {}
    if log.get("unwritten"):
        out.append(f"log not written: {log['unwritten']}; the ledger's log_tail holds the newest output, "
                   "kept in memory")
    offset = ev.usage_offset
    if offset:
        out.append(f"token count: {offset['note']}")
    listening = ev.listening or {}
    if listening.get("collective"):
        out.append("listening beyond loopback for the server's own processes (collective-communication "
                   "bootstrap, not a server port): " + ", ".join(listening["collective"]))
    return out
