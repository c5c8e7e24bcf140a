"""The report's plots: matplotlib without a display (the Agg canvas, no pyplot state), as PNG bytes.

Three figures, each drawn only when there is something to draw, all on the same time axis (the report's
window, UTC) and with the same margins, so that stacked in the HTML the same minute is at the same place:

* ``signals.png``: each alert of the incident as a bar from its start to its end, coloured by severity, with
  its stored anomaly occurrences marked; every action carried out, the mitigation and the resolution as
  vertical lines.
* ``gpu.png`` (a GPU was named): the GPUs' XID code with the XID rule's threshold, temperature and power,
  and the metric behind any deviation a learned detector reported, with the anomaly marks.
* ``serving.png`` (a model was named): time to first token p95 of the model's pods (with the SLO target when
  a stored SLO alert gives one), how many of its pods reported, and the share of failed requests at the router.

A series the window should hold but does not (a GPU that fell off the bus stops reporting) is said in a note,
never interpolated.
"""

from __future__ import annotations

import io
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.core.events import MetricBatch
from services.core.features import FEATURES
from services.reports.build import (
    FAILED_CODES,
    ROUTER_METRIC,
    TTFT,
    Mark,
    PlotSet,
    affected,
    clock,
    duration,
    first_sample,
    marks,
    short,
    window_of,
)
from services.reports.document import Figure
from services.reports.facts import IncidentFacts
from services.reports.telemetry import Series, Telemetry, counter_ratio, coverage, gauge, histogram_quantile

WIDTH_IN = 10.0
DPI = 100
LEFT, RIGHT = 0.23, 0.97  # the same in every figure, so their time axes line up
PANEL_IN = 1.9
MAX_LINES = 8
SEVERITY_COLOURS = {"critical": "#c0392b", "warning": "#e67e22", "info": "#2e86c1"}
MARK_STYLES: dict[str, dict[str, Any]] = {
    "action": {"color": "#34495e", "linestyle": "--", "linewidth": 1.0},
    "rollback": {"color": "#8e44ad", "linestyle": "--", "linewidth": 1.0},
    "other": {"color": "#95a5a6", "linestyle": ":", "linewidth": 1.2},
    "mitigated": {"color": "#27ae60", "linestyle": "--", "linewidth": 1.6},
    "resolved": {"color": "#27ae60", "linestyle": "-", "linewidth": 1.6},
    "t0": {"color": "#c0392b", "linestyle": ":", "linewidth": 1.4},
}
GPU_PANELS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_XID_ERRORS", "XID code"),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature (°C)"),
    ("DCGM_FI_DEV_POWER_USAGE", "power (W)"),
)
XID_DETECTORS = ("xid_rules",)
LINE_COLOURS = ("#c0392b", "#2e86c1", "#16a085", "#8e44ad", "#d35400", "#7f8c8d", "#2c3e50", "#f1c40f")


@dataclass
class _Context:
    facts: IncidentFacts
    batches: Sequence[MetricBatch]
    window: tuple[float, float]
    t0: float
    marks: list[Mark]
    notes: list[str] = field(default_factory=list)


def draw_plots(facts: IncidentFacts, telemetry: Telemetry | None) -> PlotSet:
    """Draw the report's figures from its facts and telemetry; the notes say what the telemetry lacked."""
    ctx = _Context(
        facts=facts,
        batches=telemetry.batches if telemetry is not None else [],
        window=window_of(facts),
        t0=first_sample(facts),
        marks=marks(facts),
    )
    figures: list[Figure] = []
    if facts.alerts:
        figures.append(_signals(ctx))
    else:
        ctx.notes.append("No alert is linked to this incident: there is no signal to plot.")
    if ctx.batches:
        gpu = _gpu(ctx)
        if gpu is not None:
            figures.append(gpu)
        serving = _serving(ctx)
        if serving is not None:
            figures.append(serving)
        _gaps(ctx)
    return PlotSet(figures=tuple(figures), notes=tuple(ctx.notes))


# ------------------------------------------------------------------------------------------ common


def _figure(panels: int, height_in: float | None = None) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    height = height_in if height_in is not None else 0.9 + PANEL_IN * panels
    fig = MplFigure(figsize=(WIDTH_IN, height), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(panels, 1, i + 1) for i in range(panels)]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    bottom = 0.6 / height
    top = 1 - 0.75 / height  # room above the first panel for the marks' labels
    fig.subplots_adjust(left=LEFT, right=RIGHT, bottom=bottom, top=top, hspace=0.35)
    return fig, axes


def _time_axis(ax: Any, window: tuple[float, float], *, labels: bool) -> None:
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    lo, hi = window
    ax.set_xlim(lo, hi)
    span = hi - lo
    step = next((s for s in (60, 120, 300, 600, 900, 1800, 3600, 7200, 21600) if span / s <= 12), 43200)
    ax.xaxis.set_major_locator(MultipleLocator(step))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: clock(x)[:5] if labels else ""))
    ax.tick_params(axis="x", labelbottom=labels, labelsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def _marks(ax: Any, ctx: _Context, *, annotate: bool = False) -> None:
    ax.axvline(ctx.t0, **MARK_STYLES["t0"])
    grouped: dict[tuple[float, str], list[str]] = {}
    for m in ctx.marks:
        ax.axvline(m.at, **MARK_STYLES[m.kind])
        grouped.setdefault((m.at, m.kind), []).append(m.label)
    if not annotate:
        return
    from matplotlib.transforms import blended_transform_factory

    trans = blended_transform_factory(ax.transData, ax.transAxes)
    ax.text(ctx.t0, 1.02, "T0 ", transform=trans, fontsize=7, color=MARK_STYLES["t0"]["color"], ha="right", va="bottom")
    span = ctx.window[1] - ctx.window[0]
    taken: list[tuple[float, float, int]] = []  # (start, end, row) of the labels placed, in data units
    for (at, kind), labels in sorted(grouped.items()):
        text = ellipsize(", ".join(dict.fromkeys(ellipsize(label, 30) for label in labels)), 46)
        width = len(text) * span / 150  # about a 7-point character's width on a 10-inch axis
        # a label that would overprint one already placed goes one row up
        row = 0
        while any(row == r and at < end and at + width > start for start, end, r in taken):
            row += 1
        taken.append((at, at + width, row))
        ax.text(
            at,
            1.02 + 0.09 * row,
            f" {text}",
            transform=trans,
            fontsize=7,
            color=MARK_STYLES[kind]["color"],
            ha="left",
            va="bottom",
        )


def _legend(fig: Any) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], **MARK_STYLES["t0"], label="T0: first anomalous sample"),
        Line2D([], [], **MARK_STYLES["action"], label="action"),
        Line2D([], [], **MARK_STYLES["other"], label="another incident's action"),
        Line2D([], [], **MARK_STYLES["mitigated"], label="mitigated"),
        Line2D([], [], **MARK_STYLES["resolved"], label="resolved"),
        Line2D([], [], marker="v", color="black", linestyle="none", markersize=6, label="anomaly fired"),
        Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="none",
            color="black",
            linestyle="none",
            markersize=5,
            label="anomaly resolved",
        ),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=7, fontsize=7, frameon=False, bbox_to_anchor=(0.55, 0.0))


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _line(ax: Any, series: Series, colour: str, *, step: bool = False) -> None:
    if not series.ts:
        return
    if step:
        ax.step(series.ts, series.values, where="post", color=colour, linewidth=1.4, label=series.label)
    else:
        ax.plot(series.ts, series.values, color=colour, linewidth=1.4, label=series.label)


def _value_at(series: Series, at: float, *, within: float) -> float | None:
    """The value of the sample nearest ``at``, if one is within ``within`` seconds (a mark is never put on a
    series that had stopped)."""
    best: float | None = None
    dist = within
    for t, v in zip(series.ts, series.values, strict=True):
        if abs(t - at) <= dist:
            best, dist = v, abs(t - at)
    return best


def ellipsize(text: str, limit: int) -> str:
    """``text`` cut in the middle to at most ``limit`` characters (a pod's hash suffix stays readable)."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3 :]


# ----------------------------------------------------------------------------------------- signals


def _signals(ctx: _Context) -> Figure:
    alerts = sorted(ctx.facts.alerts, key=lambda a: (a.starts_at, a.signal, a.entity))
    height = 1.6 + 0.42 * len(alerts)
    fig, (ax,) = _figure(1, height)
    hi = ctx.window[1]
    for i, a in enumerate(alerts):
        y = len(alerts) - 1 - i
        start = a.starts_at.timestamp()
        end = a.ends_at.timestamp() if a.ends_at is not None else hi
        colour = SEVERITY_COLOURS.get(a.severity, "#7f8c8d")
        ax.barh(y, max(end - start, (hi - ctx.window[0]) / 400), left=start, height=0.55, color=colour, alpha=0.85)
        if a.ends_at is None:
            ax.text(hi, y, "still firing ", ha="right", va="center", fontsize=7, color="white")
        for an in ctx.facts.anomalies:
            if an.fingerprint != a.fingerprint:
                continue
            if an.status == "firing":
                ax.plot(an.ts.timestamp(), y + 0.42, marker="v", color="black", markersize=6, linestyle="none")
            else:
                ax.plot(
                    an.ts.timestamp(),
                    y + 0.42,
                    marker="o",
                    markerfacecolor="none",
                    color="black",
                    markersize=5,
                    linestyle="none",
                )
    ax.set_yticks(range(len(alerts)))
    ax.set_yticklabels(
        [f"{a.signal} ({a.detector})\n{ellipsize(short(a.entity), 26)}" for a in reversed(alerts)], fontsize=7
    )
    ax.set_ylim(-0.6, len(alerts) - 0.2)
    _time_axis(ax, ctx.window, labels=True)
    _marks(ax, ctx, annotate=True)
    _legend(fig)
    caption = (
        "Each alert from its start to its end (red critical, orange warning), its stored anomaly occurrences"
        " (▼ fired, ○ resolved); dashed lines are the actions carried out, green the mitigation (dashed) and"
        " the resolution (solid), grey dotted another incident's action on the same node, pods or model."
    )
    return Figure("signals.png", "Alerts and actions", caption, _png(fig))


# --------------------------------------------------------------------------------------------- GPU


def _gpu(ctx: _Context) -> Figure | None:
    gpus = [g for g in affected(ctx.facts)["gpus"] if any(b.entity == g for b in ctx.batches)][:MAX_LINES]
    if not gpus:
        return None
    panels = list(GPU_PANELS)
    deviated: list[str] = []
    for an in ctx.facts.anomalies:
        for name in (an.evidence.get("top_deviations") or {}) if isinstance(an.evidence, dict) else {}:
            feature = next((f for f in FEATURES if f.name == name and f.entity_class == "gpu"), None)
            if feature is not None and feature.metric not in [p[0] for p in panels] and feature.metric not in deviated:
                deviated.append(feature.metric)
    panels += [(m, m.removeprefix("DCGM_FI_DEV_").lower().replace("_", " ")) for m in deviated[:2]]
    fig, axes = _figure(len(panels))
    thresholds = sorted({an.threshold for an in ctx.facts.anomalies if an.detector in XID_DETECTORS})
    data_end = min(ctx.window[1], max(s.ts for b in ctx.batches for s in b.samples[:1]))
    for pi, (ax, (metric, title)) in enumerate(zip(axes, panels, strict=True)):
        for gi, gpu in enumerate(gpus):
            series = gauge(ctx.batches, gpu, metric)
            if not series.ts:
                continue
            colour = LINE_COLOURS[gi % len(LINE_COLOURS)]
            _line(ax, Series(short(gpu), series.ts, series.values), colour, step=metric == GPU_PANELS[0][0])
            if data_end - series.ts[-1] > 3 * _interval(series.ts):  # the series went silent: say so on the plot
                ax.annotate(
                    f"no samples after {clock(series.ts[-1])}",
                    (series.ts[-1], series.values[-1]),
                    xytext=(10, -12),
                    textcoords="offset points",
                    fontsize=7,
                    color="#7f8c8d",
                    va="top",
                )
            for an in ctx.facts.anomalies:
                if an.entity != gpu:
                    continue
                y = _value_at(series, an.ts.timestamp(), within=2 * _interval(series.ts))
                if y is not None:
                    ax.plot(
                        an.ts.timestamp(),
                        y,
                        marker="v" if an.status == "firing" else "o",
                        color="black",
                        markerfacecolor="black" if an.status == "firing" else "none",
                        markersize=6,
                        linestyle="none",
                    )
        if metric == GPU_PANELS[0][0] and thresholds:
            for th in thresholds:
                ax.axhline(th, color="#c0392b", linewidth=0.9, linestyle="-.", alpha=0.7)
                ax.text(ctx.window[0], th, f" XID rule threshold ({th:g})", fontsize=7, color="#c0392b", va="bottom")
        ax.set_ylabel(title, fontsize=8)
        _time_axis(ax, ctx.window, labels=pi == len(panels) - 1)
        _marks(ax, ctx, annotate=pi == 0)
        if pi == 0:
            ax.legend(fontsize=7, loc="upper right", frameon=False, ncol=min(4, len(gpus)))
    _legend(fig)
    caption = (
        f"DCGM series of the GPUs the alerts name ({', '.join(short(g) for g in gpus)}): XID code with the XID"
        " rule's threshold, temperature, power"
        + (f", and {', '.join(deviated[:2])}, which a learned detector reported as deviating" if deviated else "")
        + ". ▼ marks a stored anomaly on that GPU. A learned detector's threshold is on its own score, not in"
        " these units, so only its marks are drawn."
    )
    return Figure("gpu.png", "GPU health", caption, _png(fig))


# ----------------------------------------------------------------------------------------- serving


def _interval(times: Sequence[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return statistics.median(gaps) if gaps else 15.0


def _serving(ctx: _Context) -> Figure | None:
    models = affected(ctx.facts)["models"][:MAX_LINES]
    pods_of = {m: sorted({b.entity for b in ctx.batches if b.entity.startswith(f"{m}-")}) for m in models}
    pods_of = {m: p for m, p in pods_of.items() if p}
    router = [b for b in ctx.batches if any(s.name == ROUTER_METRIC for s in b.samples)]
    if not pods_of and not router:
        return None
    targets = sorted(
        {float(a.evidence["target_s"]) for a in ctx.facts.alerts if isinstance(a.evidence.get("target_s"), int | float)}
    )
    panels = (["ttft", "pods"] if pods_of else []) + (["failed"] if router else [])
    fig, axes = _figure(len(panels))
    for pi, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        if panel == "ttft":
            for mi, (model, pods) in enumerate(pods_of.items()):
                series = histogram_quantile(ctx.batches, set(pods), TTFT, 0.95, model)
                _line(ax, series, LINE_COLOURS[mi % len(LINE_COLOURS)])
            for target in targets:
                ax.axhline(target, color="#c0392b", linewidth=0.9, linestyle="-.")
                ax.text(ctx.window[0], target, f" SLO target {target:g} s", fontsize=7, color="#c0392b", va="bottom")
            ax.set_ylabel("TTFT p95 (s)", fontsize=8)
            ax.legend(fontsize=7, loc="upper right", frameon=False)
        elif panel == "pods":
            for mi, (model, pods) in enumerate(pods_of.items()):
                scrapes = sorted({s.ts for b in ctx.batches if b.entity in pods for s in b.samples[:1]})
                step = _interval(scrapes)
                counts: dict[float, set[str]] = {}
                for b in ctx.batches:
                    if b.entity in pods and b.samples:
                        counts.setdefault(round(b.samples[0].ts / step) * step, set()).add(b.entity)
                ts = sorted(counts)
                _line(
                    ax,
                    Series(model, tuple(ts), tuple(float(len(counts[t])) for t in ts)),
                    LINE_COLOURS[mi % len(LINE_COLOURS)],
                    step=True,
                )
            ax.set_ylabel("pods reporting", fontsize=8)
            ax.set_ylim(bottom=0)
            ax.yaxis.get_major_locator().set_params(integer=True)
        else:
            series, _, _ = counter_ratio(router, ROUTER_METRIC, "code", FAILED_CODES, "router")
            _line(ax, Series("failed share", series.ts, tuple(100 * v for v in series.values)), "#c0392b")
            ax.set_ylabel("failed requests (%)", fontsize=8)
            peak = max((100 * v for v in series.values), default=0.0)
            ax.set_ylim(0, max(1.0, 1.15 * peak))  # a flat zero reads as zero, not as noise
        _time_axis(ax, ctx.window, labels=pi == len(panels) - 1)
        _marks(ax, ctx, annotate=pi == 0)
    _legend(fig)
    slo = (
        f"the SLO target from the stored SLO alert ({', '.join(f'{t:g} s' for t in targets)})"
        if targets
        else "no SLO target (no SLO alert is linked to this incident, and the store keeps no other)"
    )
    caption = (
        "Time to first token p95 of each affected model's pods per scrape interval, with "
        + slo
        + "; how many of its pods reported each scrape; the share of requests the router answered with a failure"
        f" ({', '.join(sorted(FAILED_CODES))})."
    )
    return Figure("serving.png", "Serving", caption, _png(fig))


# -------------------------------------------------------------------------------------------- gaps


def _gaps(ctx: _Context) -> None:
    """Say where an entity the incident names has no telemetry, or where its plotted series stop or pause.

    A GPU is checked series by series (a GPU that fell off the bus keeps reporting its XID while its
    temperature and power go silent); a pod as a whole.
    """
    data_end = max((s.ts for b in ctx.batches for s in b.samples[:1]), default=ctx.window[1])
    lo, hi = ctx.window[0], min(ctx.window[1], data_end)
    names = affected(ctx.facts)
    for gpu in names["gpus"]:
        if not any(b.entity == gpu for b in ctx.batches):
            ctx.notes.append(f"No telemetry for GPU {gpu} in the window: its series are missing.")
            continue
        found: dict[str, list[str]] = {}
        for metric, title in GPU_PANELS:
            for gap in _series_gaps(gauge(ctx.batches, gpu, metric).ts, lo, hi):
                found.setdefault(gap, []).append(f"{title.split(' (')[0]} ({metric})")
        for gap, what in found.items():
            ctx.notes.append(f"Telemetry gap: GPU {short(gpu)} {', '.join(what)} {gap}.")
    for pod in names["pods"]:
        times = coverage(ctx.batches, pod)
        if not times:
            ctx.notes.append(f"No telemetry for pod {pod} in the window: its series are missing.")
            continue
        for gap in _series_gaps(times, lo, hi):
            ctx.notes.append(f"Telemetry gap: pod {pod} {gap}.")


def _series_gaps(times: Sequence[float], lo: float, hi: float) -> list[str]:
    """Where one series, sampled at ``times``, is silent for more than three of its intervals in ``[lo, hi]``."""
    inside = [t for t in times if lo <= t <= hi]
    if not inside:
        return [f"reported nothing between {clock(lo)} and {clock(hi)} UTC"]
    allowed = 3 * _interval(inside)
    out = [
        f"reported nothing from {clock(a)} to {clock(b)} UTC ({duration(b - a)})"
        for a, b in itertools.pairwise(inside)
        if b - a > allowed
    ]
    if hi - inside[-1] > allowed:
        out.append(f"reported nothing after {clock(inside[-1])} UTC (the window's telemetry runs to {clock(hi)})")
    return out
