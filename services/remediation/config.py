"""Remediation configuration: ``infra/config/remediation.yaml`` as typed models.

:class:`RemediationSettings` holds the few process-level settings (where the YAML is, the Slack signing
secret); it is built at the entrypoint like :class:`~services.core.settings.Settings`.
"""

from __future__ import annotations

import csv
import datetime as dt
import fnmatch
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.core.errors import ConfigError
from services.core.paths import REPO_ROOT, shared_data_dir

DEFAULT_CONFIG = REPO_ROOT / "infra" / "config" / "remediation.yaml"
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class RemediationSettings(BaseSettings):
    """Process settings of the remediation service (``CLUSTERMEDIC_REMEDIATION_*`` variables)."""

    model_config = SettingsConfigDict(env_prefix="CLUSTERMEDIC_REMEDIATION_", env_file=".env", extra="ignore")

    config: Path = Field(default=DEFAULT_CONFIG, description="remediation.yaml to load")
    actuator_url: str | None = Field(default=None, description="overrides actuator.url of the YAML")
    slack_signing_secret: str = Field(default="", description="Slack app signing secret (interactivity)")
    slack_users: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'Slack user id -> the name of a ClusterMedic token (JSON object, e.g. {"U024BE7LH": "carol"}):'
            " a click on an approval button counts as that identity's, which must hold an active operator or"
            " admin token; anyone else's click is refused with a message"
        ),
    )
    recover_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="how often Celery beat sends the recovery sweep (resumes runs whose worker died)",
    )


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ActuatorConfig(_Model):
    """Which actuator acts, and how to reach it."""

    kind: str = "simulator"
    url: str = "http://127.0.0.1:18080"
    time_scale: float = Field(default=1.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    token: str | None = Field(
        default=None,
        repr=False,
        exclude=True,
        description="bearer token of the actuator's API: CLUSTERMEDIC_SIM_TOKEN for the simulator (a secret, "
        "so the entrypoint sets it from the environment, never from the YAML)",
    )


class ExecutionConfig(_Model):
    """Celery execution knobs.

    ``clock`` is the executor's clock, event time for every remediation timer (cooldowns, rate limit,
    circuit breaker, leases, approval TTL): ``wall`` (production: the world runs on wall time) or
    ``world`` (the actuator's :meth:`~services.remediation.actuators.base.Actuator.event_time`: the
    simulated UNIX time under the simulator, so a run at ``--speed 30`` behaves like one at 1x).
    """

    clock: Literal["wall", "world"] = "wall"
    lease_s: float = Field(default=120.0, gt=0)
    verify_backoff_max_s: int = Field(default=30, ge=1)


class ApprovalConfig(_Model):
    """Approval knobs.

    Attributes:
        ttl_s: a request nobody answered expires after this long.
        keep_ratio: a new diagnosis that proposes another remedy withdraws a pending request only when it
            rates the request's remedy below this fraction of its top cause's confidence (or not at all):
            two causes within noise of each other do not take a request away from the engineer reading it.
    """

    ttl_s: float = Field(default=3600.0, gt=0)
    keep_ratio: float = Field(default=0.5, ge=0, le=1)


class XidAction(_Model):
    """The playbook and level for one XID required action."""

    playbook: str
    level: int = Field(ge=1, le=3)


class XidMapping(_Model):
    """NVIDIA XID required action -> playbook; per-code required actions."""

    actions: dict[str, XidAction | None] = Field(default_factory=dict)
    codes: dict[int, str] = Field(default_factory=dict)

    def required_action(self, code: int) -> str | None:
        """The required action of ``code``: the config's, else NVIDIA's catalog's, else None."""
        if code in self.codes:
            return self.codes[code]
        return nvidia_required_actions().get(code)

    def for_code(self, code: int) -> XidAction | None:
        """The playbook and level for an XID code (None: ignore it or unknown)."""
        action = self.required_action(code)
        return self.actions.get(action) if action else None


class BlastRadius(_Model):
    """How much may be out of service at once."""

    max_replicas: int = Field(default=1, ge=0)
    max_fraction: float = Field(default=0.5, ge=0, le=1)
    max_nodes: int = Field(default=1, ge=0)


class RateLimit(_Model):
    """Cluster-wide runs that act, per window."""

    max_runs: int = Field(default=20, ge=0)
    window_s: float = Field(default=3600.0, gt=0)


class CircuitBreaker(_Model):
    """Failed automatic runs per window that stop automatic remediation."""

    max_failures: int = Field(default=3, ge=1)
    window_s: float = Field(default=3600.0, gt=0)


class MaintenanceWindow(_Model):
    """A UTC time window: weekly (``days`` + ``HH:MM`` times) or absolute (ISO 8601 datetimes)."""

    start: str
    end: str
    days: tuple[str, ...] = ()
    reason: str = ""

    @field_validator("days")
    @classmethod
    def _days(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in v if d.lower()[:3] not in _DAYS]
        if bad:
            raise ValueError(f"unknown days {bad}; use mon..sun")
        return tuple(d.lower()[:3] for d in v)

    def contains(self, ts: float) -> bool:
        """Whether the UNIX time ``ts`` falls in the window."""
        now = dt.datetime.fromtimestamp(ts, dt.UTC)
        if "T" in self.start or "-" in self.start:
            start = dt.datetime.fromisoformat(self.start).replace(tzinfo=dt.UTC)
            end = dt.datetime.fromisoformat(self.end).replace(tzinfo=dt.UTC)
            return start <= now < end
        if self.days and _DAYS[now.weekday()] not in self.days:
            return False
        hm = now.strftime("%H:%M")
        if self.start <= self.end:
            return self.start <= hm < self.end
        return hm >= self.start or hm < self.end  # wraps midnight


class PolicySpec(_Model):
    """The policy in force for one scope (namespace / model / playbook)."""

    max_auto_level: int = Field(default=1, ge=0, le=2)
    max_level: int = Field(default=2, ge=0, le=3)
    dry_run: bool = False
    kill_switch: bool = False
    cooldown_s: float = Field(default=900.0, ge=0)
    blast_radius: BlastRadius = Field(default_factory=BlastRadius)
    rate_limit: RateLimit = Field(default_factory=RateLimit)
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    maintenance_windows: tuple[MaintenanceWindow, ...] = ()


class PolicyOverride(_Model):
    """Settings applied over the defaults where every ``match`` key matches the scope."""

    match: dict[str, str]
    set: dict[str, Any]

    @field_validator("match")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        bad = set(v) - {"namespace", "model", "playbook"}
        if bad:
            raise ValueError(f"match keys must be namespace, model or playbook, not {sorted(bad)}")
        return v


class PolicyConfig(_Model):
    """Defaults plus ordered overrides."""

    defaults: PolicySpec = Field(default_factory=PolicySpec)
    overrides: tuple[PolicyOverride, ...] = ()

    def resolve(self, scope: Mapping[str, str]) -> PolicySpec:
        """The policy for a scope: defaults, then each matching override in order (nested keys merge).

        Raises:
            ConfigError: an override produces an invalid policy.
        """
        data = self.defaults.model_dump()
        for override in self.overrides:
            if all(fnmatch.fnmatchcase(scope.get(k, ""), pattern) for k, pattern in override.match.items()):
                data = _merge(data, override.set)
        try:
            return PolicySpec.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"remediation policy for {dict(scope)}: {exc}") from exc


class RemediationConfig(_Model):
    """All of remediation.yaml."""

    actuator: ActuatorConfig = Field(default_factory=ActuatorConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    approvals: ApprovalConfig = Field(default_factory=ApprovalConfig)
    xid: XidMapping = Field(default_factory=XidMapping)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_config(data: Mapping[str, Any], source: str = "<dict>") -> RemediationConfig:
    """Validate a config mapping.

    Raises:
        ConfigError: it does not validate.
    """
    try:
        return RemediationConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def load_config(path: Path = DEFAULT_CONFIG, *, actuator_url: str | None = None) -> RemediationConfig:
    """Read and validate remediation.yaml (``actuator_url`` overrides the actuator's URL).

    Raises:
        ConfigError: the file is missing, not YAML, or invalid.
    """
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read remediation config {path}: {exc}") from exc
    if actuator_url:
        data.setdefault("actuator", {})["url"] = actuator_url
    return parse_config(data, str(path))


@lru_cache(maxsize=1)
def nvidia_required_actions() -> dict[int, str]:
    """XID code -> NVIDIA's ImmediateResolution from the shared XID catalog (empty when absent)."""
    try:
        path = shared_data_dir() / "xid" / "nvidia_xid_catalog.csv"
        with path.open(newline="") as fh:
            return {
                int(row["Code"]): row["ImmediateResolution"].strip()
                for row in csv.DictReader(fh)
                if (row.get("ImmediateResolution") or "").strip()
            }
    except (ConfigError, OSError, KeyError, ValueError):
        return {}
