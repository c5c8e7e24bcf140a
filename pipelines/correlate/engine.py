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
    incident_id,
)
from pipelines.correlate.stages import (
    InhibitRule,
    group_of,
    inhibited_by,
    needs_update,
    route_alert,
    silenced_by,
)
from pipelines.correlate.topology import LEVELS, Topology, anchor, tokens
from services.alerting.config import RoutingConfig
from services.alerting.errors import IncidentNotFound
from services.alerting.labels import alert_fingerprint, alert_labels
from services.alerting.notification import Notification
from services.alerting.routes import Route, build_route_tree, time_muted
from services.alerting.silences import Silences
from services.core.events import SEVERITY_RANK, Anomaly, IncidentEvent

Anchor = tuple[str, frozenset[str]]
HARDWARE_LEVELS = frozenset({"gpu", "node"})
"""Topology levels of hardware faults; pods and models are where their symptoms show."""

STATE_VERSION = 1
# How long a notification log entry outlives its group (Alertmanager's default data retention).
NFLOG_RETENTION_S = 120 * 3600.0
_SEVERITY_BY_RANK = {rank: name for name, rank in SEVERITY_RANK.items()}

# Timer kinds, in the order they run when due at the same instant: alert state first, so incident
# checks and flushes see it; announcements last, so a batch holds every change of its instant.
_TIMEOUT, _FLAP_END, _ESCALATE, _INCIDENT_RESOLVE, _FLUSH, _ANNOUNCE = range(6)


class Engine:
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

    def __init__(self, config: RoutingConfig) -> None:
        self.config = config
        self.root: Route = build_route_tree(config.route)
        self._routes: dict[str, Route] = {route.id: route for route in self.root.walk()}
        self._intervals = config.named_intervals()
        self._rules = [InhibitRule.of(rule) for rule in config.inhibit_rules]
        self._receivers = {receiver.name: receiver for receiver in config.receivers}
        self._max_occurrence_window = max(route.occurrence_window for route in self._routes.values())
        self.silences = Silences()
        self.topology = Topology()
        self.alerts: dict[str, Alert] = {}
        self.groups: dict[str, AggrGroup] = {}
        self.nflog: dict[str, NotifyEntry] = {}
        self.incidents: dict[str, Incident] = {}
        self.clock: float | None = None
        self._init_indexes()

    def _init_indexes(self) -> None:
        """Derived indexes: never serialised, rebuilt by :meth:`from_dict`, so a restored engine behaves identically.

        Without them every anomaly scanned every alert, group and incident (next timer, alerts to
        link, related incidents, cleanup), which made the engine quadratic in the number of groups.
        Each index is a superset or a lazily invalidated view: whatever it yields is re-checked
        against the records, so a stale entry costs a skip, never a different outcome.
        """
        # Timers: a heap of (due, kind, key) plus the current due of each (kind, key). A heap entry
        # whose due differs from the current one is stale and skipped. Records that changed are
        # marked dirty and their timers recomputed (by the original rules) before the next pick.
        self._timers: list[tuple[float, int, str]] = []
        self._timer_due: dict[tuple[int, str], float] = {}
        self._dirty_alerts: set[str] = set()
        self._dirty_incidents: set[str] = set()
        self._dirty_groups: set[str] = set()
        # Alerts whose flap end is "now" (the clock): recomputed at every pick, as the clock moves.
        self._volatile: set[str] = set()
        # Alerts that may be waiting for an incident (firing, active, no open incident): every alert
        # that changed, plus members of incidents that resolved; confirmed in _attach.
        self._unlinked: set[str] = set()
        # Anchors never change for an alert (labels are fixed at creation); cached per fingerprint.
        self._anchors: dict[str, Anchor] = {}
        # Open incidents by the anchor tokens of their members, for _related_incident.
        self._open_by_token: dict[str, set[str]] = {}
        self._incident_tokens: dict[str, set[str]] = {}
        # Reverse links: the incidents listing an alert, the groups holding it.
        self._member_of: dict[str, set[str]] = {}
        self._groups_of: dict[str, set[str]] = {}
        # Cleanup: expiry heaps (time, key), so _gc looks only at what may have expired. "Ripe"
        # entries have expired but are still held (by a group or an open incident) and are
        # re-checked on each pass until released.
        self._alert_expiry: list[tuple[float, str]] = []
        self._alert_expiry_at: dict[str, float] = {}
        self._ripe_alerts: set[str] = set()
        self._incident_expiry: list[tuple[float, str]] = []
        self._nflog_expiry: list[tuple[float, str]] = []
        self._ripe_nflog: set[str] = set()

    # ------------------------------------------------------------------------------ public API

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

    def muted(self, alert: Alert, now: float) -> bool:
        """Whether an alert is silenced or inhibited at ``now``."""
        if silenced_by(alert.labels, self.silences, now):
            return True
        if not self._rules:  # nothing can inhibit: skip building the sources (a pass over every alert)
            return False
        return inhibited_by(alert, self._rules, self._inhibition_sources()) is not None

    # ------------------------------------------------------------------------------- alerts

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

    def _inhibition_sources(self) -> list[Alert]:
        return [a for _, a in sorted(self.alerts.items()) if a.status == "firing" and a.active_routes]

    # -------------------------------------------------------------------------------- timers

    # Each record's timers are due by the same rules a full scan used to apply; they are only
    # recomputed for records marked dirty since the last pick (see _init_indexes).

    def _touch_alert(self, fp: str) -> None:
        """An alert changed: recompute its timers, its incidents' timers, and whether it waits for an incident."""
        self._dirty_alerts.add(fp)
        self._unlinked.add(fp)
        self._dirty_incidents.update(self._member_of.get(fp, ()))

    def _set_timer(self, kind: int, key: str, due: float | None) -> None:
        slot = (kind, key)
        if due is None:
            self._timer_due.pop(slot, None)
        elif self._timer_due.get(slot) != due:
            self._timer_due[slot] = due
            heapq.heappush(self._timers, (due, kind, key))

    def _sync(self) -> None:
        """Recompute the timers (and expiry entries) of everything marked dirty."""
        self._dirty_alerts |= self._volatile
        flap_low = self.config.correlation.flap_detection.low
        for fp in self._dirty_alerts:
            alert = self.alerts.get(fp)
            if alert is None:
                self._set_timer(_TIMEOUT, fp, None)
                self._set_timer(_FLAP_END, fp, None)
                self._volatile.discard(fp)
                continue
            self._set_timer(_TIMEOUT, fp, alert.timeout_at if alert.raw_status == "firing" else None)
            self._set_timer(_FLAP_END, fp, self._flap_end(alert))
            if alert.flapping and len(alert.changes) <= flap_low:
                self._volatile.add(fp)
            else:
                self._volatile.discard(fp)
            if alert.resolved_at is not None and self._alert_expiry_at.get(fp) != alert.resolved_at:
                self._alert_expiry_at[fp] = alert.resolved_at
                heapq.heappush(self._alert_expiry, (alert.resolved_at, fp))
        self._dirty_alerts.clear()
        escalation = self.config.correlation.incidents.escalation
        resolve_after = self.config.correlation.incidents.resolve_after
        hold = self.config.correlation.incidents.hold_while_acting
        for iid in self._dirty_incidents:
            inc = self.incidents.get(iid)
            escalate = resolve = announce = None
            if inc is not None and inc.state != "resolved":
                members = [self.alerts[fp] for fp in inc.members if fp in self.alerts]
                if escalation.after is not None and inc.severity != "critical" and not inc.escalation:
                    escalate = inc.opened_at + escalation.after
                if members and all(m.status == "resolved" for m in members):
                    resolve = max(m.resolved_at or 0.0 for m in members) + resolve_after
                    if inc.acting and hold > 0:
                        # a run still acting holds it open, at most hold_while_acting from the first
                        resolve = max(resolve, min(inc.acting.values()) + hold)
                if inc.pending:
                    announce = inc.announce_at
            self._set_timer(_ESCALATE, iid, escalate)
            self._set_timer(_INCIDENT_RESOLVE, iid, resolve)
            self._set_timer(_ANNOUNCE, iid, announce)
        self._dirty_incidents.clear()
        for key in self._dirty_groups:
            group = self.groups.get(key)
            self._set_timer(_FLUSH, key, group.next_flush if group is not None else None)
        self._dirty_groups.clear()

    def _next_timer(self, limit: float) -> tuple[float, int, str] | None:
        """Take the earliest timer due by ``limit`` (ties: kind, then key), or ``None``.

        The timer taken is consumed; firing it marks its record dirty, which re-arms whatever
        timer the record still has.
        """
        self._sync()
        while self._timers:
            due, kind, key = self._timers[0]
            if self._timer_due.get((kind, key)) != due:
                heapq.heappop(self._timers)  # stale: the record changed since
                continue
            if due > limit:
                return None
            heapq.heappop(self._timers)
            del self._timer_due[(kind, key)]
            return due, kind, key
        return None

    def _advance(self, now: float, out: list[Action]) -> float:
        """Fire timers due up to ``now`` in order, each at its own due time; return the engine time."""
        target = now if self.clock is None else max(now, self.clock)
        if self.clock is None:
            self.clock = target
        while (timer := self._next_timer(target)) is not None:
            due, kind, key = timer
            at = max(due, self.clock)
            self.clock = at
            if kind in (_TIMEOUT, _FLAP_END):
                self._touch_alert(key)
            elif kind in (_ESCALATE, _INCIDENT_RESOLVE, _ANNOUNCE):
                self._dirty_incidents.add(key)
            else:
                self._dirty_groups.add(key)
            if kind == _TIMEOUT:
                alert = self.alerts[key]
                before = alert.status
                self._observe(alert, "resolved", alert.timeout_at or at, at)
                self._status_changed(alert, before, at, out)
            elif kind == _FLAP_END:
                alert = self.alerts[key]
                before = alert.status
                self._refresh(alert, at)
                self._status_changed(alert, before, at, out)
            elif kind == _ESCALATE:
                inc = self.incidents[key]
                inc.escalation = inc.escalation or "checked"
                if self._rate(inc, at):
                    self._changed(inc, at, out)
            elif kind == _INCIDENT_RESOLVE:
                inc = self.incidents[key]
                self._announce_pending(inc, at, out)
                inc.state = "resolved"
                inc.resolved_at = at
                inc.updated_at = at
                inc.acting.clear()  # a hold that outlived hold_while_acting
                self._closed(inc)
                out.append(self._incident_event(inc, "resolved", at))
            elif kind == _ANNOUNCE:
                self._announce_pending(self.incidents[key], at, out)
            else:
                self._flush(self.groups[key], at, out)
            self._attach(at, out)
        self.clock = target
        self._attach(target, out)
        return target

    # ---------------------------------------------------------------------- group -> notify

    def _flush(self, group: AggrGroup, at: float, out: list[Action]) -> None:
        """Flush one group: inhibit -> time intervals -> silence -> notify decision; drop resolved alerts."""
        route = self._routes.get(group.route_id)
        if route is None:  # the config changed under a restored state
            for fp in group.fingerprints:
                self._ungroup(fp, group.key)
            del self.groups[group.key]
            return
        members = [self.alerts[fp] for fp in group.fingerprints if fp in self.alerts]
        sources = self._inhibition_sources() if self._rules else []
        visible = [a for a in members if inhibited_by(a, self._rules, sources) is None]
        muted_now = time_muted(route, self._intervals, at)
        visible = [a for a in visible if not silenced_by(a.labels, self.silences, at)]
        if visible and not muted_now:
            receiver = self._receivers[group.receiver]
            firing = sorted(a.fingerprint for a in visible if a.status == "firing")
            resolved = sorted(a.fingerprint for a in visible if a.status == "resolved")
            entry = self.nflog.get(group.key)
            reason = needs_update(
                entry,
                firing,
                resolved,
                send_resolved=receiver.send_resolved,
                repeat_interval=route.repeat_interval,
                now=at,
            )
            if reason is not None:
                self.nflog[group.key] = NotifyEntry(group.key, firing, resolved, at)
                heapq.heappush(self._nflog_expiry, (at, group.key))
                send = [a for a in visible if a.status == "firing" or receiver.send_resolved]
                if send:
                    out.append(self._notification(group, reason, send, at))
        kept = [fp for fp in group.fingerprints if fp in self.alerts and self.alerts[fp].status == "firing"]
        for fp in set(group.fingerprints) - set(kept):
            self._ungroup(fp, group.key)
        group.fingerprints = kept
        if not group.fingerprints:
            del self.groups[group.key]
            return
        group.has_flushed = True
        group.next_flush = at + route.group_interval

    def _ungroup(self, fp: str, key: str) -> None:
        keys = self._groups_of.get(fp)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._groups_of[fp]

    def _notification(self, group: AggrGroup, reason: str, alerts: list[Alert], at: float) -> Notification:
        alerts = sorted(alerts, key=lambda a: (a.status != "firing", a.starts_at, a.fingerprint))
        linked = {a.incident_id for a in alerts if a.incident_id}
        incidents = sorted(
            linked,
            key=lambda iid: (self.incidents[iid].opened_at if iid in self.incidents else float("inf"), iid),
        )
        return Notification(
            receiver=group.receiver,
            group_key=group.key,
            group_labels=group.labels,
            incident_id=incidents[0] if incidents else "",
            incident_ids=tuple(incidents),
            status="firing" if any(a.status == "firing" for a in alerts) else "resolved",
            reason=reason,  # type: ignore[arg-type]
            alerts=tuple(a.ref() for a in alerts),
            ts=at,
        )

    # ----------------------------------------------------------------------------- incidents

    def _open_incident_of(self, alert: Alert) -> Incident | None:
        inc = self.incidents.get(alert.incident_id or "")
        return inc if inc is not None and inc.state != "resolved" else None

    def _attach(self, at: float, out: list[Action]) -> None:
        """Link every active firing alert that has no open incident: join a related one, or open one."""
        # Only alerts that changed (or lost their incident) since the last pass can be waiting.
        waiting = []
        for fp in list(self._unlinked):
            a = self.alerts.get(fp)
            if a is not None and a.status == "firing" and a.active_routes and self._open_incident_of(a) is None:
                waiting.append(a)
            else:
                self._unlinked.discard(fp)
        for alert in sorted(waiting, key=lambda a: (a.activated_at or 0.0, a.fingerprint)):
            inc = self._related_incident(alert, at)
            if inc is not None:
                inc.members.append(alert.fingerprint)
                alert.incident_id = inc.id
                self._joined(inc, alert.fingerprint)
                if alert.status == "firing" and inc.state == "mitigated":
                    inc.state = "open"
                self._rate(inc, at)
                self._changed(inc, at, out)
            elif not self.muted(alert, at):
                route = self._routes[alert.active_routes[0]]
                key, _ = group_of(route, alert.labels)
                inc = Incident(
                    id=incident_id(key, alert.fingerprint, at),
                    group_key=key,
                    opened_at=at,
                    severity=alert.severity,
                    members=[alert.fingerprint],
                    updated_at=at,
                    announced=False,
                    announce_at=at + self.config.correlation.incidents.group_wait,
                )
                self.incidents[inc.id] = inc
                alert.incident_id = inc.id
                self._joined(inc, alert.fingerprint)
                self._rate(inc, at)
                self._changed(inc, at, out)

    def _changed(self, inc: Incident, at: float, out: list[Action]) -> None:
        """An open incident changed: announce it now, or when its batching allows.

        As Alertmanager batches a group's notifications, a new incident is announced (``opened``)
        ``incidents.group_wait`` after it opened, holding every alert that joined by then, and later
        changes at most once per ``incidents.group_interval``. Each announcement is diagnosed, so a
        diagnosis sees the alerts of one fault together instead of its first symptom alone, and the
        instants it happens at depend on event time only (the same at any simulation speed).
        """
        inc.updated_at = at
        inc.pending = True
        self._dirty_incidents.add(inc.id)
        if inc.announce_at is None or inc.announce_at <= at:
            self._announce_pending(inc, at, out)

    def _announce_pending(self, inc: Incident, at: float, out: list[Action]) -> None:
        """Emit the incident's waiting change (``opened`` the first time, then ``updated``), if any."""
        if not inc.pending:
            return
        kind = "updated" if inc.announced else "opened"
        inc.announced, inc.pending = True, False
        inc.announce_at = at + self.config.correlation.incidents.group_interval
        self._dirty_incidents.add(inc.id)
        out.append(self._incident_event(inc, kind, at))

    def _anchor_of(self, alert: Alert) -> Anchor:
        found = self._anchors.get(alert.fingerprint)
        if found is None:
            found = self._anchors[alert.fingerprint] = anchor(alert.labels, alert.entity, alert.entity_kind)
        return found

    def _joined(self, inc: Incident, fp: str) -> None:
        """Index a new member of an open incident (by its anchor tokens), and re-arm the incident's timers."""
        self._unlinked.discard(fp)
        self._member_of.setdefault(fp, set()).add(inc.id)
        self._dirty_incidents.add(inc.id)
        alert = self.alerts.get(fp)
        if alert is None or inc.state == "resolved":
            return
        mine = self._incident_tokens.setdefault(inc.id, set())
        for token in self._anchor_of(alert)[1]:
            mine.add(token)
            self._open_by_token.setdefault(token, set()).add(inc.id)

    def _closed(self, inc: Incident) -> None:
        """An incident resolved: drop it from the token index; its members may now wait for a new one."""
        for token in self._incident_tokens.pop(inc.id, ()):
            ids = self._open_by_token.get(token)
            if ids is not None:
                ids.discard(inc.id)
                if not ids:
                    del self._open_by_token[token]
        self._unlinked.update(inc.members)
        if inc.resolved_at is not None:
            heapq.heappush(self._incident_expiry, (inc.resolved_at, inc.id))

    def _related_incident(self, alert: Alert, at: float) -> Incident | None:
        """The oldest open incident with a member on the alert's topology path, seen within the window."""
        topo = self.config.correlation.topology
        mine = self._anchor_of(alert)
        # Only incidents holding a member whose anchor shares a token with what the alert can relate
        # to are candidates (a superset); each is then checked exactly as before, oldest first.
        near = self.topology.neighbourhood(mine) if topo.enabled else set(mine[1])
        ids: set[str] = set()
        for token in near:
            ids |= self._open_by_token.get(token, set())
        candidates = sorted(
            (inc for inc in (self.incidents.get(iid) for iid in ids) if inc is not None and inc.state != "resolved"),
            key=lambda i: (i.opened_at, i.id),
        )
        for inc in candidates:
            for fp in inc.members:
                member = self.alerts.get(fp)
                if member is None or member.fingerprint == alert.fingerprint:
                    continue
                recent = member.status == "firing" or (
                    member.resolved_at is not None and member.resolved_at >= at - topo.window
                )
                if not recent:
                    continue
                theirs = self._anchor_of(member)
                young = at - inc.opened_at <= topo.window
                if mine[0] in HARDWARE_LEVELS and theirs[0] not in HARDWARE_LEVELS and not young:
                    # A GPU or node fault causes serving symptoms within moments: one found longer than
                    # the window after them is a new fault beside them (ECC errors on the node of a bad
                    # rollout's replicas), not their cause.
                    continue
                # With topology off, only alerts about the very same entity share an incident. Two
                # neighbours (GPUs or pods on one node, not on one chain) share one only while it is
                # young: a node-wide cause hits its tenants together, not a quarter of an hour apart.
                # So do replicas of two revisions of one model: a rollout a quarter of an hour into
                # a burst that saturated the old revision's replica is a new fault.
                if theirs == mine or (topo.enabled and self.topology.related(mine, theirs, neighbours=young)):
                    return inc
        return None

    def _rate(self, inc: Incident, at: float) -> bool:
        """Recompute an incident's severity; return whether it changed.

        Severity is the highest of the firing, unmuted members and never goes down while the
        incident lives. It escalates to critical when ``warning_members`` such members are warning
        or worse, or when the incident has had one for ``after`` seconds.
        """
        escalation = self.config.correlation.incidents.escalation
        counted = [
            m
            for m in (self.alerts.get(fp) for fp in inc.members)
            if m is not None and m.status == "firing" and not self.muted(m, at)
        ]
        rank = SEVERITY_RANK.get(inc.severity, 0)
        for member in counted:
            rank = max(rank, SEVERITY_RANK.get(member.severity, 0))
        critical = SEVERITY_RANK["critical"]
        if rank < critical and counted:
            warnings = sum(1 for m in counted if SEVERITY_RANK.get(m.severity, 0) >= SEVERITY_RANK["warning"])
            if escalation.warning_members is not None and warnings >= escalation.warning_members:
                rank, inc.escalation = critical, "warning_members"
            elif escalation.after is not None and at >= inc.opened_at + escalation.after:
                rank, inc.escalation = critical, "duration"
        severity = _SEVERITY_BY_RANK[rank]
        self._dirty_incidents.add(inc.id)
        changed = severity != inc.severity
        inc.severity = severity
        return changed

    def _incident_event(self, inc: Incident, kind: str, at: float) -> IncidentEvent:
        members = [self.alerts[fp] for fp in inc.members if fp in self.alerts]
        first = members[0] if members else None
        title = f"{first.signal} on {first.entity}" if first else inc.id
        if len(members) > 1:
            title += f" (+{len(members) - 1} related)"
        found: dict[str, set[str]] = {level: set() for level in LEVELS}
        for member in members:
            for level, names in tokens(member.labels, member.entity, member.entity_kind).items():
                found[level] |= {name.partition(":")[2] for name in names}
        labels = {level: ",".join(sorted(names)) for level, names in found.items() if names}
        labels["state"] = inc.state
        if inc.escalation and inc.escalation != "checked":
            labels["escalation"] = inc.escalation
        return IncidentEvent(
            incident_id=inc.id,
            kind=kind,  # type: ignore[arg-type]
            severity=inc.severity,  # type: ignore[arg-type]
            title=title,
            group_key=inc.group_key,
            labels=labels,
            alerts=tuple(m.ref() for m in members),
            opened_at=inc.opened_at,
            ts=at,
        )

    # ------------------------------------------------------------------------------- cleanup

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

    # --------------------------------------------------------------------------------- state

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
