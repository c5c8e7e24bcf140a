"""Timers: every due timer fires in time order at its own due time, however coarse the ticks are."""

from __future__ import annotations

import heapq

from pipelines.correlate.dispatch import Dispatch
from pipelines.correlate.model import (
    Action,
)
from pipelines.correlate.state import ANNOUNCE, ESCALATE, FLAP_END, FLUSH, INCIDENT_RESOLVE, TIMEOUT


class Scheduler(Dispatch):
    """The timer loop (:mod:`pipelines.correlate.state` shows the layers)."""

    def _sync(self) -> None:
        """Recompute the timers (and expiry entries) of everything marked dirty."""
        self._dirty_alerts |= self._volatile
        flap_low = self.config.correlation.flap_detection.low
        for fp in self._dirty_alerts:
            alert = self.alerts.get(fp)
            if alert is None:
                self._set_timer(TIMEOUT, fp, None)
                self._set_timer(FLAP_END, fp, None)
                self._volatile.discard(fp)
                continue
            self._set_timer(TIMEOUT, fp, alert.timeout_at if alert.raw_status == "firing" else None)
            self._set_timer(FLAP_END, fp, self._flap_end(alert))
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
            self._set_timer(ESCALATE, iid, escalate)
            self._set_timer(INCIDENT_RESOLVE, iid, resolve)
            self._set_timer(ANNOUNCE, iid, announce)
        self._dirty_incidents.clear()
        for key in self._dirty_groups:
            group = self.groups.get(key)
            self._set_timer(FLUSH, key, group.next_flush if group is not None else None)
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
            if kind in (TIMEOUT, FLAP_END):
                self._touch_alert(key)
            elif kind in (ESCALATE, INCIDENT_RESOLVE, ANNOUNCE):
                self._dirty_incidents.add(key)
            else:
                self._dirty_groups.add(key)
            if kind == TIMEOUT:
                alert = self.alerts[key]
                before = alert.status
                self._observe(alert, "resolved", alert.timeout_at or at, at)
                self._status_changed(alert, before, at, out)
            elif kind == FLAP_END:
                alert = self.alerts[key]
                before = alert.status
                self._refresh(alert, at)
                self._status_changed(alert, before, at, out)
            elif kind == ESCALATE:
                inc = self.incidents[key]
                inc.escalation = inc.escalation or "checked"
                if self._rate(inc, at):
                    self._changed(inc, at, out)
            elif kind == INCIDENT_RESOLVE:
                inc = self.incidents[key]
                self._announce_pending(inc, at, out)
                inc.state = "resolved"
                inc.resolved_at = at
                inc.updated_at = at
                inc.acting.clear()  # a hold that outlived hold_while_acting
                self._closed(inc)
                out.append(self._incident_event(inc, "resolved", at))
            elif kind == ANNOUNCE:
                self._announce_pending(self.incidents[key], at, out)
            else:
                self._flush(self.groups[key], at, out)
            self._attach(at, out)
        self.clock = target
        self._attach(target, out)
        return target
