"""Silences: time-boxed matchers that mute alerts, with Alertmanager's states and rules.

A silence is *pending* before ``starts_at``, *active* from ``starts_at`` until ``ends_at`` and
*expired* from ``ends_at`` on. Only active silences mute. Expiring an active silence ends it now;
expiring a pending one ends it before it ever started. A silence needs at least one matcher that
does not match the empty string (Alertmanager's rule). That alone does not stop ``alertname=~".+"``,
which mutes every alert: :func:`matches_every_alert` finds such silences, and the API and CLI refuse
them unless the user says ``all`` (services/store/silences.py).

The store is in memory and serialisable; the correlate agent (pipelines/correlate/agent.py) keeps it
in step with the silences table (services/store/silences.py), which `medic silences` and the API
write.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from services.alerting.errors import SilenceError
from services.alerting.labels import ALERT_LABEL_FIELDS
from services.alerting.matchers import Matcher, matches_all, parse_matcher_list
from services.core.events import Anomaly

SilenceState = Literal["pending", "active", "expired"]
# How long expired silences are kept (Alertmanager's default data retention).
EXPIRED_RETENTION_S = 120 * 3600.0


@dataclass(frozen=True)
class Silence:
    """One silence.

    Attributes:
        id: unique id; derived from the content when empty, so a replay adds the same silence.
        matchers: every one must match an alert for the silence to mute it.
        starts_at: UNIX seconds when it starts muting.
        ends_at: UNIX seconds when it stops muting (exclusive).
        created_by: who asked for it.
        comment: why.
    """

    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str = ""
    comment: str = ""
    id: str = field(default="")

    @classmethod
    def of(
        cls,
        matchers: Iterable[str],
        *,
        starts_at: float,
        ends_at: float,
        created_by: str = "",
        comment: str = "",
        id: str = "",
    ) -> Silence:
        """Build a silence from matcher strings such as ``'node="gpu-node-3"'``.

        Raises:
            SilenceError: a matcher does not parse.
        """
        try:
            parsed = parse_matcher_list(list(matchers))
        except ValueError as exc:
            raise SilenceError(str(exc)) from exc
        return cls(parsed, starts_at, ends_at, created_by, comment, id)

    def state(self, now: float) -> SilenceState:
        """``pending``, ``active`` or ``expired`` at ``now``."""
        if now < self.starts_at:
            return "pending"
        return "active" if now < self.ends_at else "expired"

    def mutes(self, labels: Mapping[str, str], now: float) -> bool:
        """Whether this silence is active at ``now`` and matches ``labels``."""
        return self.state(now) == "active" and matches_all(self.matchers, labels)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (matchers as strings)."""
        return {
            "id": self.id,
            "matchers": [str(m) for m in self.matchers],
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "created_by": self.created_by,
            "comment": self.comment,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Silence:
        """Inverse of :meth:`to_dict`."""
        return cls.of(
            data["matchers"],
            starts_at=float(data["starts_at"]),
            ends_at=float(data["ends_at"]),
            created_by=str(data.get("created_by", "")),
            comment=str(data.get("comment", "")),
            id=str(data["id"]),
        )


def _values_every_alert_may_have() -> dict[str, tuple[str, ...] | None]:
    """For each label every alert carries: its closed set of values, or None when any non-empty string can be."""
    out: dict[str, tuple[str, ...] | None] = {}
    for label, name in ALERT_LABEL_FIELDS.items():
        annotation = Anomaly.model_fields[name].annotation
        closed = typing.get_origin(annotation) is Literal
        out[label] = tuple(str(v) for v in typing.get_args(annotation)) if closed else None
    return out


# Labels every alert carries (services/alerting/labels.py, alert_labels): severity and entity_kind
# take a closed set of values; alertname, entity and detector any non-empty string.
ALWAYS_PRESENT: dict[str, tuple[str, ...] | None] = _values_every_alert_may_have()
# Stand-ins for "any value" of an open label: short and long, letters, digits first, punctuation,
# upper case, non-ASCII. A matcher that accepts all of them accepts any value an alert is likely to
# have; one that rejects one of them does not mute every alert. No newline: label values never hold
# one in practice, and `.*` (which stops at newlines) must count as matching everything.
ANY_VALUE_PROBES: tuple[str, ...] = (
    "GpuXid",
    "gpu_xid",
    "KubePodCrashLooping",
    "vllm:kv_cache_usage_perc",
    "GPU-5f1c2a7e-0d3b-4c1e-9a55-1b2c3d4e5f60",
    "gpu-node-07",
    "llama-70b-0",
    "alertmanager",
    "x",
    "Z",
    "0",
    "9lives",
    "_",
    "-",
    "a b",
    "ünïcødé",
    "zz-no-such-value-" + "q" * 200,
)


def matcher_matches_every_alert(matcher: Matcher) -> bool:
    """Whether one matcher is satisfied by every alert ClusterMedic can produce.

    * a label every alert carries with a closed set of values (``severity``, ``entity_kind``): the
      matcher must accept each of those values;
    * a label every alert carries with any non-empty value (``alertname``, ``entity``, ``detector``):
      ``=`` and ``=~`` must accept every probe of :data:`ANY_VALUE_PROBES`; ``!=`` and ``!~`` name
      what they leave out and mute the endless rest (every alert nobody thought of), so they count
      as matching everything unless they reject every probe (``alertname!~".+"``);
    * any other label may be missing, which reads as ``""``: a matcher that accepts ``""`` mutes
      every alert without the label, and since ClusterMedic cannot know that any alert carries it,
      it counts as matching everything (``x!="nonexistent"``, ``x=""``, ``x=~".*"``).

    The test errs on the safe side: a matcher that truly accepts every value is always caught, and
    one that accepts every probe but not every string (``.{0,300}``) is caught too; ``all`` overrides.
    """
    if matcher.name not in ALWAYS_PRESENT:
        return matcher.matches_value("")
    closed = ALWAYS_PRESENT[matcher.name]
    if closed is not None:
        return all(matcher.matches_value(v) for v in closed)
    if matcher.op in ("!=", "!~"):
        return any(matcher.matches_value(v) for v in ANY_VALUE_PROBES)
    return all(matcher.matches_value(v) for v in ANY_VALUE_PROBES)


def matches_every_alert(matchers: Iterable[Matcher]) -> bool:
    """Whether a silence with these matchers would mute every alert.

    A silence mutes an alert when all its matchers match, so it mutes every alert exactly when each
    matcher does (:func:`matcher_matches_every_alert`). No matchers at all matches everything.
    """
    return all(matcher_matches_every_alert(m) for m in matchers)


def _content_id(silence: Silence) -> str:
    body = json.dumps({k: v for k, v in silence.to_dict().items() if k != "id"}, sort_keys=True)
    return "sil-" + hashlib.sha256(body.encode()).hexdigest()[:16]


class Silences:
    """The in-memory silence store."""

    def __init__(self, silences: Iterable[Silence] = ()) -> None:
        self._by_id: dict[str, Silence] = {}
        for silence in silences:
            self._by_id[silence.id] = silence

    def add(self, silence: Silence) -> Silence:
        """Add a silence, or replace the one with the same id; returns it with its id set.

        Raises:
            SilenceError: no matcher, only matchers that match the empty string, or it ends before it starts.
        """
        if not silence.matchers:
            raise SilenceError("a silence needs at least one matcher")
        if all(m.matches_value("") for m in silence.matchers):
            raise SilenceError(
                "at least one matcher of a silence must not match the empty string"
                ' (to mute every alert on purpose: alertname=~".+" with --all)'
            )
        if silence.ends_at <= silence.starts_at:
            raise SilenceError("a silence must end after it starts")
        if not silence.id:
            silence = replace(silence, id=_content_id(silence))
        self._by_id[silence.id] = silence
        return silence

    def get(self, silence_id: str) -> Silence:
        """The silence with this id.

        Raises:
            SilenceError: no such silence.
        """
        try:
            return self._by_id[silence_id]
        except KeyError:
            raise SilenceError(f"no silence with id {silence_id!r}") from None

    def expire(self, silence_id: str, now: float) -> Silence:
        """End a silence at ``now`` (a pending one ends before it starts); expired ones are left as they are.

        Raises:
            SilenceError: no such silence.
        """
        silence = self.get(silence_id)
        state = silence.state(now)
        if state == "expired":
            return silence
        if state == "pending":
            silence = replace(silence, starts_at=now, ends_at=now)
        else:
            silence = replace(silence, ends_at=now)
        self._by_id[silence_id] = silence
        return silence

    def list(self, now: float, state: SilenceState | None = None) -> list[Silence]:
        """Silences (in a given state at ``now`` when ``state`` is set), oldest start first."""
        found = [s for s in self._by_id.values() if state is None or s.state(now) == state]
        return sorted(found, key=lambda s: (s.starts_at, s.id))

    def matches(self, labels: Mapping[str, str], now: float) -> builtins.list[str]:
        """Ids of the active silences that mute ``labels`` at ``now``, sorted."""
        return sorted(s.id for s in self._by_id.values() if s.mutes(labels, now))

    def gc(self, now: float, retention: float = EXPIRED_RETENTION_S) -> None:
        """Forget silences expired for longer than ``retention`` seconds."""
        self._by_id = {k: s for k, s in self._by_id.items() if now - s.ends_at < retention or now < s.ends_at}

    def to_dict(self) -> builtins.list[dict[str, Any]]:
        """JSON-safe form."""
        return [s.to_dict() for s in sorted(self._by_id.values(), key=lambda s: s.id)]

    @classmethod
    def from_dict(cls, data: Iterable[Mapping[str, Any]]) -> Silences:
        """Inverse of :meth:`to_dict`."""
        return cls(Silence.from_dict(item) for item in data)

    def __len__(self) -> int:
        return len(self._by_id)
