"""``infra/config/routing.yaml``: Alertmanager's routing vocabulary plus ClusterMedic's correlation keys.

The file is loaded into frozen pydantic models. Any problem raises :class:`ConfigError` whose message
names the file and the key path (``route.routes[1].group_wait: invalid duration '5x' ...``), so the
operator can fix it without reading code. Unknown keys are errors, as in Alertmanager: a typo such
as ``group_wiat`` must not silently fall back to a default.

Top-level keys: ``global``, ``route``, ``receivers``, ``inhibit_rules``, ``time_intervals`` (and the
deprecated ``mute_time_intervals``), ``templates`` (accepted, unused) and ``correlation`` (ours).
docs/correlation.md documents every key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.alerting.durations import parse_duration
from services.alerting.matchers import LABEL_NAME, Matcher, parse_matcher_list
from services.alerting.timeintervals import NamedTimeInterval
from services.core.errors import ConfigError

Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in YAML as a Prometheus duration string."""

GROUP_BY_ALL = "..."
# Notifier kinds ClusterMedic carries, and whether each sends resolved notifications when the config
# does not say (Alertmanager's defaults for slack, pagerduty and webhook; forwarding to another
# Alertmanager always carries the end time).
NOTIFIER_SEND_RESOLVED_DEFAULT: dict[str, bool] = {
    "slack_configs": False,
    "pagerduty_configs": True,
    "webhook_configs": True,
    "alertmanager_configs": True,
}


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, populate_by_name=True)


def _matchers(value: object) -> tuple[Matcher, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        raise ValueError("matchers must be a list of strings, e.g. ['severity=\"critical\"']")
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"matchers must be a list of strings, got {value!r}")
    return parse_matcher_list(value)


def _label_map(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of label name to value, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _label_names(names: tuple[str, ...], key: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name != GROUP_BY_ALL and not LABEL_NAME.match(name):
            raise ValueError(f"{key}: {name!r} is not a valid label name")
        if name in seen:
            raise ValueError(f"{key}: label {name!r} is listed twice")
        seen.add(name)


Matchers = Annotated[tuple[Matcher, ...], BeforeValidator(_matchers)]
LabelMap = Annotated[dict[str, str], BeforeValidator(_label_map)]


class GlobalConfig(_Strict):
    """``global``: defaults shared by the whole file."""

    resolve_timeout: Duration = 300.0
    slack_api_url: str | None = None
    slack_api_url_file: str | None = None
    pagerduty_url: str | None = None
    http_config: dict[str, Any] | None = None

    @field_validator("resolve_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("resolve_timeout must be greater than zero")
        return value


class RouteConfig(_Strict):
    """One node of the routing tree, as written (unset values are inherited when the tree is built)."""

    receiver: str | None = None
    group_by: tuple[str, ...] | None = None
    continue_: bool = Field(default=False, alias="continue")
    matchers: Matchers = ()
    match: LabelMap = Field(default_factory=dict, description="deprecated: use matchers")
    match_re: LabelMap = Field(default_factory=dict, description="deprecated: use matchers")
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    mute_time_intervals: tuple[str, ...] = ()
    active_time_intervals: tuple[str, ...] = ()
    min_occurrences: int | None = Field(default=None, ge=1)
    occurrence_window: Duration | None = None
    routes: tuple[RouteConfig, ...] = ()

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        _label_names(value, "group_by")
        if GROUP_BY_ALL in value and len(value) > 1:
            raise ValueError("group_by: '...' (group by all labels) cannot be combined with other labels")
        return value

    @field_validator("group_interval", "repeat_interval", "occurrence_window")
    @classmethod
    def _non_zero(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be greater than zero")
        return value

    @model_validator(mode="after")
    def _legacy_matchers(self) -> RouteConfig:
        for name, regex in self.match_re.items():
            Matcher(name, "=~", regex)  # fail now on a bad regex
        return self

    def all_matchers(self) -> tuple[Matcher, ...]:
        """``matchers`` plus the deprecated ``match`` / ``match_re`` maps turned into matchers."""
        legacy = [Matcher(k, "=", v) for k, v in sorted(self.match.items())]
        legacy += [Matcher(k, "=~", v) for k, v in sorted(self.match_re.items())]
        return (*legacy, *self.matchers)


class InhibitRuleConfig(_Strict):
    """``inhibit_rules[]``: a firing source alert mutes target alerts that share the ``equal`` labels."""

    source_matchers: Matchers = ()
    target_matchers: Matchers = ()
    equal: tuple[str, ...] = ()
    source_match: LabelMap = Field(default_factory=dict, description="deprecated: use source_matchers")
    source_match_re: LabelMap = Field(default_factory=dict, description="deprecated: use source_matchers")
    target_match: LabelMap = Field(default_factory=dict, description="deprecated: use target_matchers")
    target_match_re: LabelMap = Field(default_factory=dict, description="deprecated: use target_matchers")

    @field_validator("equal")
    @classmethod
    def _equal(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _label_names(value, "equal")
        if GROUP_BY_ALL in value:
            raise ValueError("equal: '...' is not allowed here; list the label names")
        return value

    @model_validator(mode="after")
    def _check(self) -> InhibitRuleConfig:
        for name, regex in {**self.source_match_re, **self.target_match_re}.items():
            Matcher(name, "=~", regex)
        if not self.sources():
            raise ValueError("an inhibit rule needs source_matchers (else every alert would be a source)")
        return self

    def sources(self) -> tuple[Matcher, ...]:
        """All source matchers, legacy maps included."""
        legacy = [Matcher(k, "=", v) for k, v in sorted(self.source_match.items())]
        legacy += [Matcher(k, "=~", v) for k, v in sorted(self.source_match_re.items())]
        return (*legacy, *self.source_matchers)

    def targets(self) -> tuple[Matcher, ...]:
        """All target matchers, legacy maps included."""
        legacy = [Matcher(k, "=", v) for k, v in sorted(self.target_match.items())]
        legacy += [Matcher(k, "=~", v) for k, v in sorted(self.target_match_re.items())]
        return (*legacy, *self.target_matchers)


class ReceiverConfig(_Strict):
    """``receivers[]``: a name and its notifier configs, carried as plain dicts for the notify stage."""

    name: str = Field(min_length=1)
    slack_configs: tuple[dict[str, Any], ...] = ()
    pagerduty_configs: tuple[dict[str, Any], ...] = ()
    webhook_configs: tuple[dict[str, Any], ...] = ()
    alertmanager_configs: tuple[dict[str, Any], ...] = ()

    @model_validator(mode="after")
    def _check(self) -> ReceiverConfig:
        for kind in NOTIFIER_SEND_RESOLVED_DEFAULT:
            for i, cfg in enumerate(getattr(self, kind)):
                flag = cfg.get("send_resolved", NOTIFIER_SEND_RESOLVED_DEFAULT[kind])
                if not isinstance(flag, bool):
                    raise ValueError(f"{kind}[{i}].send_resolved must be true or false, got {flag!r}")
        return self

    @property
    def send_resolved(self) -> bool:
        """Whether any notifier of this receiver wants resolved notifications.

        A receiver with no notifier at all (a "null" receiver, used to drop alerts) wants none.
        """
        return any(
            cfg.get("send_resolved", NOTIFIER_SEND_RESOLVED_DEFAULT[kind])
            for kind in NOTIFIER_SEND_RESOLVED_DEFAULT
            for cfg in getattr(self, kind)
        )


class FlapDetectionConfig(_Strict):
    """``correlation.flap_detection``: state changes per window, with hysteresis."""

    enabled: bool = True
    window: Duration = 600.0
    high: int = Field(default=6, ge=2, description="enter flapping when changes in the window reach this")
    low: int = Field(default=2, ge=0, description="leave flapping when changes in the window fall to this")

    @model_validator(mode="after")
    def _check(self) -> FlapDetectionConfig:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high}) for hysteresis")
        if self.window <= 0:
            raise ValueError("window must be greater than zero")
        return self


class TopologyConfig(_Strict):
    """``correlation.topology``: joining alerts on one GPU -> node -> pod -> model path."""

    enabled: bool = True
    window: Duration = 600.0
    fact_ttl: Duration = 86400.0


class EscalationConfig(_Strict):
    """``correlation.incidents.escalation``: when a warning incident becomes critical."""

    warning_members: int | None = Field(default=3, ge=1)
    after: Duration | None = 1800.0


class IncidentConfig(_Strict):
    """``correlation.incidents``: incident lifecycle."""

    resolve_after: Duration = 300.0
    retention: Duration = 86400.0
    # Announcing, as Alertmanager batches a group's notifications: a new incident gathers alerts for
    # group_wait before its opened event (and so its first diagnosis); later changes go out at most
    # once per group_interval. 0 announces every change at once.
    group_wait: Duration = 0.0
    group_interval: Duration = 0.0
    # A remediation run acting on an incident holds it open: it resolves only once the run has ended
    # (and its alerts stayed resolved for resolve_after), or at most this long after the run began.
    # 0: runs hold nothing.
    hold_while_acting: Duration = 3600.0
    escalation: EscalationConfig = Field(default_factory=EscalationConfig)


class CorrelationConfig(_Strict):
    """``correlation``: ClusterMedic's keys beyond Alertmanager."""

    flap_detection: FlapDetectionConfig = Field(default_factory=FlapDetectionConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    incidents: IncidentConfig = Field(default_factory=IncidentConfig)


class RoutingConfig(_Strict):
    """The whole of routing.yaml."""

    global_: GlobalConfig = Field(default_factory=GlobalConfig, alias="global")
    route: RouteConfig
    receivers: tuple[ReceiverConfig, ...] = Field(min_length=1)
    inhibit_rules: tuple[InhibitRuleConfig, ...] = ()
    time_intervals: tuple[NamedTimeInterval, ...] = ()
    mute_time_intervals: tuple[NamedTimeInterval, ...] = Field(default=(), description="deprecated alias")
    templates: tuple[str, ...] = ()
    correlation: CorrelationConfig = Field(default_factory=CorrelationConfig)

    @model_validator(mode="after")
    def _references(self) -> RoutingConfig:
        names = [r.name for r in self.receivers]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"receivers: receiver {name!r} is defined more than once")
        intervals = [t.name for t in (*self.time_intervals, *self.mute_time_intervals)]
        for name in intervals:
            if intervals.count(name) > 1:
                raise ValueError(f"time_intervals: {name!r} is defined more than once")
        root = self.route
        if not root.receiver:
            raise ValueError("route.receiver: the root route must name a receiver")
        if root.all_matchers():
            raise ValueError("route.matchers: the root route must not have any matchers")
        if root.continue_:
            raise ValueError("route.continue: the root route cannot have continue")
        if root.mute_time_intervals or root.active_time_intervals:
            raise ValueError("route: the root route must not have mute_time_intervals or active_time_intervals")
        self._check_route(root, "route", set(names), set(intervals))
        return self

    def _check_route(self, route: RouteConfig, path: str, receivers: set[str], intervals: set[str]) -> None:
        if route.receiver is not None and route.receiver not in receivers:
            raise ValueError(f"{path}.receiver: undefined receiver {route.receiver!r} (define it under receivers)")
        for key in ("mute_time_intervals", "active_time_intervals"):
            for name in getattr(route, key):
                if name not in intervals:
                    raise ValueError(f"{path}.{key}: undefined time interval {name!r} (define it under time_intervals)")
        for i, child in enumerate(route.routes):
            self._check_route(child, f"{path}.routes[{i}]", receivers, intervals)

    def receiver(self, name: str) -> ReceiverConfig:
        """The receiver called ``name`` (validated to exist for every route)."""
        for receiver in self.receivers:
            if receiver.name == name:
                return receiver
        raise KeyError(name)

    def named_intervals(self) -> dict[str, NamedTimeInterval]:
        """Every named time interval, from ``time_intervals`` and the deprecated ``mute_time_intervals``."""
        return {t.name: t for t in (*self.mute_time_intervals, *self.time_intervals)}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith("function-"):
            out += ("." if out else "") + str(part)
    return out


def _messages(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = _loc(tuple(err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see docs/correlation.md for the keys routing.yaml accepts)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{where}: {msg}" if where else msg)
    return "; ".join(lines)


def parse_routing(data: object, source: str = "routing.yaml") -> RoutingConfig:
    """Validate an already-parsed YAML document.

    Args:
        data: the document (a mapping).
        source: the file name used in error messages.

    Raises:
        ConfigError: the document is not a valid routing config; the message names the key.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return RoutingConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_messages(exc)}") from exc


def load_routing(path: str | Path) -> RoutingConfig:
    """Read and validate a routing.yaml file.

    Raises:
        ConfigError: the file is missing, is not YAML, or is not a valid routing config.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the routing config: {exc}") from exc
    return loads_routing(text, source=str(path))


def loads_routing(text: str, source: str = "routing.yaml") -> RoutingConfig:
    """Parse and validate routing YAML text.

    Raises:
        ConfigError: not YAML, or not a valid routing config.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    return parse_routing(data, source)
