"""Plots of a job record: a timeline of its calls and a histogram of call durations.

The timeline has one row per call and time since the job started on the
horizontal axis.  The attempt whose result counted is split into phases:

* queued: sent by the client until the worker started it (a cold call's
  container or process start is in here too, where the platform hides it);
* cold start: a cold worker loading the function (imports, unpickling);
* running: the items (and, on a warm worker, loading the chunk);
* writing: the result and captured output written to storage.

Earlier attempts (crashed, lost, retried) are drawn as red bars from when they
were sent until the client gave up on them.  A job still running is a snapshot:
its title says how many of its calls are done, the attempts still out are drawn
as "in flight" up to now, and a warning says so (a plot that looks complete
would be taken for the whole job).  matplotlib is imported only here,
and only the Agg canvas is used, so plotting never opens a window or changes
the backend of a notebook's pyplot.
"""

from __future__ import annotations

import os
import time
import warnings

from ..errors import FnmapError
from . import report
from .records import percentile, run_seconds

PHASE_COLOURS = {
    "queued": "#c7c7c7",
    "cold start": "#4c72b0",
    "running": "#55a868",
    "writing": "#dd8452",
    "failed attempt": "#c44e52",
    "in flight": "#b4d7b4",
}


class PlotError(FnmapError, RuntimeError):
    """A plot cannot be made (matplotlib missing, nothing to plot, unwritable path)."""


def phases(call: dict) -> tuple[list[tuple[str, float, float]], list[tuple[float, float, str]]]:
    """``([(phase, start, end), ...], [(sent, ended, outcome), ...])`` of one call entry."""
    spans: list[tuple[str, float, float]] = []
    failed: list[tuple[float, float, str]] = []
    counted = call.get("attempt")
    for attempt in call.get("attempts", []):
        if attempt["attempt"] == counted or attempt.get("sent") is None:
            continue
        if attempt.get("outcome") not in ("ok", "error") and attempt.get("ended") is not None:
            failed.append((attempt["sent"], attempt["ended"], attempt["outcome"] or "?"))
    started, finished = call.get("started"), call.get("finished")
    if started is None or finished is None:
        return spans, failed
    sent = next((a["sent"] for a in call.get("attempts", []) if a["attempt"] == counted), None)
    if sent is not None and started > sent:
        spans.append(("queued", sent, started))
    loaded = call.get("loaded") or started
    if call.get("cold") and loaded > started:
        spans.append(("cold start", started, loaded))
        spans.append(("running", loaded, finished))
    else:
        spans.append(("running", started, finished))
    written = call.get("written")
    if written is not None and written > finished:
        spans.append(("writing", finished, written))
    return spans, failed


def plot_record(record: dict, path: str, title: str | None = None) -> str:
    """Draw the timeline and the duration histogram of a job record into ``path``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotError("job plots need matplotlib: pip install 'fnmap[plot]'") from e
    calls = record.get("calls", [])
    if not calls:
        raise PlotError(f"job {record.get('job_id')} has no calls to plot")
    summary = record.get("summary", {})
    partial = running_note(record)
    if partial:
        warnings.warn(f"fnmap: job {record.get('job_id')} is {partial}: the plot shows only what is done "
                      "so far (the calls still out as 'in flight')", RuntimeWarning, stacklevel=2)
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    timeline, histogram = fig.subplots(2, 1, height_ratios=[3, 1])
    _draw_timeline(timeline, calls, record["created"])
    title = title or _title(record, summary)
    if partial:
        timeline.set_title(f"{partial.upper()} (a snapshot)\n{title}", fontsize="medium", color="#c44e52")
    else:
        timeline.set_title(title, fontsize="medium")
    _draw_histogram(histogram, calls)
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise PlotError(f"cannot write the plot to {path}: {e}") from e
    return os.fspath(path)


def running_note(record: dict) -> str | None:
    """``running: N of M calls done`` for a job that has not ended (None once it has)."""
    summary = record.get("summary", {})
    calls = record.get("calls", [])
    unfinished = sum(1 for c in calls if not report.ended(c))
    if summary.get("status") != "running" and not unfinished:
        return None
    total = max(summary.get("calls") or 0, len(calls))
    done = summary.get("calls_done", len(calls) - unfinished)
    return f"{summary.get('status') or 'running'}: {done} of {total} calls done"


def _timeline_bars(calls: list[dict], t0: float) -> tuple[dict, list, list]:
    """The bars of every phase ``{phase: [(call, left, width)]}`` and the x, y of calls with failed items."""
    bars: dict[str, list[tuple[float, float, float]]] = {name: [] for name in PHASE_COLOURS}
    errors_x, errors_y = [], []
    now = time.time()
    for call in calls:
        y = call["call"]
        spans, failed = phases(call)
        for name, start, end in spans:
            bars[name].append((y, start - t0, end - start))
        if not report.ended(call):  # its attempts still out, up to now
            for attempt in call.get("attempts", []):
                if attempt.get("sent") is not None and attempt.get("ended") is None:
                    bars["in flight"].append((y, attempt["sent"] - t0, max(0.0, now - attempt["sent"])))
        for sent, ended, _outcome in failed:
            bars["failed attempt"].append((y, sent - t0, ended - sent))
        if report.failed(call) and spans:
            errors_x.append(spans[-1][2] - t0)
            errors_y.append(y)
    return bars, errors_x, errors_y


def _draw_timeline(timeline, calls: list[dict], t0: float) -> None:
    from matplotlib.patches import Patch

    bars, errors_x, errors_y = _timeline_bars(calls, t0)
    for name, segments in bars.items():
        if not segments:
            continue
        ys, lefts, widths = zip(*segments, strict=True)
        timeline.barh(ys, widths, left=lefts, height=0.8, color=PHASE_COLOURS[name], linewidth=0)
    if errors_x:
        timeline.scatter(
            errors_x, errors_y, marker="x", color="#c44e52", s=18, zorder=3, linewidths=1
        )
    timeline.set_ylim(len(calls) - 0.5 if len(calls) > 1 else 0.5, -0.5)
    timeline.set_xlim(left=0)
    timeline.set_xlabel("seconds since the job started")
    timeline.set_ylabel("call")
    legend = [Patch(color=PHASE_COLOURS[n], label=n) for n in PHASE_COLOURS if bars[n]]
    if errors_x:
        legend.append(Patch(color="#c44e52", label="items failed (x)", fill=False))
    timeline.legend(handles=legend, loc="upper right", fontsize="small", framealpha=0.9)


def _draw_histogram(histogram, calls: list[dict]) -> None:
    durations = [d for d in (run_seconds(c) for c in calls) if d is not None]
    if durations:
        histogram.hist(
            durations, bins=min(50, max(5, len(durations) // 4)), color=PHASE_COLOURS["running"]
        )
        for q, style in ((50, "-"), (95, "--")):
            value = percentile(durations, q)
            histogram.axvline(
                value,
                color="black",
                linestyle=style,
                linewidth=1,
                label=f"p{q} {value * 1000:.1f} ms" if value < 1 else f"p{q} {value:.2f} s",
            )
        histogram.legend(fontsize="small")
    histogram.set_xlabel("call duration on the worker (seconds)")
    histogram.set_ylabel("calls")


def _title(record: dict, summary: dict) -> str:
    parts = [f"job {record['job_id'][:12]}", f"{summary.get('calls', len(record['calls']))} calls"]
    if record.get("function"):
        parts.insert(0, str(record["function"]))
    if record.get("backend"):
        parts.append(f"on {record['backend']}")
    if summary.get("wall_seconds") is not None:
        parts.append(f"{summary['wall_seconds']:.2f} s wall")
    if summary.get("cold_starts") is not None:
        parts.append(f"{summary['cold_starts']} cold")
    if summary.get("retries"):
        parts.append(f"{summary['retries']} retried")
    if summary.get("calls_failed"):
        parts.append(f"{summary['calls_failed']} failed")
    return " · ".join(parts)
