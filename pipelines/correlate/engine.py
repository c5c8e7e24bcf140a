"""The correlation engine: anomalies and a clock in, incident events and notification decisions out.

The engine is pure. It does no I/O and reads no clock: :meth:`Engine.ingest` takes an anomaly and
``now``, :meth:`Engine.tick` takes ``now``, and both return the actions due, in time order. Given
the same config, inputs and ``now`` values it returns the same actions, and its state round-trips
through :meth:`Engine.to_dict` / :meth:`Engine.from_dict` (JSON-safe), so a restarted Faust worker
neither loses nor duplicates an incident.

What happens to an anomaly:

1. **alert**: its labels (``alertname`` = signal, ``severity``, ``entity``, ``entity_kind``,
   ``detector`` plus its own labels) and fingerprint make an alert; the same fingerprint updates the
   existing alert (last seen, evidence). A resolved anomaly resolves it; so does silence for
   ``global.resolve_timeout``. Flap detection holds a flapping alert firing.
2. **route**: the routing tree decides which routes it lands in; on each it becomes *active* once it
   occurred ``min_occurrences`` times within ``occurrence_window``.
3. **group**: an active alert joins its route's group (``group_by`` labels); groups are flushed on
   Alertmanager's timers (``group_wait``, then every ``group_interval``).
4. **inhibit** and **silence**: at each flush, muted alerts are left out; time intervals can mute
   the whole route.
5. **notify**: the notification log decides whether this flush notifies (first, update, repeat,
   resolved), giving a :class:`Notification`.

Beside the notification path, active alerts are linked into **incidents**: an alert joins the open
incident holding an alert on the same GPU -> node -> pod -> model path seen within the topology
window, else opens one (muted alerts join but never open). A GPU or node alert joins an incident
through its pod or model alerts only while the incident is younger than the window (hardware faults
show in serving within moments, so one that appears later is a new fault), and so does an alert
related to the incident's members only as a neighbour on their node. Incident changes are
:class:`IncidentEvent` values (opened, updated, mitigated, resolved); opened and updated go out in
batches, ``incidents.group_wait`` after opening and then at most once per ``incidents.group_interval``.

Timers (resolve timeout, flap end, escalation, incident resolution, group flushes) fire in time
order at their own due time, however coarse the ticks are, so the outcome does not depend on how
often the driver calls :meth:`Engine.tick`.

The code is in layers, one module each (:mod:`pipelines.correlate.state` lists them); this module
holds the public API, cleanup and the serialised state.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from pipelines.correlate.model import (
    Action,
    AggrGroup,
    Alert,
    Incident,
    NotifyEntry,
)
from pipelines.correlate.state import NFLOG_RETENTION_S, STATE_VERSION
from pipelines.correlate.timers import Scheduler
from pipelines.correlate.topology import Topology
from services.alerting.config import RoutingConfig
from services.alerting.errors import IncidentNotFound
from services.alerting.silences import Silences
from services.core.events import Anomaly


class Engine(Scheduler):
    """Alertmanager-style routing, grouping, inhibition and silencing, plus flap detection,
    occurrence thresholds and topology-correlated incidents.

    Args:
        config: the validated routing config.

    Attributes:
        silences: the silence store; add and expire silences through it.
        alerts: alerts by fingerprint.
        groups: aggregation groups by group key.
        incidents: incidents by id (resolved ones are kept for ``correlation.incidents.retention``).
    """

    def ingest(self, anomaly: Anomaly, now: float) -> list[Action]:
        """Take one anomaly at engine time ``now``.

        Timers due up to ``now`` fire first, then the anomaly is applied, then anything it made due
        immediately (an incident, a group whose wait is already over) happens.

        Returns:
            The actions due, in the order they happened.
        """
        out: list[Action] = []
        at = self._advance(now, out)
        self._apply(anomaly, at, out)
        self._advance(at, out)
        self._gc(at)
        return out

    def tick(self, now: float) -> list[Action]:
        """Fire every timer due up to ``now`` (in time order) and return what they produced."""
        out: list[Action] = []
        at = self._advance(now, out)
        self._gc(at)
        return out

    def mitigate(self, incident: str, now: float) -> list[Action]:
        """Mark an incident mitigated (a remediation worked); it resolves when its alerts stay resolved.

        Mitigating an incident that is already mitigated or resolved changes nothing, so a
        redelivered command is harmless.

        Raises:
            IncidentNotFound: the engine holds no incident with this id.
        """
        if incident not in self.incidents:
            raise IncidentNotFound(f"no incident {incident!r} (never opened, or resolved and forgotten)")
        out: list[Action] = []
        at = self._advance(now, out)
        inc = self.incidents.get(incident)
        if inc is not None and inc.state == "open":
            self._announce_pending(inc, at, out)
            inc.state = "mitigated"
            inc.mitigated_at = at
            inc.updated_at = at
            self._dirty_incidents.add(inc.id)
            out.append(self._incident_event(inc, "mitigated", at))
        self._gc(at)
        return out

    def acting(self, incident: str, run_id: str, active: bool, now: float) -> list[Action]:
        """Record that remediation run ``run_id`` began (``active``) or ended acting on an incident.

        While a run acts, the incident does not resolve, even when its alerts go quiet: the quiet may be
        the run's own doing (a deleted pod's probes stop failing) before its verification has passed,
        and a run that then fails must not find its incident closed. It resolves once the run ended and
        its alerts stayed resolved for ``resolve_after``; at most ``hold_while_acting`` after the run
        began. Unknown or resolved incidents, and repeated commands, change nothing.
        """
        out: list[Action] = []
        at = self._advance(now, out)
        inc = self.incidents.get(incident)
        if inc is not None and inc.state != "resolved":
            if active and run_id not in inc.acting:
                inc.acting[run_id] = at
                self._dirty_incidents.add(inc.id)
            elif not active and inc.acting.pop(run_id, None) is not None:
                self._dirty_incidents.add(inc.id)
                self._advance(at, out)  # quiet for resolve_after already: it resolves now
        self._gc(at)
        return out

    def observe_topology(self, labels: Mapping[str, str], now: float) -> None:
        """Learn topology facts from labels seen elsewhere (e.g. vLLM metrics: ``pod`` + ``model_name``)."""
        self.topology.learn(labels, now)

    def _gc(self, at: float) -> None:
        """Forget what can no longer matter: old resolved alerts, incidents, log entries, silences, facts.

        The same rules as a full pass, but driven by expiry heaps: only entries old enough to go are
        looked at (plus "ripe" ones still held by a group or an open incident).
        """
        self._sync()
        corr = self.config.correlation
        keep = max(corr.flap_detection.window, self._max_occurrence_window, corr.topology.window)
        while self._alert_expiry and at - self._alert_expiry[0][0] >= keep:
            _, fp = heapq.heappop(self._alert_expiry)
            self._ripe_alerts.add(fp)
        for fp in sorted(self._ripe_alerts):
            alert = self.alerts.get(fp)
            if alert is None or alert.resolved_at is None or at - alert.resolved_at < keep or alert.status == "firing":
                # Gone, or firing again, or resolved again later: its next resolution pushes a new entry.
                self._ripe_alerts.discard(fp)
            elif self._forgettable(alert, at, keep):
                self._ripe_alerts.discard(fp)
                self._forget_alert(fp)
        retention = corr.incidents.retention
        while self._incident_expiry and at - self._incident_expiry[0][0] >= retention:
            resolved_at, iid = heapq.heappop(self._incident_expiry)
            inc = self.incidents.get(iid)
            if inc is not None and inc.state == "resolved" and inc.resolved_at == resolved_at:
                del self.incidents[iid]
                for fp in inc.members:
                    links = self._member_of.get(fp)
                    if links is not None:
                        links.discard(iid)
                        if not links:
                            del self._member_of[fp]
                self._dirty_incidents.add(iid)
        while self._nflog_expiry and at - self._nflog_expiry[0][0] >= NFLOG_RETENTION_S:
            self._ripe_nflog.add(heapq.heappop(self._nflog_expiry)[1])
        for key in sorted(self._ripe_nflog):
            entry = self.nflog.get(key)
            if entry is None or at - entry.ts < NFLOG_RETENTION_S:
                self._ripe_nflog.discard(key)  # gone, or written again (a newer heap entry exists)
            elif key not in self.groups:
                del self.nflog[key]
                self._ripe_nflog.discard(key)
        self.silences.gc(at)
        self.topology.forget(at, corr.topology.fact_ttl)

    def _forgettable(self, alert: Alert, at: float, keep: float) -> bool:
        if alert.status == "firing" or alert.raw_status == "firing" or alert.flapping:
            return False
        if self._groups_of.get(alert.fingerprint) or self._open_incident_of(alert) is not None:
            return False
        return alert.resolved_at is not None and at - alert.resolved_at >= keep

    def _forget_alert(self, fp: str) -> None:
        del self.alerts[fp]
        self._anchors.pop(fp, None)
        self._alert_expiry_at.pop(fp, None)
        self._touch_alert(fp)  # drops its timers and re-arms its incidents' (they check member presence)
        self._unlinked.discard(fp)

    def to_dict(self) -> dict[str, Any]:
        """The whole state as JSON-safe data (the config is not included; pass it to :meth:`from_dict`)."""
        return {
            "version": STATE_VERSION,
            "clock": self.clock,
            "alerts": [a.to_dict() for _, a in sorted(self.alerts.items())],
            "groups": [g.to_dict() for _, g in sorted(self.groups.items())],
            "nflog": [e.to_dict() for _, e in sorted(self.nflog.items())],
            "incidents": [i.to_dict() for _, i in sorted(self.incidents.items())],
            "silences": self.silences.to_dict(),
            "topology": self.topology.to_dict(),
        }

    @classmethod
    def from_dict(cls, config: RoutingConfig, data: Mapping[str, Any]) -> Engine:
        """Rebuild an engine from :meth:`to_dict` output and the (possibly reloaded) config.

        Routes that no longer exist in the config are dropped from alerts and groups.
        """
        engine = cls(config)
        engine.clock = data.get("clock")
        for raw in data.get("alerts", []):
            alert = Alert.from_dict(raw)
            alert.routes = [r for r in alert.routes if r in engine._routes]
            alert.active_routes = [r for r in alert.active_routes if r in engine._routes]
            engine.alerts[alert.fingerprint] = alert
        for raw in data.get("groups", []):
            group = AggrGroup.from_dict(raw)
            if group.route_id in engine._routes and group.receiver in engine._receivers:
                engine.groups[group.key] = group
        for raw in data.get("nflog", []):
            entry = NotifyEntry.from_dict(raw)
            engine.nflog[entry.group_key] = entry
        for raw in data.get("incidents", []):
            inc = Incident.from_dict(raw)
            engine.incidents[inc.id] = inc
        engine.silences = Silences.from_dict(data.get("silences", []))
        engine.topology = Topology.from_dict(data.get("topology", {}))
        engine._rebuild_indexes()
        return engine

    def _rebuild_indexes(self) -> None:
        """Derive every index from the records (after a restore): all timers and links recomputed."""
        self._init_indexes()
        for fp in self.alerts:
            self._touch_alert(fp)
        for key, group in self.groups.items():
            self._dirty_groups.add(key)
            for fp in group.fingerprints:
                self._groups_of.setdefault(fp, set()).add(key)
        for iid, inc in self.incidents.items():
            self._dirty_incidents.add(iid)
            for fp in inc.members:
                self._joined(inc, fp)
            if inc.state == "resolved" and inc.resolved_at is not None:
                heapq.heappush(self._incident_expiry, (inc.resolved_at, iid))
        # _joined drops members from the waiting set; every alert may be waiting after a restore.
        self._unlinked.update(self.alerts)
        for key, entry in self.nflog.items():
            heapq.heappush(self._nflog_expiry, (entry.ts, key))
