"""The routing tree, built from :class:`RouteConfig` with inheritance resolved, and group keys.

Matching follows Alertmanager: an alert enters at the root; a route matches when all its matchers
do; its children are tried in order and the first matching child ends the search unless that child
sets ``continue``; a route none of whose children match is itself the match. One alert can therefore
land in several routes (through ``continue``), each with its own group and timers.

Children inherit ``receiver``, ``group_by``, ``group_wait``, ``group_interval``, ``repeat_interval``,
``min_occurrences`` and ``occurrence_window`` when they leave them unset. ``mute_time_intervals`` and
``active_time_intervals`` are not inherited, as in Alertmanager: each route lists its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from services.alerting.config import GROUP_BY_ALL, RouteConfig
from services.alerting.matchers import Matcher, format_matchers, matches_all
from services.alerting.timeintervals import NamedTimeInterval

# Alertmanager's defaults for the root route.
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
# ClusterMedic's defaults: an alert is active on its first occurrence.
DEFAULT_MIN_OCCURRENCES = 1
DEFAULT_OCCURRENCE_WINDOW = 600.0


@dataclass(frozen=True)
class Route:
    """A routing-tree node with every inherited value resolved.

    Attributes:
        id: unique, stable id (Alertmanager's route ID: key plus the index among siblings).
        key: Alertmanager's route key: the parents' matchers then this route's, e.g. ``{}/{severity="critical"}``.
        matchers: this route's own matchers.
        receiver: receiver name.
        group_by: labels that form the group, when ``group_by_all`` is false.
        group_by_all: ``group_by: ['...']``: every label forms the group (one group per alert).
        group_wait: seconds a new group waits before its first notification.
        group_interval: seconds between notifications about changes in a group.
        repeat_interval: seconds before an unchanged firing group is notified again.
        mute_time_intervals: named intervals during which this route sends nothing.
        active_time_intervals: named intervals outside which this route sends nothing (empty: always).
        min_occurrences: occurrences needed within ``occurrence_window`` before an alert is active here.
        occurrence_window: seconds over which occurrences are counted.
        continue_: whether matching goes on to the next siblings after this route matched.
        routes: children, in order.
    """

    id: str
    key: str
    matchers: tuple[Matcher, ...]
    receiver: str
    group_by: tuple[str, ...]
    group_by_all: bool
    group_wait: float
    group_interval: float
    repeat_interval: float
    mute_time_intervals: tuple[str, ...]
    active_time_intervals: tuple[str, ...]
    min_occurrences: int
    occurrence_window: float
    continue_: bool
    routes: tuple[Route, ...]

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """Routes this label set lands in, depth first, in tree order (empty if this route does not match)."""
        if not matches_all(self.matchers, labels):
            return []
        found: list[Route] = []
        for child in self.routes:
            hits = child.match(labels)
            found.extend(hits)
            if hits and not child.continue_:
                break
        return found or [self]

    def walk(self) -> Iterator[Route]:
        """This route and every descendant, depth first."""
        yield self
        for child in self.routes:
            yield from child.walk()

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The labels that identify the alert's group on this route (``group_by`` labels it has)."""
        if self.group_by_all:
            return dict(sorted(labels.items()))
        return {name: labels[name] for name in sorted(self.group_by) if name in labels}

    def group_key(self, group_labels: Mapping[str, str]) -> str:
        """``<route id>:<group labels>``, unique per route and group."""
        return f"{self.id}:{format_labels(group_labels)}"


def format_labels(labels: Mapping[str, str]) -> str:
    """``{a="1", b="2"}`` with names sorted, as Alertmanager prints a label set."""
    return format_matchers(Matcher(k, "=", v) for k, v in sorted(labels.items()))


def build_route_tree(config: RouteConfig) -> Route:
    """Resolve inheritance and ids of a validated route tree (the config validated the root)."""
    return _build(config, parent=None, index=0)


def _build(cfg: RouteConfig, parent: Route | None, index: int) -> Route:
    matchers = cfg.all_matchers()
    if parent is None:
        key = "{}"
        route_id = key
        receiver = cfg.receiver or ""
        group_by: tuple[str, ...] = ()
        group_by_all = False
        wait, interval, repeat = DEFAULT_GROUP_WAIT, DEFAULT_GROUP_INTERVAL, DEFAULT_REPEAT_INTERVAL
        min_occ, window = DEFAULT_MIN_OCCURRENCES, DEFAULT_OCCURRENCE_WINDOW
    else:
        key = f"{parent.key}/{format_matchers(matchers)}"
        route_id = f"{key}/{index}"
        receiver = parent.receiver
        group_by, group_by_all = parent.group_by, parent.group_by_all
        wait, interval, repeat = parent.group_wait, parent.group_interval, parent.repeat_interval
        min_occ, window = parent.min_occurrences, parent.occurrence_window
    if cfg.group_by is not None:
        group_by_all = cfg.group_by == (GROUP_BY_ALL,)
        group_by = () if group_by_all else cfg.group_by
    node = Route(
        id=route_id,
        key=key,
        matchers=matchers,
        receiver=cfg.receiver or receiver,
        group_by=group_by,
        group_by_all=group_by_all,
        group_wait=wait if cfg.group_wait is None else cfg.group_wait,
        group_interval=interval if cfg.group_interval is None else cfg.group_interval,
        repeat_interval=repeat if cfg.repeat_interval is None else cfg.repeat_interval,
        mute_time_intervals=cfg.mute_time_intervals,
        active_time_intervals=cfg.active_time_intervals,
        min_occurrences=min_occ if cfg.min_occurrences is None else cfg.min_occurrences,
        occurrence_window=window if cfg.occurrence_window is None else cfg.occurrence_window,
        continue_=cfg.continue_,
        routes=(),
    )
    children = tuple(_build(child, node, i) for i, child in enumerate(cfg.routes))
    return replace(node, routes=children)


def time_muted(route: Route, intervals: Mapping[str, NamedTimeInterval], now: float) -> bool:
    """Whether a route sends nothing at ``now``: inside a mute interval, or outside all its active ones."""
    if any(intervals[name].contains(now) for name in route.mute_time_intervals):
        return True
    return bool(route.active_time_intervals) and not any(
        intervals[name].contains(now) for name in route.active_time_intervals
    )
