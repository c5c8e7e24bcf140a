"""Alerts: an anomaly's occurrences, its resolve timeout, flap detection, and the routes it is active on."""

from __future__ import annotations

from pipelines.correlate.incidents import IncidentLinking
from pipelines.correlate.model import (
    Action,
    AggrGroup,
    Alert,
)
from pipelines.correlate.stages import (
    group_of,
    route_alert,
)
from services.alerting.labels import alert_fingerprint, alert_labels
from services.alerting.routes import Route
from services.core.events import Anomaly


class AlertLifecycle(IncidentLinking):
    """Alerts from anomalies (:mod:`pipelines.correlate.state` shows the layers)."""

    def _apply(self, anomaly: Anomaly, at: float, out: list[Action]) -> None:
        labels = alert_labels(anomaly)
        fp = alert_fingerprint(anomaly, labels)
        alert = self.alerts.get(fp)
        if alert is None:
            if anomaly.status == "resolved":
                return  # nothing known to resolve
            alert = Alert(
                fingerprint=fp,
                labels=labels,
                entity=anomaly.entity,
                entity_kind=anomaly.entity_kind,
                signal=anomaly.signal,
                detector=anomaly.detector,
                severity=anomaly.severity,
                starts_at=anomaly.ts,
                first_seen=at,
                routes=[route.id for route in route_alert(self.root, labels)],
            )
            self.alerts[fp] = alert
            # Incidents that still list this fingerprint (from an earlier alert) index it afresh.
            for iid in sorted(self._member_of.get(fp, ())):
                inc = self.incidents.get(iid)
                if inc is not None:
                    self._joined(inc, fp)
        self.topology.learn(labels, at, anomaly.entity, anomaly.entity_kind)
        alert.evidence = dict(anomaly.evidence)
        alert.provenance = anomaly.provenance.model_dump(mode="json")
        alert.score, alert.threshold = anomaly.score, anomaly.threshold
        severity_changed = alert.severity != anomaly.severity
        alert.severity = anomaly.severity
        before = alert.status
        if anomaly.status == "firing":
            alert.occurrences.append(at)
        self._observe(alert, anomaly.status, anomaly.ts, at)
        self._status_changed(alert, before, at, out, force=severity_changed)
        if alert.status == "firing":
            self._activate(alert, at)
        self._touch_alert(fp)

    def _observe(self, alert: Alert, raw: str, ts: float, at: float) -> None:
        """Record what the source says (or the resolve timeout decided) and update flapping."""
        previous = alert.raw_status
        if raw == "firing":
            alert.last_seen = at
            alert.timeout_at = at + self.config.global_.resolve_timeout
        else:
            alert.timeout_at = None
            alert.raw_ends_at = ts
        if previous and previous != raw and self.config.correlation.flap_detection.enabled:
            alert.changes.append(at)
        alert.raw_status = raw
        self._refresh(alert, at, ts)

    def _refresh(self, alert: Alert, at: float, ts: float | None = None) -> None:
        """Re-evaluate flapping (with hysteresis) and the status the pipeline sees."""
        flap = self.config.correlation.flap_detection
        if flap.enabled:
            alert.changes = [c for c in alert.changes if c > at - flap.window]
            if not alert.flapping and len(alert.changes) >= flap.high:
                alert.flapping = True
            elif alert.flapping and len(alert.changes) <= flap.low:
                alert.flapping = False
        status = "firing" if alert.raw_status == "firing" or alert.flapping else "resolved"
        if status == alert.status:
            return
        alert.status = status
        if status == "firing":
            alert.starts_at = ts if ts is not None else at
            alert.ends_at = None
            alert.resolved_at = None
        else:
            alert.ends_at = alert.raw_ends_at if alert.raw_ends_at is not None else at
            alert.resolved_at = at
            alert.active_routes = []
            alert.activated_at = None

    def _flap_end(self, alert: Alert) -> float | None:
        """When the state changes in the window will have dropped to ``low`` (flapping ends)."""
        if not alert.flapping:
            return None
        flap = self.config.correlation.flap_detection
        if len(alert.changes) <= flap.low:
            return self.clock
        return alert.changes[len(alert.changes) - flap.low - 1] + flap.window

    def _status_changed(self, alert: Alert, before: str, at: float, out: list[Action], force: bool = False) -> None:
        """Tell the alert's incident that a member changed (re-firing reopens a mitigated incident)."""
        if alert.status == before and not force:
            return
        inc = self.incidents.get(alert.incident_id or "")
        if inc is None or inc.state == "resolved":
            if alert.status == "firing":
                alert.incident_id = None  # a new firing episode is linked afresh
            return
        if alert.status == "firing" and before != "firing" and inc.state == "mitigated":
            inc.state = "open"
        self._rate(inc, at)
        self._changed(inc, at, out)

    def _activate(self, alert: Alert, at: float) -> None:
        """Route stage thresholds: become active on each route whose N-in-M is met, and join its group."""
        alert.occurrences = [o for o in alert.occurrences if o >= at - self._max_occurrence_window]
        for route_id in alert.routes:
            route = self._routes.get(route_id)
            if route is None or route_id in alert.active_routes:
                continue
            count = sum(1 for o in alert.occurrences if o >= at - route.occurrence_window)
            if count < route.min_occurrences:
                continue
            alert.active_routes.append(route_id)
            if alert.activated_at is None:
                alert.activated_at = at
            self._group_insert(alert, route, at)

    def _group_insert(self, alert: Alert, route: Route, at: float) -> None:
        key, group_labels = group_of(route, alert.labels)
        group = self.groups.get(key)
        if group is None:
            group = AggrGroup(
                key=key,
                route_id=route.id,
                labels=group_labels,
                receiver=route.receiver,
                created_at=at,
                next_flush=at + route.group_wait,
            )
            self.groups[key] = group
        if alert.fingerprint not in group.fingerprints:
            group.fingerprints = sorted([*group.fingerprints, alert.fingerprint])
            self._groups_of.setdefault(alert.fingerprint, set()).add(key)
        self._dirty_groups.add(key)
        # As Alertmanager does: an alert that started longer than group_wait ago does not wait again.
        if not group.has_flushed and alert.starts_at + route.group_wait < at:
            group.next_flush = min(group.next_flush, at)
