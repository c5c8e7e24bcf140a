"""The playbook and actuator registries: one line per plugin, loaded lazily.

The playbook names are the ones the runbooks' front matter uses (see
``services.diagnostician.runbooks.PLAYBOOK_DEFAULT_LEVELS``); a unit test checks both agree.
"""

from __future__ import annotations

from services.core.registry import Registry
from services.remediation.actuators.base import Actuator
from services.remediation.playbook import Playbook

PLAYBOOK_ENTRIES: dict[str, str] = {
    "restart_pod": "services.remediation.playbooks.restart_pod:RestartPodPlaybook",
    "rollout_restart": "services.remediation.playbooks.rollout_restart:RolloutRestartPlaybook",
    "drain_replica": "services.remediation.playbooks.drain_replica:DrainReplicaPlaybook",
    "reduce_max_num_seqs": "services.remediation.playbooks.reduce_max_num_seqs:ReduceMaxNumSeqsPlaybook",
    "switch_variant": "services.remediation.playbooks.switch_variant:SwitchVariantPlaybook",
    "scale_replicas": "services.remediation.playbooks.scale_replicas:ScaleReplicasPlaybook",
    "cordon_node": "services.remediation.playbooks.cordon_node:CordonNodePlaybook",
    "evict_gpu_pods": "services.remediation.playbooks.evict_gpu_pods:EvictGpuPodsPlaybook",
    "uncordon_node": "services.remediation.playbooks.uncordon_node:UncordonNodePlaybook",
    "drain_node": "services.remediation.playbooks.drain_node:DrainNodePlaybook",
    "reset_gpu": "services.remediation.playbooks.reset_gpu:ResetGpuPlaybook",
    "reboot_node": "services.remediation.playbooks.reboot_node:RebootNodePlaybook",
    "rollback_deployment": "services.remediation.playbooks.rollback_deployment:RollbackDeploymentPlaybook",
    "page_oncall": "services.remediation.playbooks.page_oncall:PageOncallPlaybook",
}

ACTUATOR_ENTRIES: dict[str, str] = {
    "simulator": "services.remediation.actuators.simulator:SimulatorActuator",
    "kubernetes": "services.remediation.actuators.kubernetes:KubernetesActuator",
}


def playbook_registry() -> Registry[type[Playbook]]:
    """A registry of the shipped playbooks (classes; instantiate with no arguments)."""
    return Registry("playbook", PLAYBOOK_ENTRIES, base=Playbook)


def actuator_registry() -> Registry[type[Actuator]]:
    """A registry of the shipped actuators."""
    return Registry("actuator", ACTUATOR_ENTRIES, base=Actuator)


def load_playbook(registry: Registry[type[Playbook]], name: str) -> Playbook:
    """Load and instantiate the playbook registered under ``name``."""
    return registry.load(name)()
