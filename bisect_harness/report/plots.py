"""The journal's plots: PNG files drawn with matplotlib (Agg, no display needed).

Each plot is drawn from ledger rows alone, on a white background, with axis
labels and the metric's unit, so a journal folder can be committed and read on
any markdown viewer.

A plot is written whole or not at all (:func:`save_figure`): drawn into a
temporary file beside its place and renamed onto it, the temporary file removed
when the write fails (a full disk), so no empty or cut PNG is left in the
folder; the failure is raised as :class:`PlotNotWritten` for the journal to say.
"""

from __future__ import annotations

import errno
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["BootPoint", "CurvePlotPoint", "PlotNotWritten", "plot_bisection", "plot_curve", "plot_hypothesis",
           "save_figure"]


class PlotNotWritten(OSError):
    """A plot could not be written (its folder's disk full, say); nothing was left at its path."""

    def __str__(self) -> str:
        name = errno.errorcode.get(self.errno or 0, "")
        return f"{self.filename} not written ({name + ': ' if name else ''}{self.strerror})"


def save_figure(fig: Any, path: Path, **savefig: Any) -> Path:
    """Write matplotlib figure ``fig`` to ``path`` whole or not at all: into a temporary
    file in the same folder, then renamed onto ``path``. Raises :class:`PlotNotWritten`
    (the temporary file removed, an older file at ``path`` left as it was) when the
    folder cannot take it. The figure is closed either way."""
    plt = _pyplot()
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's mode, as open() gives
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", **savefig)
        os.replace(tmp, path)
        tmp = None
        return path
    except OSError as exc:
        raise PlotNotWritten(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        plt.close(fig)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass

SIDE_STYLE = {"baseline": ("tab:blue", "o"), "treatment": ("tab:orange", "s")}


@dataclass(frozen=True)
class BootPoint:
    """One boot of one side, as the plot needs it."""

    side: str          # baseline | treatment
    boot_id: int
    round: int         # the boot's seq within its config: round r holds the r-th boot of each side
    values: tuple[float, ...]
    marked: bool       # the boot carries a mark (host_busy, env_missing, ...)
    used: bool         # the verdict used it


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_hypothesis(points: Sequence[BootPoint], path: Path, *, title: str, metric: str, unit: str) -> Path | None:
    """Two panels: boot means per side in boot order (rounds shaded, marked boots hollow,
    unused boots grey) and every sample's value per side. None when no boot has a value;
    :class:`PlotNotWritten` when it could not be written (nothing left at ``path``)."""
    points = sorted((p for p in points if p.values), key=lambda p: p.boot_id)
    if not points:
        return None
    plt = _pyplot()
    ylabel = f"{metric} ({unit})" if unit else metric
    fig, (ax, dist) = plt.subplots(1, 2, figsize=(9.5, 3.8), dpi=110, gridspec_kw={"width_ratios": [2.2, 1]},
                                   facecolor="white")
    xs = list(range(1, len(points) + 1))
    # rounds: a shaded band over the boots of each round, labelled at the top
    rounds: dict[int, list[int]] = {}
    for x, p in zip(xs, points):
        rounds.setdefault(p.round, []).append(x)
    for i, (r, members) in enumerate(sorted(rounds.items())):
        if i % 2 == 0:
            ax.axvspan(min(members) - 0.45, max(members) + 0.45, color="0.92", zorder=0)
        ax.text((min(members) + max(members)) / 2, 1.01, f"round {r}", transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=7, color="0.35")
    for side, (color, marker) in SIDE_STYLE.items():
        mine = [(x, p) for x, p in zip(xs, points) if p.side == side]
        if not mine:
            continue
        for kind, pick, face, edge in (("", lambda p: p.used and not p.marked, color, color),
                                       (" (marked)", lambda p: p.used and p.marked, "white", color),
                                       (" (not used)", lambda p: not p.used, "white", "0.55")):
            sel = [(x, sum(p.values) / len(p.values)) for x, p in mine if pick(p)]
            if sel:
                ax.scatter([x for x, _ in sel], [y for _, y in sel], marker=marker, s=46, facecolors=face,
                           edgecolors=edge, linewidths=1.6, label=side + kind, zorder=3)
        used = [sum(p.values) / len(p.values) for _, p in mine if p.used]
        if used:
            ax.axhline(sum(used) / len(used), color=color, linestyle="--", linewidth=1, zorder=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(p.boot_id) for p in points], fontsize=7, rotation=90 if len(xs) > 24 else 0)
    ax.set_xlabel("boot id, in boot order (dashed: mean of the boots used)")
    ax.set_ylabel(f"boot mean {ylabel}")
    ax.set_title(title, fontsize=10, pad=14)
    ax.legend(loc="best", fontsize=7, framealpha=0.9)
    ax.grid(axis="y", color="0.85", linewidth=0.6)
    # the samples' distribution per side: a box over every used sample, every sample as a dot
    sides = [s for s in SIDE_STYLE if any(p.side == s for p in points)]
    for i, side in enumerate(sides, start=1):
        color, marker = SIDE_STYLE[side]
        vals = [v for p in points if p.side == side and p.used for v in p.values]
        if vals:
            dist.boxplot([vals], positions=[i], widths=0.5, showfliers=False,
                         medianprops={"color": "black"}, boxprops={"color": color}, whiskerprops={"color": color},
                         capprops={"color": color})
            n = len(vals)
            offsets = [(-0.18 + 0.36 * k / (n - 1)) if n > 1 else 0.0 for k in range(n)]
            dist.scatter([i + o for o in offsets], vals, s=12, color=color, marker=marker, alpha=0.7, zorder=3)
    dist.set_xticks(range(1, len(sides) + 1))
    dist.set_xticklabels(sides)
    dist.set_xlim(0.4, len(sides) + 0.6)
    dist.set_ylabel(f"sample {ylabel}")
    dist.set_title("samples of the boots used", fontsize=10, pad=14)
    dist.grid(axis="y", color="0.85", linewidth=0.6)
    fig.tight_layout()
    return save_figure(fig, path, facecolor="white")


def plot_bisection(bis, plots_dir: Path, stem: str) -> str | None:
    """A bisection's boot means against commit order (its ``bisect_probes`` rows), the
    culprit marked; reused boots hollow. The file's name, or None with nothing to draw."""
    plt = _pyplot()
    order = {c: i for i, c in enumerate(bis.commits or [])}
    points = {True: ([], []), False: ([], [])}  # reused from earlier runs or not: (xs, ys)
    for p in bis.probes:
        for v in p.values or []:
            if p.commit in order:
                xs, ys = points[bool(p.reused)]
                xs.append(order[p.commit])
                ys.append(float(v))
    if not points[True][0] and not points[False][0]:
        return None
    plots_dir.mkdir(parents=True, exist_ok=True)
    path = plots_dir / f"{stem}-bisection-{bis.id}.png"
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110, facecolor="white")
    if points[False][0]:
        ax.plot(*points[False], "o", alpha=0.7, label="boot mean (this search)")
    if points[True][0]:
        ax.plot(*points[True], "o", mfc="none", color="tab:gray", alpha=0.8, label="boot mean (earlier runs)")
    culprit = (bis.result or {}).get("culprit")
    if culprit in order:
        ax.axvline(order[culprit] - 0.5, color="tab:red", linestyle="--", label=f"culprit {culprit[:8]}")
    ax.set_xlabel("commit (order from good to bad)")
    ax.set_ylabel(f"boot mean {bis.metric}")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path).name


@dataclass(frozen=True)
class CurvePlotPoint:
    """One load point of a curve, as its plot needs it: its tick (the axis' value, or the
    whole label where the points are placed in their order), where it sits on the swept
    axis (``x``; None: placed in order), each arm's boot means at the point (the boots its
    verdict used), and the verdict's ratio, interval and outcome."""

    tick: str
    x: float | None
    baseline: tuple[float, ...]
    treatment: tuple[float, ...]
    ratio: float | None
    ci: tuple[float, float] | None
    outcome: str


#: How a point's verdict is drawn on the ratio panel: (face colour, edge colour, marker).
VERDICT_STYLE = {"confirmed": ("tab:green", "tab:green", "o"), "refuted": ("tab:red", "tab:red", "X"),
                 "inconclusive": ("white", "0.4", "o")}


def plot_curve(points: Sequence[CurvePlotPoint], path: Path, *, title: str, metric: str, unit: str,
               axis: str | None, log: bool, threshold: float | None) -> Path | None:
    """A curve's two panels over its swept ``axis`` (``log``: a log scale): each arm's boot
    means at each point with the mean of them joined, and each point's ratio (treatment /
    baseline) with its interval, drawn by its verdict, beside no change (1) and the
    claim's ``threshold`` (1 + or - min_effect). Where two neighbouring points' verdicts
    differ, a dotted line between them marks it on both panels. None when no point has
    a boot mean; :class:`PlotNotWritten` when it could not be written."""
    points = list(points)
    if not any(p.baseline or p.treatment for p in points):
        return None
    plt = _pyplot()
    xs = [p.x if axis is not None and p.x is not None else float(i) for i, p in enumerate(points)]
    ylabel = f"{metric} ({unit})" if unit else metric
    fig, (arms, ratios) = plt.subplots(1, 2, figsize=(10, 3.9), dpi=110, facecolor="white")

    def nudged(x: float, side: int) -> float:  # the two arms side by side at a point
        if axis is not None and log:
            return x * (1.0 + 0.04 * side)
        span = (max(xs) - min(xs)) or 1.0
        return x + side * 0.012 * span

    for side, (name, (color, marker)) in zip((-1, 1), SIDE_STYLE.items()):
        at = [(x, getattr(p, name)) for x, p in zip(xs, points) if getattr(p, name)]
        arms.scatter([nudged(x, side) for x, vals in at for _ in vals], [v for _, vals in at for v in vals],
                     marker=marker, s=22, facecolors="white", edgecolors=color, linewidths=1.2, zorder=3,
                     label=f"{name}: a boot's mean")
        arms.plot([x for x, _ in at], [sum(vals) / len(vals) for _, vals in at], color=color, linewidth=1.4,
                  zorder=2, label=f"{name}: mean of its boots")
    for p, x in zip(points, xs):
        face, edge, marker = VERDICT_STYLE.get(p.outcome, ("white", "0.6", "s"))
        if p.ratio is None:
            continue
        if p.ci is not None:
            ratios.errorbar([x], [p.ratio], yerr=[[p.ratio - p.ci[0]], [p.ci[1] - p.ratio]], color=edge,
                            capsize=4, linewidth=1.2, zorder=2)
        ratios.scatter([x], [p.ratio], s=52, marker=marker, facecolors=face, edgecolors=edge, linewidths=1.5,
                       zorder=3)
    for outcome, (face, edge, marker) in VERDICT_STYLE.items():  # one legend entry per verdict drawn
        if any(p.outcome == outcome and p.ratio is not None for p in points):
            ratios.scatter([], [], s=52, marker=marker, facecolors=face, edgecolors=edge, label=outcome)
    ratios.axhline(1.0, color="0.3", linewidth=0.9, label="no change")
    if threshold is not None:
        ratios.axhline(threshold, color="0.3", linewidth=0.9, linestyle="--", label="the claim's size")
    changed = [k for k in range(1, len(points)) if points[k].outcome != points[k - 1].outcome]
    for k in changed:
        between = (xs[k - 1] * xs[k]) ** 0.5 if axis is not None and log else (xs[k - 1] + xs[k]) / 2
        for ax in (arms, ratios):
            ax.axvline(between, color="tab:purple", linestyle=":", linewidth=1.3, zorder=1,
                       label="the verdict differs" if ax is ratios and k == changed[0] else None)
    for ax in (arms, ratios):
        if axis is not None and log:
            ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([p.tick for p in points], fontsize=7, rotation=0 if axis is not None else 30)
        ax.minorticks_off()
        ax.set_xlabel(axis if axis is not None else "load point")
        ax.grid(axis="y", color="0.85", linewidth=0.6)
        ax.legend(loc="best", fontsize=7, framealpha=0.9)
    arms.set_ylabel(f"boot mean {ylabel}")
    arms.set_title("each arm's boots at each point (the verdicts' boots)", fontsize=9)
    ratios.set_ylabel("treatment / baseline")
    ratios.set_title("each point's ratio and interval, by its verdict", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, facecolor="white")
