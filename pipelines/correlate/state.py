"""The correlation engine's records and derived indexes, and the timer table every layer marks.

The engine is one object in layers, each module one idea, each layer calling only the ones below it:

================================  ==============================================================
``state.EngineState``             records, derived indexes, the timer table (``_set_timer``)
``incidents.IncidentLinking``     incidents: linking alerts on the topology path, announcing
``alerts.AlertLifecycle``         alerts: occurrences, resolve timeout, flap detection, routes
``dispatch.Dispatch``             groups, inhibition, silences, the notification log
``timers.Scheduler``              firing every due timer in time order (``_advance``)
``engine.Engine``                 the public API, cleanup, and the serialised state
================================  ==============================================================
"""

from __future__ import annotations

import heapq

from pipelines.correlate.model import (
    AggrGroup,
    Alert,
    Incident,
    NotifyEntry,
)
from pipelines.correlate.stages import (
    InhibitRule,
)
from pipelines.correlate.topology import Topology
from services.alerting.config import RoutingConfig
from services.alerting.routes import Route, build_route_tree
from services.alerting.silences import Silences
from services.core.events import SEVERITY_RANK

Anchor = tuple[str, frozenset[str]]
HARDWARE_LEVELS = frozenset({"gpu", "node"})
"""Topology levels of hardware faults; pods and models are where their symptoms show."""

STATE_VERSION = 1
# How long a notification log entry outlives its group (Alertmanager's default data retention).
NFLOG_RETENTION_S = 120 * 3600.0
SEVERITY_BY_RANK = {rank: name for name, rank in SEVERITY_RANK.items()}

# Timer kinds, in the order they run when due at the same instant: alert state first, so incident
# checks and flushes see it; announcements last, so a batch holds every change of its instant.
TIMEOUT, FLAP_END, ESCALATE, INCIDENT_RESOLVE, FLUSH, ANNOUNCE = range(6)


class EngineState:
    """What the engine holds (see :class:`~pipelines.correlate.engine.Engine` for the attributes)."""

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
