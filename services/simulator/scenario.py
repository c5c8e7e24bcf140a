"""Scenario files: the cluster, fleet, traffic and pinned faults of a reproducible case.

A scenario is YAML validated by the pydantic models below; every field has a default, so an empty
file is the default 3-node cluster with random faults off. See docs/simulator.md for the format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.core.errors import ConfigError
from services.simulator.faults import FAULT_TYPES, Fault, severity_from

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FaultSpec(_Model):
    """One pinned fault."""

    type: str
    target: str = ""
    onset: float = Field(default=300.0, ge=0)
    duration: float | None = Field(default=None, gt=0)
    severity: float = Field(default=0.5, ge=0, le=1)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in FAULT_TYPES:
            raise ValueError(f"unknown fault type {v!r}; known: {', '.join(FAULT_TYPES)}")
        return v


class DeploymentSpec(_Model):
    """One deployment of the fleet."""

    name: str
    variant: str
    replicas: int = Field(ge=0)
    max_num_seqs: int = Field(default=256, ge=1)
    weight: float = Field(default=1.0, ge=0)


class ClusterSpec(_Model):
    """Nodes and GPUs."""

    nodes: int = Field(default=3, ge=1, le=5000)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    gpu: str = "h100-80gb"
    node_gpus: list[str] | None = Field(default=None, description="GPU type per node; overrides 'gpu'")


class TrafficSpec(_Model):
    """Where requests come from."""

    kind: Literal["synthetic", "trace"] = "synthetic"
    trace: Literal["conv", "code", "both"] = "conv"
    time_scale: float = Field(default=1.0, gt=0)
    base_rps: float | None = Field(default=None, gt=0, description="synthetic mean rate; default scales with nodes")
    bursts_per_hour: float = Field(default=2.0, ge=0)
    burst_factor: float = Field(default=1.6, ge=1)
    diurnal_amplitude: float = Field(default=0.35, ge=0, le=0.95)


class SloSpec(_Model):
    """Targets the grader scores against."""

    ttft_s: float = 2.0
    e2e_s: float = 30.0
    cost_per_1k_tokens: float = 0.012
    availability: float = 0.999


class Scenario(_Model):
    """A whole reproducible case."""

    name: str = "default"
    description: str = ""
    duration_s: float = Field(default=1800.0, gt=0)
    cluster: ClusterSpec = ClusterSpec()
    deployments: list[DeploymentSpec] | None = None
    traffic: TrafficSpec = TrafficSpec()
    faults: list[FaultSpec] = Field(default_factory=list)
    random_faults: bool = False
    faults_per_hour: float = Field(default=2.0, ge=0)
    slo: SloSpec = SloSpec()

    def fleet(self) -> list[DeploymentSpec]:
        """The deployments, defaulting to a mixed 70B/8B fleet sized to the cluster."""
        if self.deployments is not None:
            return list(self.deployments)
        k = self.cluster.nodes * self.cluster.gpus_per_node / 24.0
        return [
            DeploymentSpec(
                name="llama-70b-fp16",
                variant="70b-fp16-32k-tp4",
                replicas=max(1, round(2 * k)),
                max_num_seqs=128,
                weight=0.45,
            ),
            DeploymentSpec(
                name="llama-70b-int4",
                variant="70b-int4-32k-tp1",
                replicas=max(1, round(3 * k)),
                max_num_seqs=128,
                weight=0.35,
            ),
            DeploymentSpec(
                name="llama-8b-fp16",
                variant="8b-fp16-128k-tp1",
                replicas=max(1, round(3 * k)),
                max_num_seqs=256,
                weight=0.2,
            ),
        ]

    def base_rps(self) -> float:
        """Mean synthetic request rate: ~6 req/s per 24 GPUs keeps the default fleet half busy."""
        if self.traffic.base_rps is not None:
            return self.traffic.base_rps
        return 6.0 * self.cluster.nodes * self.cluster.gpus_per_node / 24.0

    def pinned_faults(self) -> list[Fault]:
        """The scenario's faults as :class:`Fault` objects (ids ``<type>-p<n>``)."""
        return [
            Fault(
                f"{f.type}-p{i + 1}", f.type, f.target, f.onset, f.duration, severity_from(f.severity), dict(f.params)
            )
            for i, f in enumerate(self.faults)
        ]


def list_scenarios() -> list[str]:
    """Names of the scenario files shipped with the simulator."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(source: str | Path | None) -> Scenario:
    """Load a scenario by shipped name, by path, or the default when ``None``.

    Raises:
        ConfigError: the file is missing or invalid.
    """
    if source is None or source == "" or source == "default":
        return Scenario()
    path = Path(source)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{source}.yaml"
    if not path.is_file():
        raise ConfigError(f"scenario {source!r} not found; shipped: {', '.join(list_scenarios())}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"scenario {path}: not valid YAML: {exc}") from exc
    data.setdefault("name", path.stem)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"scenario {path}: {exc}") from exc
