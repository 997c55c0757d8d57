"""The report's plots as inline SVG: a few shapes drawn from ledger figures, no library.

A page of the report opens offline and whole, so its plots are SVG elements in the
page itself, drawn here from the same figures the markdown journal's PNGs are
drawn from (``report.plots``' points): a hypothesis' boots by side, a load curve's
ratios with their intervals, a nightly series' nights. Each drawn figure is one
element with a class that names it (``boot``, ``point``, ``night``), so a reader,
or a test, counts what the plot shows; each carries a ``<title>`` that says its
figures when the pointer rests on it.

The axes are linear, with "nice" ticks (1, 2 or 5 times a power of ten), or
logarithmic where the curve's axis asks for it (``curve_view.axis_of``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Sequence

from bisect_harness.report.cells import fmt

__all__ = ["SIDE_COLOURS", "OUTCOME_COLOURS", "NightMark", "boots_plot", "curve_plot", "series_plot"]

#: the two arms' colours, as the journal's PNGs draw them (matplotlib's tab:blue and tab:orange)
SIDE_COLOURS = {"baseline": "#1f77b4", "treatment": "#ff7f0e"}
#: a verdict's colour in a curve's plot
OUTCOME_COLOURS = {"confirmed": "#2ca02c", "refuted": "#d62728", "inconclusive": "#7f7f7f"}

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 46, 44


def _nice_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Ticks at 1, 2 or 5 times a power of ten covering [low, high], at most ``most`` of them."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        high = low + (abs(low) * 0.1 or 1.0)
    raw = (high - low) / max(most - 1, 1)
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.floor(low / step) * step
    ticks, t = [], first
    while t <= high + step * 1e-9:
        if t >= low - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


@dataclass(frozen=True)
class _Axis:
    """A mapping from figures to pixels along one direction (log10 where ``log``)."""

    low: float
    high: float
    start: float
    end: float
    log: bool = False

    def __call__(self, x: float) -> float:
        f = (lambda v: math.log10(v)) if self.log else (lambda v: v)
        lo, hi = f(self.low), f(self.high)
        span = hi - lo or 1.0
        return self.start + (f(x) - lo) / span * (self.end - self.start)


def _padded(values: Sequence[float], share: float = 0.08) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * share or abs(hi) * share or 1.0
    return lo - pad, hi + pad


def _frame(title: str, y_label: str, x_label: str, y: _Axis, ticks: Sequence[float], label: str) -> list[str]:
    """The plot's box, its title, the y axis with ``ticks`` and both axes' labels."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" role="img" aria-label="{escape(label)}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">',
           f"<title>{escape(label)}</title>",
           f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
           'fill="#fff" stroke="#888"/>',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" class="plot-title">{escape(title)}</text>']
    for t in ticks:
        py = y(t)
        out.append(f'<line x1="{LEFT - 4}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" class="tick">{t:g}</text>')
    out.append(f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" class="axis-label" '
               f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(y_label)}</text>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" text-anchor="middle" '
               f'class="axis-label">{escape(x_label)}</text>')
    return out


def _x_ticks(x: _Axis, ticks: Sequence[tuple[float, str]]) -> list[str]:
    base = HEIGHT - BOTTOM
    return [f'<text x="{x(v):.1f}" y="{base + 16}" text-anchor="middle" class="tick">{escape(text)}</text>'
            for v, text in ticks]


def _hline(y: float, colour: str, dash: str = "", label: str = "") -> str:
    title = f"<title>{escape(label)}</title>" if label else ""
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}"{dashes}>'
            f"{title}</line>")


def boots_plot(points, *, title: str, metric: str, unit: str) -> str:
    """A hypothesis' boots (``report.plots.BootPoint`` each): one ``circle.boot`` per boot at
    its round (its seq in its config) and its mean of the metric, coloured by side,
    hollow where the verdict did not use it, ringed in red where the boot carries a
    mark; a dashed line per side at the mean of the boot means the verdict used.
    "" without a point."""
    points = [p for p in points if p.values]
    if not points:
        return ""
    means = [sum(p.values) / len(p.values) for p in points]
    y = _Axis(*_padded(means), HEIGHT - BOTTOM, TOP)
    rounds = [p.round for p in points]
    x = _Axis(min(rounds) - 0.6, max(rounds) + 0.6, LEFT, WIDTH - RIGHT)
    y_label = f"{metric} ({unit})" if unit else metric
    out = _frame(title, y_label, "round (each boot's place among its config's boots)", y,
                 _nice_ticks(y.low, y.high), f"{title}: {len(points)} boots")
    out += _x_ticks(x, [(r, str(r)) for r in sorted(set(rounds))])
    for side, colour in SIDE_COLOURS.items():
        used = [m for p, m in zip(points, means) if p.side == side and p.used]
        if used:
            avg = sum(used) / len(used)
            out.append(_hline(y(avg), colour, "6 4", f"{side}: mean of {len(used)} boot means used, {fmt(avg, 2)}"))
    offset = {"baseline": -0.12, "treatment": 0.12}
    for p, m in zip(points, means):
        colour = SIDE_COLOURS.get(p.side, "#444")
        fill = colour if p.used else "none"
        ring = ' stroke="#d62728" stroke-width="2.5"' if p.marked else f' stroke="{colour}" stroke-width="1.5"'
        why = ("" if p.used else ", not used by the verdict") + (", marked" if p.marked else "")
        out.append(f'<circle class="boot" data-side="{p.side}" data-boot="{p.boot_id}" '
                   f'cx="{x(p.round + offset.get(p.side, 0)):.1f}" cy="{y(m):.1f}" r="5" fill="{fill}"{ring}>'
                   f"<title>{escape(p.side)} boot {p.boot_id} (round {p.round}): mean {fmt(m, 2)} over "
                   f"{len(p.values)} samples{why}</title></circle>")
    out.append(_legend([(side, colour) for side, colour in SIDE_COLOURS.items()]))
    out.append("</svg>")
    return "\n".join(out)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    """A row of coloured dots and their words above the plot's box, clear of its points."""
    parts, at = [], LEFT + 8
    for text, colour in items:
        parts.append(f'<circle cx="{at}" cy="{TOP - 12}" r="5" fill="{colour}"/>'
                     f'<text x="{at + 9}" y="{TOP - 8}" class="legend">{escape(text)}</text>')
        at += 16 + 8 * len(text)
    return '<g class="legend">' + "".join(parts) + "</g>"


def curve_plot(points, *, title: str, axis: str | None, xs: Sequence[float | None], log: bool,
               threshold: float | None) -> str:
    """A load curve (``curve_view.CurvePoint`` each): one ``circle.point`` per point at its
    treatment / baseline ratio, with its interval as a bar, coloured by its verdict;
    a line at 1 (no change) and a dashed one at the claimed size (``threshold``).
    The points sit at their axis values (``xs``; log10 where ``log``) or, without a
    numeric axis, in order. "" where no point has a ratio."""
    shown = [(p, x) for p, x in zip(points, xs) if p.ratio is not None]
    if not shown:
        return ""
    figures = [1.0] + [v for p, _ in shown for v in (p.ratio, *(p.ci or ()))]
    if threshold is not None:
        figures.append(threshold)
    y = _Axis(*_padded(figures), HEIGHT - BOTTOM, TOP)
    if axis is not None:
        at = [float(x) for _, x in shown]
        lo, hi = (min(at) / 1.5, max(at) * 1.5) if log else _padded(at, 0.1)
        x = _Axis(lo, hi, LEFT, WIDTH - RIGHT, log=log)
        place = at
    else:
        x = _Axis(-0.5, len(shown) - 0.5, LEFT, WIDTH - RIGHT)
        place = list(range(len(shown)))
    out = _frame(title, "treatment / baseline", axis or "load point", y, _nice_ticks(y.low, y.high),
                 f"{title}: {len(shown)} points")
    out += _x_ticks(x, [(at, f"{px:g}" if axis is not None else p.label) for (p, px), at in zip(shown, place)])
    out.append(_hline(y(1.0), "#444", "", "no change (1.0x)"))
    if threshold is not None:
        out.append(_hline(y(threshold), "#9467bd", "6 4", f"the claimed size ({threshold:g}x)"))
    for (p, _), at in zip(shown, place):
        colour = OUTCOME_COLOURS.get(p.outcome, "#444")
        cx = x(at)
        if p.ci is not None:
            out.append(f'<line class="interval" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(p.ci[0]):.1f}" '
                       f'y2="{y(p.ci[1]):.1f}" stroke="{colour}" stroke-width="2"/>')
        ci = f" [{fmt(p.ci[0], 4)}, {fmt(p.ci[1], 4)}]" if p.ci is not None else ""
        out.append(f'<circle class="point" data-point="{escape(p.label)}" cx="{cx:.1f}" cy="{y(p.ratio):.1f}" '
                   f'r="5" fill="{colour}"><title>{escape(p.label)}: {fmt(p.ratio, 4)}x{ci}, '
                   f"{escape(p.outcome)}</title></circle>")
    out.append(_legend(list(OUTCOME_COLOURS.items())))
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class NightMark:
    """One night of a series as its plot draws it: its run and commit, its value, the
    range of its boots' means, and whether it alerted."""

    run_id: int
    commit: str
    value: float
    low: float
    high: float
    alert: bool
    label: str


def series_plot(nights: Sequence[NightMark], change_at: Sequence[tuple[int, str]], *, title: str,
                metric: str) -> str:
    """A nightly series: one ``circle.night`` per night at its value, a bar over the range
    of its boots' means, red where it alerted; a dashed ``line.change-point`` before
    each night a stored change point starts at (``change_at``: its run and commit, as
    the night's row names them). "" without a night."""
    if not nights:
        return ""
    y = _Axis(*_padded([v for n in nights for v in (n.value, n.low, n.high)]), HEIGHT - BOTTOM, TOP)
    x = _Axis(-0.5, len(nights) - 0.5, LEFT, WIDTH - RIGHT)
    out = _frame(title, metric, "night (oldest first; the run's id below)", y, _nice_ticks(y.low, y.high),
                 f"{title}: {len(nights)} nights")
    every = max(1, math.ceil(len(nights) / 12))
    out += _x_ticks(x, [(i, str(n.run_id)) for i, n in enumerate(nights) if i % every == 0])
    for i, n in enumerate(nights):
        if (n.run_id, n.commit) in change_at:
            cx = x(i - 0.5)
            out.append(f'<line class="change-point" x1="{cx:.1f}" x2="{cx:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" '
                       f'stroke="#9467bd" stroke-width="2" stroke-dasharray="6 4"><title>change point from night run '
                       f"{n.run_id}</title></line>")
    for i, n in enumerate(nights):
        colour = "#d62728" if n.alert else SIDE_COLOURS["baseline"]
        cx = x(i)
        out.append(f'<line class="range" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(n.low):.1f}" y2="{y(n.high):.1f}" '
                   f'stroke="{colour}" stroke-width="2"/>'
                   f'<circle class="night" data-run="{n.run_id}" cx="{cx:.1f}" cy="{y(n.value):.1f}" r="4.5" '
                   f'fill="{colour}"><title>{escape(n.label)}</title></circle>')
    out.append("</svg>")
    return "\n".join(out)
