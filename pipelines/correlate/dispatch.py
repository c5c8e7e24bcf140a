"""Dispatch: flushing a route's group through inhibition, time intervals and silences to the notification log."""

from __future__ import annotations

import heapq

from pipelines.correlate.alerts import AlertLifecycle
from pipelines.correlate.model import (
    Action,
    AggrGroup,
    Alert,
    NotifyEntry,
)
from pipelines.correlate.stages import (
    inhibited_by,
    needs_update,
    silenced_by,
)
from services.alerting.notification import Notification
from services.alerting.routes import time_muted


class Dispatch(AlertLifecycle):
    """Groups to notification decisions (:mod:`pipelines.correlate.state` shows the layers)."""

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
