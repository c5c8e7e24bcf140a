"""Runbooks: the markdown files under ``knowledge/runbooks/<area>/<slug>.md`` turned into typed objects.

A runbook is one failure mode of a GPU inference cluster. Its YAML front matter says how to recognise
it (metrics, log templates, Kubernetes event reasons, XID codes, anomaly signals) and which playbooks
fix it, in order; its markdown body explains it to a human and to the LLM. The diagnostician indexes
both into the knowledge base, and the offline ranker matches incident evidence against ``signals``.

The loader is strict on purpose: a runbook with a typo in a playbook name or a metric name would never
match anything and nobody would notice, so any defect raises :class:`ConfigError` naming the file.

File layout::

    ---
    id: gpu-xid-79-fallen-off-bus
    title: GPU has fallen off the bus (XID 79)
    area: gpu
    ...
    ---
    ## What it means
    ...
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.core.errors import ConfigError
from services.remediation.catalog import playbook_levels

# Playbook registry names with their default level (1 automatic, 2 needs approval, 3 page a human),
# read from the playbook classes. A runbook may ask for a *higher* level than the default (more
# caution), never a lower one: the level is a guardrail and a markdown file must not be able to switch it off.
PLAYBOOK_DEFAULT_LEVELS: dict[str, int] = playbook_levels()

# Metric families a runbook may cite: DCGM exporter, vLLM, TGI, Triton, kube-state-metrics, kubelet,
# cAdvisor, node exporter and blackbox exporter. Anything else is almost certainly a typo.
METRIC_NAME = re.compile(
    r"^(?:DCGM_FI_[A-Z0-9_]+"
    r"|vllm:[a-z0-9_]+"
    r"|tgi_[a-z0-9_]+"
    r"|nv_[a-z0-9_]+"
    r"|kube_[a-z0-9_]+"
    r"|kubelet_[a-z0-9_]+"
    r"|prober_[a-z0-9_]+"
    r"|container_[a-z0-9_]+"
    r"|node_[A-Za-z0-9_]+"
    r"|probe_[a-z0-9_]+)$"
)

# Sections every body must have, as second-level headings, in this order.
REQUIRED_SECTIONS: tuple[str, ...] = (
    "What it means",
    "Why it happens",
    "How to confirm",
    "Remediation",
    "Prevention",
)

_KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
_EVENT_REASON = re.compile(r"^[A-Z][A-Za-z]+$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*\n?(.*)\Z", re.DOTALL)


class PlaybookRef(BaseModel):
    """One remediation step a runbook proposes.

    Attributes:
        name: a playbook registry name (see :data:`PLAYBOOK_DEFAULT_LEVELS`).
        level: 1 automatic, 2 after human approval, 3 page a human; never below the default.
        params: playbook parameters, validated by the playbook itself before it runs.
        when: anomaly signals of which at least one must be firing in the incident for this playbook to
            be proposed; empty: always. A remedy that costs capacity (draining a replica of a throttled
            GPU) is worth it only once users feel the fault; before that the runbook's next playbook
            is proposed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    level: int = Field(ge=1, le=3)
    params: dict[str, Any] = Field(default_factory=dict)
    when: tuple[str, ...] = ()

    def applies(self, signals: Collection[str]) -> bool:
        """Whether the incident's firing ``signals`` allow this playbook (see ``when``)."""
        return not self.when or any(s in signals for s in self.when)

    @model_validator(mode="after")
    def _known_and_not_weakened(self) -> PlaybookRef:
        default = PLAYBOOK_DEFAULT_LEVELS.get(self.name)
        if default is None:
            known = ", ".join(sorted(PLAYBOOK_DEFAULT_LEVELS))
            raise ValueError(f"unknown playbook {self.name!r}; known: {known}")
        if self.level < default:
            raise ValueError(f"playbook {self.name!r} has level {self.level}, below its default {default}")
        return self


class Signals(BaseModel):
    """How the failure mode shows up in telemetry.

    Attributes:
        metrics: exact metric names (``DCGM_FI_*``, ``vllm:*``, ``kube_*``...).
        logs: drain3-style log templates, ``<*>`` for variable parts.
        events: Kubernetes event reasons (``NodeNotReady``, ``FailedScheduling``...).
        xid: NVIDIA XID codes, when the failure mode is one.
        anomalies: detector signal names (``Anomaly.signal``), snake_case. Which signals exist is declared
            by the detectors; services do not import them, so the entrypoints check the names with
            :func:`check_anomaly_signals` against the catalog derived from the detectors.
        scope: the blast radius it shows, when that tells it apart: ``pod`` (one replica), ``deployment``
            (the replicas of one deployment, across nodes) or ``node`` (the replicas of several deployments
            on one node). A network fault on a node slows every model there; a bad release slows one
            model wherever it runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    metrics: tuple[str, ...] = Field(min_length=1)
    logs: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    xid: tuple[int, ...] = ()
    anomalies: tuple[str, ...] = ()
    scope: tuple[Literal["pod", "deployment", "node"], ...] = ()

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not METRIC_NAME.match(name)]
        if bad:
            raise ValueError(f"metric names not of a known family: {bad}")
        return value

    @field_validator("events")
    @classmethod
    def _event_reasons(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [reason for reason in value if not _EVENT_REASON.match(reason)]
        if bad:
            raise ValueError(f"event reasons must be CamelCase Kubernetes reasons: {bad}")
        return value

    @field_validator("xid")
    @classmethod
    def _xid_codes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [code for code in value if code <= 0]
        if bad:
            raise ValueError(f"XID codes must be positive: {bad}")
        return value

    @field_validator("anomalies")
    @classmethod
    def _anomaly_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not _SNAKE.match(name)]
        if bad:
            raise ValueError(f"anomaly signals must be snake_case signal names: {bad}")
        return value


class Runbook(BaseModel):
    """One failure mode: how to recognise it, what to do, and the prose behind it.

    Attributes:
        id: unique kebab-case id, equal to the file name without ``.md``.
        title: one line for humans.
        area: the folder the file lives in (``gpu``, ``serving``, ``kubernetes``...).
        root_cause: snake_case root-cause category, unique across runbooks; diagnoses cite it.
        severity: ``info``, ``warning`` or ``critical``.
        symptoms: short phrases an on-call engineer would notice.
        signals: the telemetry that identifies it.
        playbooks: remediation, most appropriate first.
        references: documentation URLs.
        body: the markdown after the front matter.
        path: the file it was read from.
    """

    # Unknown keys are rejected (unlike events): in a hand-written file an unknown key is a typo.
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    title: str = Field(min_length=1)
    area: str
    root_cause: str
    severity: Literal["info", "warning", "critical"]
    symptoms: tuple[str, ...] = Field(min_length=1)
    signals: Signals
    playbooks: tuple[PlaybookRef, ...] = Field(min_length=1)
    references: tuple[str, ...] = ()
    body: str
    path: Path

    @field_validator("id", "area")
    @classmethod
    def _kebab(cls, value: str) -> str:
        if not _KEBAB.match(value):
            raise ValueError(f"{value!r} is not kebab-case")
        return value

    @field_validator("root_cause")
    @classmethod
    def _snake(cls, value: str) -> str:
        if not _SNAKE.match(value):
            raise ValueError(f"{value!r} is not snake_case")
        return value

    @field_validator("references")
    @classmethod
    def _urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [url for url in value if not url.startswith(("https://", "http://"))]
        if bad:
            raise ValueError(f"references must be URLs: {bad}")
        return value

    @model_validator(mode="after")
    def _matches_its_file(self) -> Runbook:
        if self.id != self.path.stem:
            raise ValueError(f"id {self.id!r} differs from the file slug {self.path.stem!r}")
        if self.area != self.path.parent.name:
            raise ValueError(f"area {self.area!r} differs from the folder {self.path.parent.name!r}")
        missing = missing_sections(self.body)
        if missing:
            raise ValueError(f"body lacks the sections: {', '.join(missing)}")
        return self

    def text(self) -> str:
        """Return the text to index for retrieval: title, symptoms and body."""
        symptoms = "\n".join(f"- {symptom}" for symptom in self.symptoms)
        return f"# {self.title}\n\nSymptoms:\n{symptoms}\n\n{self.body}"


def split_front_matter(text: str, path: Path) -> tuple[dict[str, Any], str]:
    """Split a markdown file into its YAML front matter (as a mapping) and its body.

    Args:
        text: the whole file.
        path: where it came from, for error messages.

    Returns:
        The parsed front matter and the body, stripped.

    Raises:
        ConfigError: there is no ``---`` delimited front matter, it is not YAML, or not a mapping.
    """
    normalised = text.lstrip("\ufeff").replace("\r\n", "\n")
    match = _FRONT_MATTER.match(normalised)
    if match is None:
        raise ConfigError(f"{path}: no YAML front matter between '---' lines at the top of the file")
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: front matter is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: front matter must be a mapping, got {type(data).__name__}")
    return data, match.group(2).strip()


def missing_sections(body: str) -> list[str]:
    """Return the required ``##`` sections the body lacks (prefix match, so "Remediation steps" counts).

    Args:
        body: runbook markdown without front matter.
    """
    headings = [line[3:].strip().lower() for line in body.splitlines() if line.startswith("## ")]
    return [
        section for section in REQUIRED_SECTIONS if not any(heading.startswith(section.lower()) for heading in headings)
    ]


def load_runbook(path: Path) -> Runbook:
    """Read and validate one runbook file.

    Args:
        path: a ``<area>/<slug>.md`` file.

    Raises:
        ConfigError: the file cannot be read or any field is invalid; the message names the file.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read runbook: {exc}") from exc
    data, body = split_front_matter(text, path)
    for reserved in ("body", "path"):
        if reserved in data:
            raise ConfigError(f"{path}: {reserved!r} is not a front-matter key")
    try:
        return Runbook.model_validate({**data, "body": body, "path": path})
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid runbook: {_describe(exc)}") from exc


def load_runbooks(root: Path) -> list[Runbook]:
    """Load every runbook under ``root`` (``root/<area>/<slug>.md``), sorted by path.

    Ids and root causes must be unique across the set, since diagnoses refer to runbooks by them.

    Args:
        root: the runbooks folder, usually ``knowledge/runbooks``.

    Raises:
        ConfigError: the folder is missing or empty, a runbook is invalid, or two runbooks share an id
            or a root cause; the message names the file(s).
    """
    if not root.is_dir():
        raise ConfigError(f"{root}: runbook folder does not exist")
    paths = sorted(root.glob("*/*.md"))
    if not paths:
        raise ConfigError(f"{root}: no runbooks found (expected <area>/<slug>.md files)")
    runbooks = [load_runbook(path) for path in paths]
    _check_unique(runbooks, "id", (rb.id for rb in runbooks))
    _check_unique(runbooks, "root_cause", (rb.root_cause for rb in runbooks))
    return runbooks


def check_anomaly_signals(runbooks: Iterable[Runbook], known: Collection[str]) -> None:
    """Fail when a runbook names an anomaly signal that nothing emits (in its signals or a playbook's ``when``).

    Such a signal would never match, and nobody would notice: the runbook would only look weaker (its
    signal vector is longer). ``known`` is what the detectors declare (the CLI passes
    ``pipelines.detectors.registry.signal_catalog()``).

    Raises:
        ConfigError: one line per runbook file and signal.
    """
    problems = [
        f"{rb.path}: signals.anomalies names {signal!r}, which no detector emits"
        for rb in runbooks
        for signal in rb.signals.anomalies
        if signal not in known
    ] + [
        f"{rb.path}: playbook {p.name} is proposed only when {signal!r} fires, which no detector emits"
        for rb in runbooks
        for p in rb.playbooks
        for signal in p.when
        if signal not in known
    ]
    if problems:
        raise ConfigError("\n".join([*problems, f"signals the detectors emit: {', '.join(sorted(known))}"]))


def _check_unique(runbooks: list[Runbook], field: str, values: Iterable[str]) -> None:
    seen: dict[str, Path] = {}
    for runbook, value in zip(runbooks, values, strict=True):
        if value in seen:
            raise ConfigError(f"{runbook.path}: {field} {value!r} is already used by {seen[value]}")
        seen[value] = runbook.path


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "runbook"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
