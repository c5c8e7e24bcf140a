"""Policy and guardrails: from a diagnosis to a :class:`~services.remediation.model.Decision`. Pure.

Nothing here does I/O or reads a clock: the caller passes the policy, the registry, a
:class:`GuardrailState` snapshot (recent runs, from the store) and ``now``. The stages, in order:

1. the proposal must name a registered playbook with valid parameters (else ``dropped``);
2. the level is the playbook's, raised (never lowered) by the diagnosis; level 3 -> ``page``;
   a level above the policy's ``max_level`` -> ``dropped``: it never executes;
3. the kill switch blocks everything;
4. a level above ``max_auto_level`` -> ``await_approval``; so does a level-1 run in a maintenance window;
5. automatic runs only: an open circuit breaker -> ``page``;
6. cooldown per target, global rate limit and blast radius -> ``blocked``.

A decision is only a forecast: the world moves while a run waits in a queue or for an approval. The
executor asks again, inside the Postgres transaction that moves the run to ``running`` and under one
advisory lock (:func:`start_blocks`: kill switch, circuit breaker, cooldown, rate limit, blast radius),
and before each action (:func:`act_blocks`: kill switch, circuit breaker).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.core.events import Diagnosis
from services.core.registry import Registry
from services.remediation.config import PolicyConfig, PolicySpec
from services.remediation.errors import ParamsError
from services.remediation.model import Decision, Targets
from services.remediation.playbook import Playbook

# Run statuses that mean the run changed (or was about to change) the world.
ACTED = frozenset({"running", "succeeded", "failed", "rolled_back"})
FAILED = frozenset({"failed", "rolled_back"})


class RunSummary(BaseModel):
    """What guardrails need to know about one recent run."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    playbook: str
    status: str
    incident_id: str = ""
    automatic: bool = True
    started_at: float | None = None
    finished_at: float | None = None
    targets: Targets = Field(default_factory=Targets)
    rollback_pending: bool = Field(default=False, description="failed, and its rollback is still to do")
    refused: bool = Field(default=False, description="failed at its precheck: it never acted")


class KillSwitch(BaseModel):
    """The live kill switch (stored in Postgres, flipped with ``medic remediation kill-switch``)."""

    model_config = ConfigDict(frozen=True)

    set_by: str
    reason: str = ""
    since: float = 0.0


class GuardrailState(BaseModel):
    """A snapshot of recent runs (dry runs left out: they change nothing), deployment sizes, the kill switch."""

    model_config = ConfigDict(frozen=True)

    runs: tuple[RunSummary, ...] = ()
    deployment_replicas: dict[str, int] = Field(default_factory=dict, description="'ns/name' -> replicas")
    kill_switch: KillSwitch | None = Field(default=None, description="None: off")


def scope_of(playbook: str, targets: Targets) -> dict[str, str]:
    """The policy scope of a run: namespace, model (the deployment when no model is known), playbook."""
    return {"namespace": targets.namespace, "model": targets.model or targets.deployment, "playbook": playbook}


def _failures(policy: PolicySpec, state: GuardrailState, now: float) -> list[RunSummary]:
    """The recent automatic runs that acted and failed. A run its precheck refused changed nothing (the
    playbook found nothing to do, or the actuator cannot do it): a guardrail working, not automation
    misbehaving, so it does not count."""
    window = policy.circuit_breaker.window_s
    return [
        r
        for r in state.runs
        if r.automatic
        and r.status in FAILED
        and not r.refused
        and (r.finished_at or r.started_at or 0.0) >= now - window
    ]


def incident_busy(incident_id: str, state: GuardrailState, *, exclude_run: str = "") -> list[str]:
    """Why an automatic run of this incident may not start while another of its runs is in flight.

    One remedy at a time per incident: a second one stacked on a run still verifying acts on a
    cluster the first is changing (a replica drained while the GPU's pods are being evicted), and
    neither run's verification then says what it did. A later diagnosis proposes it again once the
    first run has finished. Nor is a level-2 run put to a human while one is in flight (the decision
    is ``blocked``); one a human already approved is not held at its start: the engineer decided.
    """
    if not incident_id:
        return []
    busy = [r for r in state.runs if r.incident_id == incident_id and r.status == "running" and r.run_id != exclude_run]
    return [f"incident {incident_id} has {r.playbook} run {r.run_id} in flight" for r in busy[:1]]


def circuit_open(policy: PolicySpec, state: GuardrailState, now: float) -> bool:
    """Whether enough automatic runs failed recently to stop automatic remediation."""
    return len(_failures(policy, state, now)) >= policy.circuit_breaker.max_failures


def check_guardrails(
    targets: Targets,
    policy: PolicySpec,
    state: GuardrailState,
    now: float,
    *,
    exclude_run: str = "",
) -> list[str]:
    """Reasons the cooldown, the rate limit or the blast radius forbid acting now (empty: go).

    Args:
        targets: what the run would touch.
        policy: the policy in force for its scope.
        state: recent runs; ``exclude_run`` (the run being checked) is ignored in it.
        now: UNIX seconds.
    """
    reasons: list[str] = []
    runs = [r for r in state.runs if r.run_id != exclude_run]
    keys = set(targets.keys())
    if policy.cooldown_s > 0 and keys:
        for r in runs:
            if r.status in ACTED and r.started_at is not None and r.started_at >= now - policy.cooldown_s:
                overlap = keys & set(r.targets.keys())
                if overlap:
                    reasons.append(
                        f"cooldown: {sorted(overlap)[0]} was remediated by {r.run_id} {now - r.started_at:.0f} s ago "
                        f"(cooldown {policy.cooldown_s:.0f} s)"
                    )
                    break
    rl = policy.rate_limit
    recent = [r for r in runs if r.status in ACTED and r.started_at is not None and r.started_at >= now - rl.window_s]
    if len(recent) >= rl.max_runs:
        reasons.append(f"rate limit: {len(recent)} runs in the last {rl.window_s:.0f} s (max {rl.max_runs})")
    br = policy.blast_radius
    # a failed run whose rollback is still to do is still out there touching its targets
    active = [r for r in runs if r.status == "running" or r.rollback_pending]
    if targets.nodes:
        busy = {n for r in active for n in r.targets.nodes} | set(targets.nodes)
        if len(busy) > br.max_nodes:
            reasons.append(f"blast radius: {len(busy)} nodes would be under remediation at once (max {br.max_nodes})")
    if targets.replicas_out and targets.deployment:
        same = [
            r for r in active if r.targets.deployment == targets.deployment and r.targets.namespace == targets.namespace
        ]
        out = targets.replicas_out + sum(r.targets.replicas_out for r in same)
        if out > br.max_replicas:
            reasons.append(f"blast radius: {out} replicas of {targets.deployment} out at once (max {br.max_replicas})")
        size = state.deployment_replicas.get(f"{targets.namespace}/{targets.deployment}")
        if size and out > br.max_fraction * size:
            reasons.append(f"blast radius: {out}/{size} replicas of {targets.deployment} is over {br.max_fraction:.0%}")
    return reasons


def kill_switch_reasons(policy: PolicySpec, state: GuardrailState) -> list[str]:
    """Why the kill switch forbids acting (empty: it is off): the YAML one for this scope, or the live one."""
    reasons = ["kill switch is on"] if policy.kill_switch else []
    if state.kill_switch is not None:
        ks = state.kill_switch
        reasons.append(f"kill switch is on (set by {ks.set_by}" + (f": {ks.reason})" if ks.reason else ")"))
    return reasons


def breaker_reasons(
    policy: PolicySpec, state: GuardrailState, now: float, *, automatic: bool, in_flight_of: str | None = None
) -> list[str]:
    """Why the circuit breaker forbids an automatic run (empty: closed, or the run was approved by a human).

    Args:
        in_flight_of: when a run starts, its id: every *other* automatic run still running counts as a
            failure that may yet happen. Otherwise five runs started together before any failed would
            all act, although the breaker allows three to fail; counted this way, no more than
            ``max_failures`` automatic runs can fail before the breaker opens. (So at most that many
            automatic runs are in flight at once.)
    """
    if not automatic:
        return []
    cb = policy.circuit_breaker
    if circuit_open(policy, state, now):
        return [f"circuit breaker open: {cb.max_failures}+ automatic runs failed in {cb.window_s:.0f} s"]
    if in_flight_of is None:
        return []
    failed = _failures(policy, state, now)
    running = [r for r in state.runs if r.automatic and r.status == "running" and r.run_id != in_flight_of]
    if len(failed) + len(running) >= cb.max_failures:
        return [
            f"circuit breaker: {len(failed)} automatic runs failed in {cb.window_s:.0f} s and {len(running)} are"
            f" still running; at most {cb.max_failures} may fail before it opens"
        ]
    return []


def start_blocks(
    run_id: str,
    targets: Targets,
    policy: PolicySpec,
    state: GuardrailState,
    now: float,
    *,
    automatic: bool,
    incident_id: str = "",
) -> list[str]:
    """Why a proposed or approved run may not start now (empty: go).

    Called inside the transaction that moves the run to ``running``, under the guardrail lock, so
    ``state`` is exactly what every other starting run sees: two runs cannot both take the last slot.

    Args:
        run_id: the run being started (left out of ``state``).
        targets: what it would touch.
        policy: the policy in force for its scope.
        state: recent runs and the live kill switch, read in the same transaction.
        now: UNIX seconds.
        automatic: False for a run a human approved (the circuit breaker and the one-run-per-incident
            rule hold automatic runs only).
        incident_id: the run's incident (:func:`incident_busy`).
    """
    return (
        kill_switch_reasons(policy, state)
        + breaker_reasons(policy, state, now, automatic=automatic, in_flight_of=run_id)
        + (incident_busy(incident_id, state, exclude_run=run_id) if automatic else [])
        + check_guardrails(targets, policy, state, now, exclude_run=run_id)
    )


def act_blocks(policy: PolicySpec, state: GuardrailState, now: float, *, automatic: bool) -> list[str]:
    """Why a running run must stop before its next action (empty: go on): kill switch, circuit breaker.

    Cooldown, rate limit and blast radius are not asked again: the run already holds its slot, and
    runs admitted after it counted it.
    """
    return kill_switch_reasons(policy, state) + breaker_reasons(policy, state, now, automatic=automatic)


def proposal_of(diagnosis: Diagnosis) -> tuple[str | None, dict[str, Any], int | None]:
    """The playbook, params and level a diagnosis proposes (the top hypothesis when none is explicit)."""
    if diagnosis.proposed_playbook:
        return diagnosis.proposed_playbook, dict(diagnosis.proposed_params), diagnosis.level
    for hyp in diagnosis.hypotheses:
        if hyp.playbook:
            return hyp.playbook, dict(diagnosis.proposed_params), hyp.level or diagnosis.level
    return None, {}, diagnosis.level


def plan_from_diagnosis(
    diagnosis: Diagnosis,
    policy: PolicyConfig,
    registry: Registry[type[Playbook]],
    *,
    state: GuardrailState | None = None,
    now: float | None = None,
) -> Decision:
    """Decide what to do about a diagnosis's proposed playbook (see the module docstring).

    Args:
        diagnosis: the input; its proposed playbook, params and level.
        policy: defaults and per namespace / model / playbook overrides.
        registry: the playbooks that exist; anything else is dropped, never executed.
        state: recent runs for the guardrails (None: no history).
        now: UNIX seconds (default: the diagnosis timestamp).
    """
    now = diagnosis.ts if now is None else now
    state = state or GuardrailState()
    name, raw, proposed_level = proposal_of(diagnosis)
    base: dict[str, Any] = {"incident_id": diagnosis.incident_id, "decided_by": f"policy:{diagnosis.diagnostician}"}
    if name is None:
        return Decision(**base, playbook=None, outcome="dropped", reasons=("no playbook proposed",))
    if name not in registry:
        return Decision(
            **base, playbook=name, params=raw, outcome="dropped", reasons=(f"playbook {name!r} is not registered",)
        )
    playbook = registry.load(name)()
    try:
        params = playbook.parse(raw)
    except ParamsError as exc:
        return Decision(**base, playbook=name, params=raw, outcome="dropped", reasons=(str(exc),))
    targets = playbook.targets(params)
    level = max(playbook.level, proposed_level or 1)
    scope = scope_of(name, targets)
    spec = policy.resolve(scope)
    common: dict[str, Any] = {
        **base,
        "playbook": name,
        "params": params.model_dump(),
        "level": level,
        "targets": targets,
        "scope": scope,
        "dry_run": spec.dry_run,
    }
    if level >= 3:
        return Decision(**common, outcome="page", reasons=(f"level {level}: page a human, never act",))
    if level > spec.max_level:
        return Decision(
            **common, outcome="dropped", reasons=(f"level {level} is above the allowed maximum {spec.max_level}",)
        )
    if kill := kill_switch_reasons(spec, state):
        return Decision(**common, outcome="blocked", reasons=tuple(kill))
    in_window = [w for w in spec.maintenance_windows if w.contains(now)]
    busy = incident_busy(diagnosis.incident_id, state)
    if busy and (level > spec.max_auto_level or in_window):
        # a human asked to approve a second remedy while the first still acts would approve it blind
        # (the demo's approved rollback of a deployment whose lost replica was being replaced);
        # a later diagnosis proposes it again once the run has finished
        return Decision(**common, outcome="blocked", reasons=tuple(busy))
    if level > spec.max_auto_level:
        return Decision(
            **common,
            outcome="await_approval",
            reasons=(f"level {level} is above the automatic maximum {spec.max_auto_level}",),
        )
    if in_window:
        return Decision(
            **common,
            outcome="await_approval",
            reasons=(f"maintenance window {in_window[0].reason or in_window[0].start}: a human decides",),
        )
    if breaker := breaker_reasons(spec, state, now, automatic=True):
        return Decision(**common, outcome="page", reasons=tuple(breaker))
    blocks = busy + check_guardrails(targets, spec, state, now)
    if blocks:
        return Decision(**common, outcome="blocked", reasons=tuple(blocks))
    return Decision(**common, outcome="execute", reasons=(f"level {level} runs automatically",))


def policy_for(policy: PolicyConfig, playbook: str, targets: Targets) -> PolicySpec:
    """The resolved policy for a playbook acting on ``targets``."""
    return policy.resolve(scope_of(playbook, targets))


def deployment_key(namespace: str, deployment: str) -> str:
    """Key of :attr:`GuardrailState.deployment_replicas`."""
    return f"{namespace}/{deployment}"
