"""Incidents: alerts linked on one GPU -> node -> pod -> model path, and their announcements.

An active alert joins the open incident holding an alert on its topology path seen within the
window, else opens one (a muted alert joins but never opens); changes go out in batches
(``incidents.group_wait`` / ``group_interval``), severity escalates by member count or age.
"""

from __future__ import annotations

import heapq

from pipelines.correlate.model import (
    Action,
    Alert,
    Incident,
    incident_id,
)
from pipelines.correlate.stages import (
    group_of,
    inhibited_by,
    silenced_by,
)
from pipelines.correlate.state import HARDWARE_LEVELS, SEVERITY_BY_RANK, Anchor, EngineState
from pipelines.correlate.topology import LEVELS, anchor, tokens
from services.core.events import SEVERITY_RANK, IncidentEvent


class IncidentLinking(EngineState):
    """Incidents over the alerts (:mod:`pipelines.correlate.state` shows the layers)."""

    def muted(self, alert: Alert, now: float) -> bool:
        """Whether an alert is silenced or inhibited at ``now``."""
        if silenced_by(alert.labels, self.silences, now):
            return True
        if not self._rules:  # nothing can inhibit: skip building the sources (a pass over every alert)
            return False
        return inhibited_by(alert, self._rules, self._inhibition_sources()) is not None

    def _inhibition_sources(self) -> list[Alert]:
        return [a for _, a in sorted(self.alerts.items()) if a.status == "firing" and a.active_routes]

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
        severity = SEVERITY_BY_RANK[rank]
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
