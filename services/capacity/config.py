"""The capacity planner's configuration (``infra/config/capacity.yaml``), validated with pydantic.

Every mistake is a :class:`ConfigError` naming the file and the key path (``variants.llama-8b.gpu_type``),
because a capacity planner that starts with a typo in a price would scale the wrong variant silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.core.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "infra" / "config" / "capacity.yaml"


class _Model(BaseModel):
    # Unknown keys are refused: a misspelt setting must not fall back to its default unnoticed.
    model_config = ConfigDict(frozen=True, extra="forbid")


class SloTargets(_Model):
    """Latency targets every variant must meet (p95, seconds)."""

    ttft_p95_s: float = Field(default=2.0, gt=0)
    itl_p95_s: float = Field(default=0.1, gt=0)


class SaturationThresholds(_Model):
    """When a replica counts as saturated, and how much spare capacity the fleet keeps.

    A replica is saturated when its KV-cache usage reaches ``kv_cache`` or its queue reaches
    ``queue_depth``. Spare capacity of a replica is the distance to those thresholds.
    """

    kv_cache: float = Field(default=0.80, gt=0, le=1)
    queue_depth: float = Field(default=5.0, gt=0)
    spare_kv: float = Field(default=0.10, ge=0, lt=1)
    spare_queue: float = Field(default=3.0, ge=0)


class Hysteresis(_Model):
    """How long a condition must hold, and how long a model rests after a change."""

    up_confirmations: int = Field(default=3, ge=1)
    down_confirmations: int = Field(default=6, ge=1)
    up_cooldown_s: float = Field(default=60.0, ge=0)
    down_cooldown_s: float = Field(default=600.0, ge=0)
    max_events_per_hour: int = Field(default=12, ge=1)
    down_slo_margin: float = Field(default=0.7, gt=0, le=1)


class VariantConfig(_Model):
    """One deployment of a model variant."""

    model: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpus_per_replica: int = Field(default=1, ge=1)
    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=16, ge=1)
    prior_tokens_per_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> VariantConfig:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        return self


class CapacityConfig(_Model):
    """All of capacity.yaml."""

    interval_s: float = Field(default=30.0, gt=0)
    slo: SloTargets = SloTargets()
    saturation: SaturationThresholds = SaturationThresholds()
    hysteresis: Hysteresis = Hysteresis()
    min_kv_for_estimate: float = Field(default=0.05, gt=0, lt=1)
    queueing_depth: float = Field(default=1.0, gt=0)
    slo_evidence_s: float = Field(default=3600.0, ge=0)
    max_step: int = Field(default=3, ge=1)
    gpu_prices: dict[str, float] = Field(default_factory=dict)
    variants: dict[str, VariantConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _priced(self) -> CapacityConfig:
        for name, price in self.gpu_prices.items():
            if price <= 0:
                raise ValueError(f"gpu_prices.{name}: a price must be above 0 USD per GPU-hour, got {price}")
        for name, v in self.variants.items():
            if v.gpu_type not in self.gpu_prices:
                known = ", ".join(sorted(self.gpu_prices)) or "none"
                raise ValueError(
                    f"variants.{name}.gpu_type: {v.gpu_type!r} has no entry in gpu_prices (known: {known})"
                )
        return self

    def replica_usd_per_hour(self, variant: str) -> float:
        """What one replica of ``variant`` costs per hour (its GPUs times their price)."""
        v = self.variants[variant]
        return v.gpus_per_replica * self.gpu_prices[v.gpu_type]


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def parse_config(data: Mapping[str, Any], source: str = "<dict>") -> CapacityConfig:
    """Validate a config mapping.

    Raises:
        ConfigError: it does not validate; the message names ``source`` and every bad key.
    """
    try:
        return CapacityConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(exc)}") from exc


def load_config(path: Path = DEFAULT_CONFIG) -> CapacityConfig:
    """Read and validate capacity.yaml.

    Raises:
        ConfigError: the file is missing, not YAML, not a mapping, or invalid.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read capacity config {path}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return parse_config(data, str(path))
