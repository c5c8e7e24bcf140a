"""Timelines for the correlate role, Alertmanager's acceptance style: push anomaly X at t, want
notification Y between t1 and t2, and nothing else.

A :class:`Timeline` is data; :func:`run_timelines` plays several at once through the real broker
against one correlate role running in-process (each timeline on its own cluster label, so each has its
own engine). Times are seconds after the timeline's start. An anomaly pushed at ``t`` carries
``ts = start + t``, so engine time and wall time agree: a notification is judged both by its engine
time (``Notification.ts``, exact: timers fire at their due time) and by when the notify callable
received it (wall time, which includes the broker round trips, so its window has some slack).

The only sleeps here schedule pushes at their timeline time and wait for the timeline's end (to see
that nothing else arrives); everything that waits *for* something polls with a deadline.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.app import Pipeline
from pipelines.correlate.correlator import Correlator
from services.alerting.notification import Notification
from services.core.events import Anomaly
from services.ingest.normalise import alertmanager_webhook

WALL_SLACK_S = 1.5  # broker round trips and the tick interval, on a loaded 2-core machine


@dataclass(frozen=True)
class Push:
    """Publish one anomaly at ``at``."""

    at: float
    signal: str
    entity: str
    labels: dict[str, str] = field(default_factory=dict)
    severity: str = "warning"
    status: str = "firing"
    entity_kind: str = "other"

    def anomaly(self, cluster: str, start: float) -> Anomaly:
        return Anomaly(
            entity=self.entity,
            entity_kind=self.entity_kind,  # type: ignore[arg-type]
            signal=self.signal,
            detector="acceptance",
            score=1.0,
            threshold=0.5,
            severity=self.severity,  # type: ignore[arg-type]
            status=self.status,  # type: ignore[arg-type]
            ts=start + self.at,
            labels={**self.labels, "cluster": cluster},
        )


@dataclass(frozen=True)
class WebhookPush:
    """Publish one Alertmanager webhook alert at ``at``, normalised as the ingest receiver does.

    The alert started at ``starts`` (seconds after the timeline's start, like ``at``); a resolved one
    ended at ``at``. Alertmanager's fingerprint is left out, so the alert is identified by its labels.
    """

    at: float
    alertname: str
    labels: dict[str, str]
    status: str = "firing"
    starts: float = 0.0

    def anomaly(self, cluster: str, start: float) -> Anomaly:
        def rfc3339(t: float) -> str:
            return dt.datetime.fromtimestamp(start + t, dt.UTC).isoformat().replace("+00:00", "Z")

        alert = {
            "status": self.status,
            "labels": {**self.labels, "alertname": self.alertname, "cluster": cluster},
            "startsAt": rfc3339(self.starts),
            "endsAt": rfc3339(self.at) if self.status == "resolved" else "0001-01-01T00:00:00Z",
        }
        body = {"version": "4", "groupKey": f"{{}}:{{alertname={self.alertname!r}}}", "status": self.status}
        (anomaly,) = alertmanager_webhook(json.dumps({**body, "alerts": [alert]}).encode())
        return anomaly


@dataclass(frozen=True)
class Step:
    """Run ``action`` (e.g. expire a silence through the API) at ``at``."""

    at: float
    action: Callable[[], Any]


@dataclass(frozen=True)
class Want:
    """One expected notification: about ``entities`` (exactly), for ``reason``, between ``t1`` and ``t2``."""

    t1: float
    t2: float
    entities: frozenset[str]
    reason: str


@dataclass(frozen=True)
class Seen:
    """A notification as received: engine and wall time after the timeline's start."""

    engine_t: float
    wall_t: float
    notification: Notification

    @property
    def entities(self) -> frozenset[str]:
        return frozenset(a.entity for a in self.notification.alerts)

    def __str__(self) -> str:
        n = self.notification
        return f"{n.reason} {sorted(self.entities)} at engine {self.engine_t:.2f} s, wall {self.wall_t:.2f} s"


@dataclass
class Timeline:
    """Pushes and steps on one cluster, and the notifications wanted until ``end``."""

    name: str
    pushes: Sequence[Push | WebhookPush]
    wants: Sequence[Want]
    end: float
    steps: Sequence[Step] = ()
    setup: Callable[[], Awaitable[None]] | None = None
    start: float = 0.0
    seen: list[Seen] = field(default_factory=list)

    @property
    def cluster(self) -> str:
        return f"tl-{self.name}"

    def check(self) -> list[str]:
        """Problems: wants not met (in engine or wall time), and notifications nobody wanted."""
        problems = []
        left = [s for s in self.seen if s.engine_t <= self.end]
        for want in self.wants:
            match = next(
                (s for s in left if s.entities == want.entities and s.notification.reason == want.reason), None
            )
            if match is None:
                problems.append(f"wanted {want.reason} {sorted(want.entities)} in [{want.t1}, {want.t2}]: none")
                continue
            left.remove(match)
            if not want.t1 - 1e-6 <= match.engine_t <= want.t2 + 1e-6:
                problems.append(f"wanted {want.reason} {sorted(want.entities)} in [{want.t1}, {want.t2}]: {match}")
            if not want.t1 - 1e-6 <= match.wall_t <= want.t2 + WALL_SLACK_S:
                problems.append(f"{match} arrived outside [{want.t1}, {want.t2} + {WALL_SLACK_S}] wall time")
        problems += [f"unwanted: {s}" for s in left]
        return problems


class Recorder:
    """The notify callable of the run: records every notification with its arrival time, per cluster."""

    def __init__(self, timelines: Sequence[Timeline]) -> None:
        self.by_cluster = {t.cluster: t for t in timelines}
        self.other: list[Notification] = []

    def __call__(self, notification: Notification) -> None:
        wall = time.time()
        cluster = next((a.labels.get("cluster", "") for a in notification.alerts), "")
        timeline = self.by_cluster.get(cluster)
        if timeline is None:
            self.other.append(notification)
            return
        timeline.seen.append(Seen(notification.ts - timeline.start, wall - timeline.start, notification))


async def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` until truthy; raise AssertionError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def ready(pipeline: Pipeline, correlator: Correlator, timeout_s: float = 60.0) -> None:
    """Wait until the role consumes: a resolved anomaly for an unknown alert creates the probe's engine."""
    probe = Anomaly(
        entity="probe",
        signal="probe",
        detector="acceptance",
        score=0.0,
        threshold=1.0,
        status="resolved",
        ts=time.time(),
        labels={"cluster": "probe"},
    )
    await pipeline.topics.anomalies.send(key=b"probe", value=probe.to_bytes())
    await wait_for(lambda: "probe" in correlator.engines, timeout_s, "the correlate role to consume")


async def play(pipeline: Pipeline, timeline: Timeline) -> None:
    """Run one timeline: its setup, then each push and step at its time, then wait for its end."""
    if timeline.setup is not None:
        await timeline.setup()
    timeline.start = time.time()
    events: list[tuple[float, int, Push | WebhookPush | Step]] = [(p.at, 0, p) for p in timeline.pushes]
    events += [(s.at, 1, s) for s in timeline.steps]
    for at, _, item in sorted(events, key=lambda e: (e[0], e[1])):
        await asyncio.sleep(max(0.0, timeline.start + at - time.time()))  # schedule, not synchronise
        if isinstance(item, Push | WebhookPush):
            anomaly = item.anomaly(timeline.cluster, timeline.start)
            await pipeline.topics.anomalies.send(key=anomaly.key().encode(), value=anomaly.to_bytes())
        else:
            await asyncio.to_thread(item.action)
    await asyncio.sleep(max(0.0, timeline.start + timeline.end + WALL_SLACK_S - time.time()))


async def run_timelines(pipeline: Pipeline, timelines: Sequence[Timeline]) -> None:
    """Play every timeline concurrently."""
    await asyncio.gather(*(play(pipeline, t) for t in timelines))
