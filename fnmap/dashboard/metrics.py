"""``/metrics``: the jobs in storage as Prometheus series, so a team's Grafana can watch them.

Written by prometheus_client's own exposition code (a collector over the front page's
:class:`~fnmap.dashboard.listing.JobList`, a registry of its own per scrape), so escaping and the
text format are the library's.  Two kinds of series:

* totals over every job in storage: ``fnmap_jobs{status}``, ``fnmap_calls{state}``,
  ``fnmap_items``, ``fnmap_failed_items``, ``fnmap_retries``, ``fnmap_cache_hits`` (items answered by
  the result cache), ``fnmap_cost_usd`` (gauges: they fall
  when ``fnmap gc`` removes jobs);
* per job, for the :data:`PER_JOB` most recent jobs only (a label per job id grows without bound
  otherwise): ``fnmap_job_info`` (its status, function, backend, kind as labels, value 1),
  ``fnmap_job_calls{state}``, ``fnmap_job_items``, ``fnmap_job_failed_items``, ``fnmap_job_cache_hits``,
  ``fnmap_job_retries_total``, ``fnmap_job_call_duration_seconds{quantile}`` (the worker's run
  time, p50, p95 and max as quantile 1), ``fnmap_job_wall_seconds``, ``fnmap_job_cost_usd``.

Values are what the jobs' index entries say (those of running jobs refreshed at each scrape),
as on the front page.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

#: Jobs that get series of their own (the most recent).
PER_JOB = 100
#: The text format's content type, as prometheus_client names it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_JOB_LABELS = ["job_id", "function"]


def exposition(summaries: list[dict], per_job: int = PER_JOB) -> bytes:
    """The text exposition of ``summaries`` (index summaries, newest first)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(summaries, per_job))
    return generate_latest(registry)


class _Collector:
    def __init__(self, summaries: list[dict], per_job: int):
        self.summaries = summaries
        self.per_job = per_job

    def collect(self):
        yield from _totals(self.summaries)
        yield from _per_job(self.summaries[: self.per_job])


def _totals(summaries: list[dict]):
    jobs = GaugeMetricFamily("fnmap_jobs", "Jobs in storage by status", labels=["status"])
    by_status: dict[str, int] = {}
    for s in summaries:
        by_status[s.get("status") or "unknown"] = by_status.get(s.get("status") or "unknown", 0) + 1
    for status, n in sorted(by_status.items()):
        jobs.add_metric([status], n)
    calls = GaugeMetricFamily("fnmap_calls", "Calls of the jobs in storage by state", labels=["state"])
    by_state: dict[str, int] = {}
    for s in summaries:
        for state, n in (s.get("states") or {}).items():
            by_state[state] = by_state.get(state, 0) + (n or 0)
    for state, n in sorted(by_state.items()):
        calls.add_metric([state], n)
    yield jobs
    yield calls
    yield GaugeMetricFamily("fnmap_items", "Items of the jobs in storage",
                            value=sum(s.get("items") or 0 for s in summaries))
    yield GaugeMetricFamily("fnmap_failed_items", "Items that raised, over the jobs in storage",
                            value=sum(s.get("failed_items") or 0 for s in summaries))
    # Totals over what is in storage fall when `fnmap gc` removes jobs: gauges, not counters.
    yield GaugeMetricFamily("fnmap_retries", "Attempts that were retries, over the jobs in storage",
                            value=sum(s.get("retries") or 0 for s in summaries))
    yield GaugeMetricFamily("fnmap_cache_hits", "Items answered by the result cache, over the jobs in storage",
                            value=sum(s.get("cache_hits") or 0 for s in summaries))
    yield GaugeMetricFamily("fnmap_cost_usd", "Estimated cost of the jobs in storage (USD)",
                            value=sum(_usd(s) or 0.0 for s in summaries))


def _per_job(summaries: list[dict]):
    info = GaugeMetricFamily("fnmap_job_info", "A job: its status, function, backend and kind (value 1)",
                             labels=["job_id", "function", "status", "backend", "kind"])
    calls = GaugeMetricFamily("fnmap_job_calls", "A job's calls by state", labels=[*_JOB_LABELS, "state"])
    items = GaugeMetricFamily("fnmap_job_items", "A job's items", labels=_JOB_LABELS)
    failed = GaugeMetricFamily("fnmap_job_failed_items", "A job's items that raised", labels=_JOB_LABELS)
    retries = CounterMetricFamily("fnmap_job_retries", "A job's attempts that were retries", labels=_JOB_LABELS)
    hits = GaugeMetricFamily("fnmap_job_cache_hits", "A job's items answered by the result cache", labels=_JOB_LABELS)
    duration = GaugeMetricFamily("fnmap_job_call_duration_seconds",
                                 "Run time of a job's calls on the worker (quantile 1: the longest)",
                                 labels=[*_JOB_LABELS, "quantile"])
    wall = GaugeMetricFamily("fnmap_job_wall_seconds", "A job's wall time so far", labels=_JOB_LABELS)
    usd = GaugeMetricFamily("fnmap_job_cost_usd", "A job's estimated cost (USD)", labels=_JOB_LABELS)
    for s in summaries:
        labels = [s["job_id"], s.get("function") or ""]
        info.add_metric([*labels, s.get("status") or "", s.get("backend") or "", s.get("kind") or ""], 1)
        for state, n in sorted((s.get("states") or {}).items()):
            calls.add_metric([*labels, state], n or 0)
        items.add_metric(labels, s.get("items") or 0)
        failed.add_metric(labels, s.get("failed_items") or 0)
        retries.add_metric(labels, s.get("retries") or 0)
        hits.add_metric(labels, s.get("cache_hits") or 0)
        spread = s.get("duration_seconds") or {}
        for quantile, name in (("0.5", "p50"), ("0.95", "p95"), ("1", "max")):
            if spread.get(name) is not None:
                duration.add_metric([*labels, quantile], spread[name])
        if s.get("wall_seconds") is not None:
            wall.add_metric(labels, s["wall_seconds"])
        if _usd(s) is not None:
            usd.add_metric(labels, _usd(s))
    yield from (info, calls, items, failed, retries, hits, duration, wall, usd)


def _usd(summary: dict) -> float | None:
    return (summary.get("cost") or {}).get("usd")
