"""The pipeline's stages as named, pure functions: route -> group -> inhibit -> silence -> notify.

The engine calls them in that order when a group is flushed (routing and grouping run when an alert
becomes active). Each stage takes what it needs and returns a decision; none keeps state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipelines.correlate.model import Alert, NotifyEntry
from services.alerting.config import InhibitRuleConfig
from services.alerting.matchers import Matcher, matches_all
from services.alerting.notification import NotifyReason
from services.alerting.routes import Route
from services.alerting.silences import Silences


def route_alert(root: Route, labels: Mapping[str, str]) -> list[Route]:
    """Route stage: the routes an alert's labels land in (at least the root)."""
    return root.match(labels)


def group_of(route: Route, labels: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """Group stage: the group key and group labels of an alert on a route."""
    group_labels = route.group_labels(labels)
    return route.group_key(group_labels), group_labels


@dataclass(frozen=True)
class InhibitRule:
    """A compiled inhibit rule."""

    sources: tuple[Matcher, ...]
    targets: tuple[Matcher, ...]
    equal: tuple[str, ...]

    @classmethod
    def of(cls, config: InhibitRuleConfig) -> InhibitRule:
        """Compile a rule from its config (legacy ``*_match`` maps included)."""
        return cls(config.sources(), config.targets(), config.equal)


def inhibited_by(target: Alert, rules: Sequence[InhibitRule], sources: Iterable[Alert]) -> str | None:
    """Inhibit stage: the fingerprint of a firing alert that mutes ``target``, or ``None``.

    A source mutes a target when the target matches the rule's target matchers, the source matches
    its source matchers, and both have equal values (a missing label counts as ``""``) for every
    ``equal`` label. When the target also matches the source matchers, sources that also match the
    target matchers are skipped, so two alerts that both match both sides do not mute each other
    (and an alert never mutes itself).

    Args:
        target: the alert that may be muted.
        rules: compiled inhibit rules.
        sources: candidate sources: alerts that are active and firing (muted ones included, as in
            Alertmanager).
    """
    pool = list(sources)
    for rule in rules:
        if not matches_all(rule.targets, target.labels):
            continue
        two_sided = matches_all(rule.sources, target.labels)
        for source in pool:
            if source.fingerprint == target.fingerprint or not matches_all(rule.sources, source.labels):
                continue
            if two_sided and matches_all(rule.targets, source.labels):
                continue
            if all(source.labels.get(name, "") == target.labels.get(name, "") for name in rule.equal):
                return source.fingerprint
    return None


def silenced_by(labels: Mapping[str, str], silences: Silences, now: float) -> list[str]:
    """Silence stage: ids of the active silences that mute these labels."""
    return silences.matches(labels, now)


def needs_update(
    entry: NotifyEntry | None,
    firing: Sequence[str],
    resolved: Sequence[str],
    *,
    send_resolved: bool,
    repeat_interval: float,
    now: float,
) -> NotifyReason | None:
    """Notify stage (dedup): why this group must be notified now, or ``None``.

    Alertmanager's rules: nothing notified yet -> notify if anything fires; a firing alert that was
    not in the last notification -> notify; nothing fires any more -> notify once that all is
    resolved (if something firing was notified); a newly resolved alert -> notify if the receiver
    wants resolved notifications; otherwise only when ``repeat_interval`` has passed since the last
    notification. The repeat is sent at the first flush at or after that time.

    Args:
        entry: what was last notified for this group, if anything.
        firing: fingerprints firing now (muted ones already removed).
        resolved: fingerprints resolved now (muted ones already removed).
        send_resolved: whether the receiver wants resolved notifications.
        repeat_interval: seconds before an unchanged firing group is notified again.
        now: engine time.
    """
    if entry is None or not entry.firing:
        return "first" if firing else None
    if not set(firing) <= set(entry.firing):
        return "update"
    if not firing:
        return "resolved"
    if send_resolved and not set(resolved) <= set(entry.resolved):
        return "update"
    if now >= entry.ts + repeat_interval:
        return "repeat"
    return None
