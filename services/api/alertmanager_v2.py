"""Alertmanager's API v2 over ClusterMedic's stores, so that ``amtool`` and Grafana's Alertmanager data
source work against ClusterMedic (issue 18, item 2; docs/api.md).

The request and response shapes are those of Alertmanager's OpenAPI v2 spec (``postableSilence``,
``gettableSilence``, ``gettableAlert``, ``alertGroup``, ``alertmanagerStatus``); the data is ours:

=====================================  ========  ==================================================
``GET /api/v2/silences``               viewer    every silence (``filter``: matchers on its ``=`` matchers)
``POST /api/v2/silences``              operator  create one (or replace ``id``); answers ``{"silenceID"}``;
                                                 one that mutes every alert needs admin
``GET /api/v2/silence/{id}``           viewer    one silence
``DELETE /api/v2/silence/{id}``        operator  expire it now
``GET /api/v2/alerts``                 viewer    firing alerts (``active``, ``silenced``, ``inhibited``,
                                                 ``unprocessed``, ``filter``, ``receiver``)
``GET /api/v2/alerts/groups``          viewer    the same alerts grouped as the routing tree groups them
``GET /api/v2/status``                 viewer    version, uptime, the routing config (secrets masked)
=====================================  ========  ==================================================

Where ClusterMedic differs, and why:

* The author of a silence is the caller's token name; ``createdBy`` is recorded in the audit row only.
* An alert is the latest ``alerts`` row of its fingerprint (an alert linked to several incidents has a
  row for each). Only firing alerts are listed, as Alertmanager lists only those not yet ended.
* An alert's receivers, its inhibition and its groups are computed from routing.yaml at read time; its
  silences from the active silences. Alertmanager's ``unprocessed`` state never occurs: every stored
  alert has been through the correlate stage.
* There is no cluster: ``cluster.status`` is ``disabled``, as for an Alertmanager started without peers.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg
import yaml
from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from services.alerting.config import InhibitRuleConfig, loads_routing
from services.alerting.errors import SilenceError
from services.alerting.matchers import Matcher, matches_all, parse_matcher_list, parse_matchers
from services.alerting.routes import Route, build_route_tree
from services.alerting.silences import Silence, matches_every_alert
from services.api.database import request_connection
from services.auth.http import Operator, Viewer
from services.auth.tokens import Role
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.store.incidents import AlertRow, latest_alerts
from services.store.silences import (
    SilenceNotFound,
    StoredSilence,
    create_silence,
    engine_silences,
    expire_silence,
    get_silence,
    list_silences,
)

PREFIX = "/api/v2"
# Bounds on what one request reads: the alerts and silences tables only grow.
MAX_ALERTS = 10_000
MAX_SILENCES = 10_000
# Receiver settings shown as written in /status; every other value of a receiver is masked, since
# routing.yaml may hold webhook URLs and routing keys inline.
SHOWN_RECEIVER_KEYS = frozenset({"name", "channel", "severity", "send_resolved", "max_alerts"})
MASK = "<secret>"
# The alert fields the labels carry when a stored alert's own labels lack them (services/alerting/labels.py).
FIELD_LABELS = {"alertname": "signal", "severity": "severity", "entity": "entity", "detector": "detector"}

# Alertmanager's repeated ``filter`` query parameter: matchers such as ``alertname="x"``.
FilterParam = Annotated[list[str] | None, Query(description='matchers, e.g. alertname="gpu_xid"')]

log = logging.getLogger(__name__)


class MatcherBody(BaseModel):
    """Alertmanager's ``matcher``: ``isRegex`` and ``isEqual`` choose among ``=``, ``!=``, ``=~``, ``!~``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1)
    value: str
    isRegex: bool = False
    isEqual: bool = True

    def text(self) -> str:
        """The matcher as ClusterMedic stores it (``name="value"``)."""
        op = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}
        try:
            return str(Matcher(self.name, op[(self.isRegex, self.isEqual)], self.value))  # type: ignore[arg-type]
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc


class PostableSilence(BaseModel):
    """Alertmanager's ``postableSilence``; ``id`` replaces that silence (which is expired)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str | None = None
    matchers: list[MatcherBody] = Field(min_length=1)
    startsAt: datetime
    endsAt: datetime
    createdBy: str = ""  # ignored: the author is the caller
    comment: str = ""


@dataclass(frozen=True)
class Routing:
    """What the v2 routes read from routing.yaml: the tree, inhibit rules, resolve timeout, masked text."""

    root: Route
    inhibit_rules: tuple[InhibitRuleConfig, ...]
    resolve_timeout: float
    original: str

    @classmethod
    def load(cls, path: Path) -> Routing:
        """Read and validate routing.yaml.

        Raises:
            ConfigError: it is missing or invalid.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the routing config: {exc}") from exc
        config = loads_routing(text, source=str(path))
        return cls(
            root=build_route_tree(config.route),
            inhibit_rules=config.inhibit_rules,
            resolve_timeout=config.global_.resolve_timeout,
            original=masked_config(text),
        )

    def receivers(self, labels: Mapping[str, str]) -> list[str]:
        """The receivers of the routes these labels land in, in tree order, each once."""
        return list(dict.fromkeys(route.receiver for route in self.root.match(labels)))


def masked_config(text: str) -> str:
    """routing.yaml as YAML again, every receiver value outside :data:`SHOWN_RECEIVER_KEYS` masked."""

    def mask(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: mask(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v, key) for v in value]
        if key in SHOWN_RECEIVER_KEYS or isinstance(value, bool | int | float) or value is None:
            return value
        return MASK

    data = yaml.safe_load(text) or {}
    if isinstance(data, dict) and isinstance(data.get("receivers"), list):
        data["receivers"] = [mask(r) for r in data["receivers"]]
    return str(yaml.safe_dump(data, sort_keys=False))


def _ts(when: datetime) -> str:
    """RFC 3339 in UTC with milliseconds, as Alertmanager writes timestamps."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _matcher_json(matcher: Matcher) -> dict[str, Any]:
    return {
        "name": matcher.name,
        "value": matcher.value,
        "isRegex": matcher.op in ("=~", "!~"),
        "isEqual": matcher.op in ("=", "=~"),
    }


def gettable_silence(stored: StoredSilence, now: float) -> dict[str, Any]:
    """Alertmanager's ``gettableSilence`` of a stored silence, its state at ``now``."""
    return {
        "id": stored.silence_id,
        "status": {"state": stored.state(now)},
        "updatedAt": _ts(stored.updated_at),
        "matchers": [_matcher_json(m) for m in parse_matcher_list(list(stored.matchers))],
        "startsAt": _ts(stored.starts_at),
        "endsAt": _ts(stored.ends_at),
        "createdBy": stored.created_by,
        "comment": stored.comment,
    }


def _silence_order(item: dict[str, Any]) -> tuple[int, str]:
    # Alertmanager's order: active (ending soonest first), pending (starting soonest), expired (latest first)
    state = item["status"]["state"]
    if state == "active":
        return 0, item["endsAt"]
    if state == "pending":
        return 1, item["startsAt"]
    inverted = "".join(chr(0x10FFFF - ord(c)) for c in item["endsAt"])
    return 2, inverted


def parse_filter(filters: Sequence[str]) -> tuple[Matcher, ...]:
    """The ``filter`` query parameters (each one or more matchers, braces optional), or 400."""
    out: list[Matcher] = []
    for text in filters:
        try:
            out.extend(parse_matchers(text))
        except ValueError as exc:
            raise HTTPException(400, f"bad filter: {exc}") from exc
    return tuple(out)


def receiver_pattern(receiver: str | None) -> re.Pattern[str] | None:
    """The ``receiver`` query parameter: a regex matched against whole receiver names, or 400."""
    try:
        return re.compile(receiver) if receiver else None
    except re.error as exc:
        raise HTTPException(400, f"bad receiver regex: {exc}") from exc


def alert_labels(row: AlertRow) -> dict[str, str]:
    """A stored alert's labels, with the fields every alert carries filled in where they are missing."""
    labels = dict(row.labels)
    for label, name in FIELD_LABELS.items():
        labels.setdefault(label, str(getattr(row, name)))
    return dict(sorted(labels.items()))


def inhibitors(
    target: tuple[str, Mapping[str, str]],
    rules: Sequence[InhibitRuleConfig],
    firing: Sequence[tuple[str, Mapping[str, str]]],
) -> list[str]:
    """Fingerprints of the firing alerts that inhibit ``target`` (``(fingerprint, labels)``).

    The rule of the correlate engine's inhibit stage (pipelines/correlate/stages.py, which services
    may not import): a source matches the rule's source matchers and shares every ``equal`` label;
    when the target is itself a possible source, sources that are also targets do not count, so two
    such alerts do not mute each other. The first inhibiting source is named, as Alertmanager does.
    """
    fingerprint, labels = target
    for rule in rules:
        targets, sources = rule.targets(), rule.sources()
        if not matches_all(targets, labels):
            continue
        two_sided = matches_all(sources, labels)
        for source_fp, source in firing:
            if source_fp == fingerprint or not matches_all(sources, source):
                continue
            if two_sided and matches_all(targets, source):
                continue
            if all(source.get(name, "") == labels.get(name, "") for name in rule.equal):
                return [source_fp]
    return []


def create_router(settings: Settings, *, clock: Callable[[], float] = time.time) -> APIRouter:
    """The API v2 routes (mount at :data:`PREFIX`) over the silences and alerts tables.

    Args:
        settings: where PostgreSQL and routing.yaml are.
        clock: UNIX time (silence states, alert suppression, uptime); injected by tests.
    """
    router = APIRouter(tags=["alertmanager-v2"])
    started = datetime.fromtimestamp(clock(), UTC)
    loaded: list[Routing] = []

    def routing() -> Routing:
        # read on first use: the API serves silences even where routing.yaml is absent
        if not loaded:
            try:
                loaded.append(Routing.load(Path(settings.routing_config)))
            except ConfigError as exc:
                raise HTTPException(503, f"routing config unavailable: {exc}") from exc
        return loaded[0]

    def db() -> AbstractContextManager[psycopg.Connection]:
        return request_connection(settings)

    def silence_or_404(conn: psycopg.Connection, silence_id: str) -> StoredSilence:
        try:
            return get_silence(conn, silence_id)
        except SilenceNotFound as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.get("/silences")
    def silences(auth: Viewer, filter: FilterParam = None) -> list[dict[str, Any]]:
        wanted = parse_filter(filter or ())
        now = clock()
        with db() as conn:
            rows = list_silences(conn, now=now, limit=MAX_SILENCES)
        out = []
        for row in rows:
            try:
                parsed = parse_matcher_list(list(row.matchers))
            except ValueError:
                log.warning("silence %s has a matcher that no longer parses: not listed", row.silence_id)
                continue
            # Alertmanager's rule: a filter matches a silence's equality matchers read as labels
            labels = {m.name: m.value for m in parsed if m.op == "="}
            if matches_all(wanted, labels):
                out.append(gettable_silence(row, now))
        return sorted(out, key=_silence_order)

    @router.post("/silences")
    def post_silence(body: PostableSilence, auth: Operator) -> dict[str, str]:
        matchers = [m.text() for m in body.matchers]
        auth.note("silence.create", matchers=matchers, api="v2")
        if body.createdBy and body.createdBy != auth.name:
            auth.note(claimed_created_by=body.createdBy)  # kept for the record, never believed
        identity = auth.identity
        assert identity is not None
        try:
            mutes_all = matches_every_alert(Silence.of(matchers, starts_at=0, ends_at=1).matchers)
        except SilenceError as exc:
            raise HTTPException(400, str(exc)) from exc
        if mutes_all and not identity.role.allows(Role.ADMIN):
            raise HTTPException(
                403, f"a silence that mutes every alert needs the admin role; {auth.name!r} has {identity.role.value}"
            )
        now = clock()
        # as Alertmanager does: a start in the past is now; an end in the past is refused
        start, end = max(body.startsAt.timestamp(), now), body.endsAt.timestamp()
        if end <= now:
            raise HTTPException(400, "endsAt is in the past")
        try:
            with db() as conn:
                if body.id:
                    silence_or_404(conn, body.id)
                stored = create_silence(
                    conn,
                    matchers=matchers,
                    starts_at=start,
                    ends_at=end,
                    created_by=auth.name,
                    comment=body.comment,
                    allow_all=mutes_all,
                    via="api",
                )
                if body.id:
                    # only once its replacement is stored: a refused replacement leaves the old one muting
                    expire_silence(conn, body.id, now=now)
                    auth.note(replaces=body.id)
        except SilenceError as exc:
            raise HTTPException(400, str(exc)) from exc
        auth.note(target=stored.silence_id)
        return {"silenceID": stored.silence_id}

    @router.get("/silence/{silence_id}")
    def silence(silence_id: str, auth: Viewer) -> dict[str, Any]:
        with db() as conn:
            return gettable_silence(silence_or_404(conn, silence_id), clock())

    @router.delete("/silence/{silence_id}")
    def delete_silence(silence_id: str, auth: Operator) -> Response:
        auth.note("silence.expire", silence_id, api="v2")
        with db() as conn:
            try:
                expire_silence(conn, silence_id, now=clock())
            except SilenceNotFound as exc:
                raise HTTPException(404, str(exc)) from exc
        return Response(status_code=200)

    def gettable_alerts(
        *,
        active: bool,
        silenced: bool,
        inhibited: bool,
        unprocessed: bool,
        filter: Sequence[str],
        receiver: str | None,
    ) -> list[tuple[dict[str, Any], dict[str, str]]]:
        """The alerts the filters keep, each with its labels (for grouping)."""
        del unprocessed  # no stored alert is unprocessed, so the filter keeps or drops nothing
        wanted = parse_filter(filter)
        receiver_re = receiver_pattern(receiver)
        config = routing()
        now = clock()
        with db() as conn:
            rows = latest_alerts(conn, firing_only=True, limit=MAX_ALERTS)
            # the engine's reading of the table: rows that no longer validate are skipped, not a 500
            known_silences = engine_silences(conn, now=now, retention_s=0.0)
        firing = [(r.fingerprint, alert_labels(r)) for r in rows]
        out = []
        for row, (fingerprint, labels) in zip(rows, firing, strict=True):
            receivers = config.receivers(labels)
            if receiver_re is not None and not any(receiver_re.fullmatch(name) for name in receivers):
                continue
            if not matches_all(wanted, labels):
                continue
            silenced_by = sorted(s.id for s in known_silences if s.mutes(labels, now))
            inhibited_by = inhibitors((fingerprint, labels), config.inhibit_rules, firing)
            state: Literal["active", "suppressed"] = "suppressed" if silenced_by or inhibited_by else "active"
            if (state == "active" and not active) or (silenced_by and not silenced) or (inhibited_by and not inhibited):
                continue
            ends = max(row.last_seen_at.timestamp() + config.resolve_timeout, now)
            alert = {
                "labels": labels,
                "annotations": {"incident_id": row.incident_id, "summary": f"{row.signal} on {row.entity}"},
                "startsAt": _ts(row.starts_at),
                "endsAt": _ts(datetime.fromtimestamp(ends, UTC)),
                "updatedAt": _ts(row.last_seen_at),
                "fingerprint": fingerprint,
                "receivers": [{"name": name} for name in receivers],
                "status": {"state": state, "silencedBy": silenced_by, "inhibitedBy": inhibited_by},
            }
            out.append((alert, labels))
        return out

    @router.get("/alerts")
    def alerts(
        auth: Viewer,
        active: bool = True,
        silenced: bool = True,
        inhibited: bool = True,
        unprocessed: bool = True,
        filter: FilterParam = None,
        receiver: str | None = None,
    ) -> list[dict[str, Any]]:
        found = gettable_alerts(
            active=active,
            silenced=silenced,
            inhibited=inhibited,
            unprocessed=unprocessed,
            filter=filter or (),
            receiver=receiver,
        )
        return [alert for alert, _ in found]

    @router.get("/alerts/groups")
    def alert_groups(
        auth: Viewer,
        active: bool = True,
        silenced: bool = True,
        inhibited: bool = True,
        filter: FilterParam = None,
        receiver: str | None = None,
    ) -> list[dict[str, Any]]:
        found = gettable_alerts(
            active=active, silenced=silenced, inhibited=inhibited, unprocessed=True, filter=filter or (), receiver=None
        )
        receiver_re = receiver_pattern(receiver)
        groups: dict[str, dict[str, Any]] = {}
        for alert, labels in found:
            for route in routing().root.match(labels):
                if receiver_re is not None and not receiver_re.fullmatch(route.receiver):
                    continue
                group_labels = route.group_labels(labels)
                group = groups.setdefault(
                    route.group_key(group_labels),
                    {"labels": group_labels, "receiver": {"name": route.receiver}, "alerts": []},
                )
                group["alerts"].append(alert)
        return [groups[key] for key in sorted(groups)]

    @router.get("/status")
    def status(auth: Viewer) -> dict[str, Any]:
        try:
            version = metadata.version("clustermedic")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return {
            "cluster": {"status": "disabled", "peers": []},
            "versionInfo": {
                "version": version,
                "revision": "",
                "branch": "",
                "buildUser": "",
                "buildDate": "",
                "goVersion": f"python{sys.version.split()[0]}",
            },
            "config": {"original": routing().original},
            "uptime": _ts(started),
        }

    return router
