"""Playbook registry, parameters, prechecks and steps against an in-memory actuator."""

from __future__ import annotations

from typing import Any

import pytest

from services.remediation.actuators.base import Actuator, ObjectKind
from services.remediation.config import load_config
from services.remediation.errors import ParamsError
from services.remediation.model import ActionOutcome, ActionSpec, VerifySpec
from services.remediation.playbook import Playbook
from services.remediation.registry import actuator_registry, load_playbook, playbook_registry


class MemoryActuator(Actuator):
    """A tiny in-memory world: enough for prechecks and checks."""

    name = "memory"
    operations = frozenset(
        {"cordon_node", "uncordon_node", "drain_node", "reboot_node", "delete_pod", "scale", "set_max_num_seqs"}
    )

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {
            ("node", "n1"): {
                "ready": True,
                "schedulable": True,
                "rebooting": False,
                "pods": 2,
                "unhealthy_gpus": 1,
                "failed_gpu_pods": [{"pod": "llama-7d9f-a", "namespace": "ns", "deployment": "llama", "ready": False}],
            },
            ("gpu", "GPU-1"): {"node": "n1", "healthy": False, "xid": 79},
            ("deployment", "llama"): {"replicas": 2, "ready": 2, "max_num_seqs": 256, "variant": "v1", "revision": 1},
        }
        self.done: list[ActionSpec] = []

    def act(self, action: ActionSpec) -> ActionOutcome:
        self.done.append(action)
        return ActionOutcome()

    def describe(self, kind: ObjectKind, name: str, namespace: str = "") -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def clock(self) -> float:
        return 0.0


def test_every_registered_playbook_and_actuator_loads_and_names_match_the_runbooks():
    registry = playbook_registry()
    for name in registry:
        cls = registry.load(name)
        assert issubclass(cls, Playbook)
        assert cls.name == name, f"{cls.__name__}.name is {cls.name!r}, registered as {name!r}"
        assert len(cls.description()) > 40, f"{name} needs a docstring humans and the LLM can read"
    for name in actuator_registry():
        assert issubclass(actuator_registry().load(name), Actuator)


def test_every_xid_mapping_names_a_registered_playbook_at_least_its_default_level():
    cfg = load_config()
    registry = playbook_registry()
    for action, target in cfg.xid.actions.items():
        if target is None:
            continue
        assert target.playbook in registry, action
        assert target.level >= registry.load(target.playbook).level, action
    assert cfg.xid.for_code(79) is not None and cfg.xid.for_code(79).playbook == "reboot_node"
    assert cfg.xid.for_code(13) is not None and cfg.xid.for_code(13).level == 1
    assert cfg.xid.for_code(43) is None  # IGNORE


def test_params_are_validated_before_anything_runs():
    pb = load_playbook(playbook_registry(), "scale_replicas")
    with pytest.raises(ParamsError, match="replicas"):
        pb.parse({"deployment": "llama", "replicas": -1})
    with pytest.raises(ParamsError, match="Extra inputs"):
        pb.parse({"deployment": "llama", "replicas": 1, "replcias": 2})
    with pytest.raises(ParamsError, match="node or gpu"):
        load_playbook(playbook_registry(), "reboot_node").parse({})


def test_reboot_node_resolves_the_gpu_node_and_drains_before_rebooting_and_uncordons_on_rollback():
    pb = load_playbook(playbook_registry(), "reboot_node")
    act = MemoryActuator()
    params = pb.parse({"gpu": "GPU-1"})
    pre = pb.precheck(params, act)
    assert pre.ok and pre.observed["node"] == "n1"
    steps = pb.steps(params, pre.observed)
    assert [s.name for s in steps] == ["cordon", "drain", "reboot", "uncordon"]
    assert [s.action.op for s in steps if s.action] == ["cordon_node", "drain_node", "reboot_node", "uncordon_node"]
    assert steps[2].verify == VerifySpec(check="node_ready", target="n1", params={"gpus_healthy": True})
    assert [s.action.op for s in pb.rollback(params, pre.observed) if s.action] == ["uncordon_node"]
    assert act.done == [], "a precheck must not act"


def test_precheck_refuses_what_the_actuator_cannot_do_and_what_is_already_so():
    act = MemoryActuator()
    reset = load_playbook(playbook_registry(), "reset_gpu")
    pre = reset.precheck(reset.parse({"gpu": "GPU-1"}), act)
    assert not pre.ok and "reset_gpu" in pre.reason
    scale = load_playbook(playbook_registry(), "scale_replicas")
    assert not scale.precheck(scale.parse({"deployment": "llama", "replicas": 2}), act).ok
    pre = scale.precheck(scale.parse({"deployment": "llama", "replicas": 4}), act)
    assert pre.ok and pre.observed == {"replicas": 2, "target": 4}
    rb = scale.rollback(scale.parse({"deployment": "llama", "replicas": 4}), pre.observed)
    assert rb[0].action is not None and rb[0].action.params == {"replicas": 2}


def test_a_relative_scale_counts_from_the_current_replicas():
    # what a diagnosis proposes: one more replica, whatever the count is now
    act = MemoryActuator()
    scale = load_playbook(playbook_registry(), "scale_replicas")
    params = scale.parse({"deployment": "llama", **scale.proposed})
    pre = scale.precheck(params, act)
    assert pre.ok and pre.observed == {"replicas": 2, "target": 3}
    step = scale.steps(params, pre.observed)[0]
    assert step.action is not None and step.action.params == {"replicas": 3}
    assert step.verify is not None and step.verify.params == {"replicas": 3}
    assert not scale.precheck(scale.parse({"deployment": "llama", "by": -3}), act).ok
    for both_or_neither in ({"deployment": "llama"}, {"deployment": "llama", "replicas": 3, "by": 1}):
        with pytest.raises(ParamsError, match="exactly one"):
            scale.parse(both_or_neither)


def test_shared_checks_read_the_normalised_views():
    act = MemoryActuator()
    assert not act.check(VerifySpec(check="node_ready", target="n1", params={"gpus_healthy": True})).ok
    assert act.check(VerifySpec(check="node_ready", target="n1")).ok
    assert not act.check(VerifySpec(check="node_drained", target="n1")).ok
    assert act.check(VerifySpec(check="deployment_ready", target="llama", params={"max_num_seqs": 256})).ok
    assert not act.check(VerifySpec(check="deployment_ready", target="llama", params={"replicas": 3})).ok
    assert not act.check(VerifySpec(check="gpu_healthy", target="GPU-1")).ok


def test_page_oncall_has_no_steps():
    pb = load_playbook(playbook_registry(), "page_oncall")
    assert pb.level == 3
    assert pb.steps(pb.parse({"summary": "x"}), {}) == []


def test_slack_signature_is_hmac_of_v0_timestamp_body_and_stale_requests_are_refused():
    from services.remediation.errors import SignatureError
    from services.remediation.slack import sign, verify_signature

    body = b"payload=%7B%7D"
    good = sign("secret", "1700000000", body)
    verify_signature("secret", "1700000000", body, good, now=1_700_000_299)
    for args in [
        ("secret", "1700000000", body + b"x", good, 1_700_000_000),  # tampered body
        ("other", "1700000000", body, good, 1_700_000_000),  # wrong secret
        ("secret", "1700000000", body, good, 1_700_000_301),  # too old
        ("secret", "1700000000", body, good, 1_699_999_699),  # from the future
        ("", "1700000000", body, good, 1_700_000_000),  # no secret configured
        ("secret", None, body, good, 1_700_000_000),
    ]:
        with pytest.raises(SignatureError):
            verify_signature(*args[:4], now=args[4])


@pytest.mark.parametrize("name", ["cordon_node", "evict_gpu_pods", "drain_node", "reboot_node"])
def test_a_node_a_human_cordoned_before_the_run_stays_cordoned_on_rollback_and_on_success(name: str):
    pb = load_playbook(playbook_registry(), name)
    act = MemoryActuator()
    params = pb.parse({"node": "n1"})
    pre = pb.precheck(params, act)
    assert pre.ok and pre.observed["schedulable"] is True
    assert [s.action.op for s in pb.rollback(params, pre.observed) if s.action] == ["uncordon_node"]

    act.objects[("node", "n1")]["schedulable"] = False  # a human cordoned it before the run
    pre = pb.precheck(params, act)
    assert pre.ok and pre.observed["schedulable"] is False
    assert pb.rollback(params, pre.observed) == [], "the rollback would uncordon a node a human had cordoned"
    ops = [s.action.op for s in pb.steps(params, pre.observed) if s.action]
    assert "uncordon_node" not in ops, f"{name} would end by uncordoning a node a human had cordoned: {ops}"


def test_a_node_rollback_whose_pre_run_state_is_unknown_leaves_the_node_cordoned():
    pb = load_playbook(playbook_registry(), "drain_node")
    assert pb.rollback(pb.parse({"node": "n1"}), {"node": "n1"}) == []


def test_uncordon_rollback_cordons_again_only_a_node_that_was_cordoned_before():
    pb = load_playbook(playbook_registry(), "uncordon_node")
    act = MemoryActuator()
    params = pb.parse({"node": "n1"})
    assert pb.rollback(params, pb.precheck(params, act).observed) == [], "it was schedulable: nothing to restore"
    act.objects[("node", "n1")]["schedulable"] = False
    rb = pb.rollback(params, pb.precheck(params, act).observed)
    assert [s.action.op for s in rb if s.action] == ["cordon_node"]


def test_a_relative_max_num_seqs_halves_the_current_value():
    act = MemoryActuator()
    reduce = load_playbook(playbook_registry(), "reduce_max_num_seqs")
    params = reduce.parse({"deployment": "llama", **reduce.proposed})
    pre = reduce.precheck(params, act)
    assert pre.ok and pre.observed == {"max_num_seqs": 256, "target": 128}
    step = reduce.steps(params, pre.observed)[0]
    assert step.action is not None and step.action.params == {"max_num_seqs": 128}
    assert not reduce.precheck(reduce.parse({"deployment": "llama", "max_num_seqs": 300}), act).ok


def test_every_playbook_accepts_what_a_diagnosis_proposes_for_it():
    # the catalog's targets and proposed parameters are read from the classes: together they validate
    from services.remediation.catalog import playbook_catalog

    values = {"pod": "llama-0", "deployment": "llama", "node": "n1", "gpu": "GPU-1", "namespace": "serving"}
    for name, info in playbook_catalog().items():
        params = {k: values[k] for k in info.targets} | dict(info.proposed)
        problem = info.params_error(params)
        assert not problem or name == "switch_variant", problem  # a variant cannot be guessed
        assert info.level == load_playbook(playbook_registry(), name).level


def test_evict_gpu_pods_cordons_then_replaces_only_the_pods_a_failed_gpu_took_down():
    pb = load_playbook(playbook_registry(), "evict_gpu_pods")
    act = MemoryActuator()
    act.objects[("node", "n1")]["failed_gpu_pods"] += [
        {"pod": "llama-7d9f-b", "namespace": "ns", "deployment": "llama", "ready": True},  # still serving
        {"pod": "debug-shell", "namespace": "ns", "deployment": "", "ready": False},  # nothing would recreate it
        {"pod": "gone-7d9f-c", "namespace": "ns", "deployment": "gone", "ready": False},  # its Deployment is gone
    ]
    params = pb.parse({"gpu": "GPU-1"})  # an XID alert's entity: the node is looked up
    pre = pb.precheck(params, act)
    assert act.done == [], "a precheck must not act"
    assert pre.ok and pre.observed["node"] == "n1" and pre.observed["schedulable"] is True
    assert pre.observed["evict"] == [{"pod": "llama-7d9f-a", "namespace": "ns", "deployment": "llama"}]
    assert [k["pod"] for k in pre.observed["kept"]] == ["llama-7d9f-b", "debug-shell", "gone-7d9f-c"]

    steps = pb.steps(params, pre.observed)
    assert [s.name for s in steps] == ["cordon", "evict llama-7d9f-a", "replaced llama"]
    assert [(s.action.op, s.action.target, s.action.namespace) for s in steps if s.action] == [
        ("cordon_node", "n1", ""),
        ("delete_pod", "llama-7d9f-a", "ns"),
    ]
    assert steps[1].verify == VerifySpec(check="pod_gone", target="llama-7d9f-a", namespace="ns")
    # the replacement: a step that only verifies, with time for a large model to load elsewhere
    assert steps[2].action is None and steps[2].timeout_s == params.ready_timeout_s >= 900
    assert steps[2].verify == VerifySpec(check="deployment_ready", target="llama", namespace="ns")
    # a failed verification uncordons the node it cordoned; a deleted pod stays deleted
    assert [(s.action.op, s.action.target) for s in pb.rollback(params, pre.observed) if s.action] == [
        ("uncordon_node", "n1")
    ]
    targets = pb.targets(params)
    assert targets.gpus == ("GPU-1",) and targets.replicas_out == 0  # it takes no serving replica away


def test_evict_gpu_pods_with_nothing_to_evict_is_a_cordon_and_two_pods_of_one_deployment_verify_once():
    pb = load_playbook(playbook_registry(), "evict_gpu_pods")
    act = MemoryActuator()
    params = pb.parse({"node": "n1"})
    act.objects[("node", "n1")]["failed_gpu_pods"] = []
    pre = pb.precheck(params, act)
    assert pre.ok and [s.name for s in pb.steps(params, pre.observed)] == ["cordon"]
    act.objects[("node", "n1")]["failed_gpu_pods"] = [
        {"pod": f"llama-7d9f-{c}", "namespace": "ns", "deployment": "llama", "ready": False} for c in "ab"
    ]
    steps = pb.steps(params, pb.precheck(params, act).observed)
    assert [s.name for s in steps] == ["cordon", "evict llama-7d9f-a", "evict llama-7d9f-b", "replaced llama"]


def test_evict_gpu_pods_refuses_what_it_cannot_see_or_should_not_do_alone():
    from services.remediation.playbooks.evict_gpu_pods import MAX_PODS

    pb = load_playbook(playbook_registry(), "evict_gpu_pods")
    params = pb.parse({"node": "n1"})
    act = MemoryActuator()
    del act.objects[("node", "n1")]["failed_gpu_pods"]  # an actuator that cannot tell which pods a GPU holds
    pre = pb.precheck(params, act)
    assert not pre.ok and "cannot tell" in pre.reason
    act = MemoryActuator()
    act.objects[("node", "n1")]["failed_gpu_pods"] = [
        {"pod": f"llama-{i}", "namespace": "ns", "deployment": "llama", "ready": False} for i in range(MAX_PODS + 1)
    ]
    pre = pb.precheck(params, act)
    assert not pre.ok and "drain the node" in pre.reason
    act.operations = frozenset(act.operations - {"delete_pod"})
    pre = pb.precheck(params, act)
    assert not pre.ok and "delete_pod" in pre.reason
    assert act.done == []
