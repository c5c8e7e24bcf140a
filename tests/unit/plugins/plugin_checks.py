"""What an installed plugin package gets, checked in a process that has it on ``sys.path``.

Not collected on its own (its name does not start with ``test_``): tests/unit/test_plugins.py runs it
with ``tests/unit/plugins`` on ``PYTHONPATH`` and ``CLUSTERMEDIC_KB_DIR`` pointing at a copy of the
repository's knowledge plus the plugin's runbook. Nothing of ClusterMedic is edited: each plugin is one
module and one entry-point line (docs/extending.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from evals.detect import OfflineDetect
from pipelines.detect import DetectorSet
from pipelines.detectors.registry import DETECTORS, signal_catalog
from pipelines.detectors.rules_xid import XidDetector
from services.core.events import AlertRef, IncidentEvent, MetricBatch, Provenance, Sample
from services.core.settings import Settings
from services.ingest.memory import MemoryPublisher
from services.ingest.pull import Delivery
from services.ingest.registry import SOURCES
from services.ingest.sink import IngestMetrics, PublishQueue
from services.remediation.catalog import playbook_catalog
from services.remediation.registry import playbook_registry
from tests.made_up_xids import made_up_xid_catalog

UUID = "GPU-5c1f3f0e-aaaa-bbbb-cccc-00000000000a"
PACKAGE = "the package 'clustermedic-example-plugins'"
T0 = 1_760_000_000.0


def test_each_registry_takes_the_package_entry_point_beside_its_built_ins() -> None:
    from services.notify.registry import NOTIFIERS

    assert DETECTORS.origin("pcie_replay") == PACKAGE and DETECTORS.origin("xid_rules") == "built-in"
    assert playbook_registry().origin("pcie_quarantine") == PACKAGE
    assert NOTIFIERS.origin("msteams") == PACKAGE
    assert SOURCES.origin("redfish") == PACKAGE and SOURCES.origin("loki") == "built-in"


def test_the_detect_role_runs_the_detector_and_the_signal_catalog_lists_its_signal() -> None:
    built = {"xid_rules": lambda: XidDetector(made_up_xid_catalog())}  # NVIDIA's catalog is shared data
    names = [name for name in DETECTORS.names() if name != "lstm"]
    detectors = DetectorSet.of([built.get(name, DETECTORS.load(name))() for name in names])
    assert "pcie_replay" in [d.name for d in detectors.metric]  # routed by its `consumes`
    offline = OfflineDetect(detectors)
    labels = {"UUID": UUID, "gpu": "2", "Hostname": "h100-b-03", "modelName": "NVIDIA H100 80GB HBM3"}

    def scrape(replays: float, ts: float) -> MetricBatch:
        sample = Sample(name="DCGM_FI_DEV_PCIE_REPLAY_COUNTER", labels=labels, value=replays, ts=ts)
        return MetricBatch(entity=UUID, samples=(sample,))

    assert offline.feed([scrape(3.0, T0)]) == []
    (anomaly,) = offline.feed([scrape(60.0, T0 + 15)])
    assert (anomaly.signal, anomaly.entity, anomaly.labels["node"]) == ("pcie_replay_errors", UUID, "h100-b-03")
    assert anomaly.provenance.source == "dcgm"  # the role stamps it: a trusted GPU source
    assert signal_catalog()["pcie_replay_errors"] == ("pcie_replay",)


def test_the_plugin_runbook_passes_the_signal_check_and_the_cli_lists_the_signal() -> None:
    from typer.testing import CliRunner

    from services.cli import app

    result = CliRunner().invoke(app, ["detect", "signals"])  # checks CLUSTERMEDIC_KB_DIR's runbooks
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pcie_replay_errors"] == ["pcie_replay"]


def test_a_pcie_incident_is_diagnosed_from_the_plugin_runbook_and_proposes_the_plugin_playbook() -> None:
    from services.diagnostician.diagnostician import RankerDiagnostician
    from services.diagnostician.runbooks import PLAYBOOK_DEFAULT_LEVELS

    assert PLAYBOOK_DEFAULT_LEVELS["pcie_quarantine"] == 2
    info = playbook_catalog()["pcie_quarantine"]
    assert (info.level, info.targets) == (2, ("gpu", "namespace"))
    alert = AlertRef(
        provenance=Provenance(source="dcgm", stream="scrape", trusted=("gpu_fault", "topology")),
        fingerprint="pcie", entity=UUID, signal="pcie_replay_errors", detector="pcie_replay", severity="warning",
        starts_at=T0, labels={"UUID": UUID, "node": "h100-b-03", "gpu": "2"},
        evidence={"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 60.0},
    )  # fmt: skip
    incident = IncidentEvent(
        incident_id="inc-pcie", kind="opened", severity="warning", title="PCIe", alerts=(alert,), opened_at=T0, ts=T0
    )
    settings = Settings(kb_dir=Path(os.environ["CLUSTERMEDIC_KB_DIR"]))
    diagnosis = RankerDiagnostician(settings, use_database=False).diagnose(incident)
    assert diagnosis.hypotheses[0].cause == "pcie_link_degraded", diagnosis.hypotheses
    assert (diagnosis.proposed_playbook, diagnosis.level) == ("pcie_quarantine", 2)
    assert diagnosis.proposed_params["gpu"] == UUID


def test_the_playbook_parses_its_typed_params_and_plans_its_steps() -> None:
    from medic_example_plugins.quarantine import PcieQuarantineParams, PcieQuarantinePlaybook

    playbook = playbook_registry().load("pcie_quarantine")()
    assert PcieQuarantinePlaybook.Params is PcieQuarantineParams  # from the class header alone
    params = playbook.parse({"gpu": UUID})
    assert isinstance(params, PcieQuarantineParams)
    assert playbook.targets(params).keys() == [f"gpu/{UUID}"]
    (step,) = playbook.steps(params, {"node": "h100-b-03", "schedulable": True})
    assert (step.action.op, step.action.target) == ("cordon_node", "h100-b-03")  # type: ignore[union-attr]


def test_the_notifier_serves_its_receiver_key_and_posts_a_card() -> None:
    from services.alerting.notification import Notification
    from services.notify.base import Message, NotifyContext
    from services.notify.config import NotifySettings
    from services.notify.registry import NOTIFIERS, notifier_for

    assert notifier_for("msteams_configs", {"webhook_url": "https://teams.example/hook"}) == "msteams"
    seen: list[httpx.Request] = []

    def teams(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="1")

    context = NotifyContext(settings=NotifySettings(), http=httpx.Client(transport=httpx.MockTransport(teams)))
    notifier = NOTIFIERS.load("msteams")({"webhook_url": "https://teams.example/hook"}, context)
    alert = AlertRef(fingerprint="f", entity=UUID, signal="pcie_replay_errors", detector="pcie_replay",
                     severity="warning", starts_at=T0)  # fmt: skip
    notification = Notification(
        receiver="gpu-team", group_key="g", group_labels={}, incident_id="inc-pcie", status="firing", reason="first",
        alerts=(alert,), ts=T0,
    )  # fmt: skip
    result = notifier.send(Message(notification=notification))
    assert (result.notifier, result.status_code) == ("msteams", 200)
    card = json.loads(seen[0].content)
    assert card["@type"] == "MessageCard" and card["sections"][0]["facts"][0]["value"] == f"{UUID} (firing)"


def test_the_ingest_source_gets_its_command_and_publishes_through_the_shared_delivery() -> None:
    from medic_example_plugins.redfish import RedfishThermalPuller
    from typer.testing import CliRunner

    from services.cli import app

    listed = CliRunner().invoke(app, ["ingest", "--help"])
    assert "pull-redfish" in listed.output and "pull-loki" in listed.output
    shown = CliRunner().invoke(app, ["ingest", "pull-redfish", "--help"])
    assert shown.exit_code == 0 and "--node" in shown.output and "--once" in shown.output
    refused = CliRunner().invoke(app, ["ingest", "pull-redfish", "--once", "--url", "http://bmc"])
    assert (refused.exit_code, "pull-redfish needs --url and --node" in refused.output) == (2, True)

    source = SOURCES.load("redfish")(Settings(), {"url": "http://bmc/Thermal", "node": "h100-b-03", "interval": None})
    source.check()
    assert source.interval_s == 30.0

    def bmc(request: httpx.Request) -> httpx.Response:
        temps = [{"Name": "Inlet Temp", "ReadingCelsius": 24}, {"Name": "GPU Board", "ReadingCelsius": None}]
        return httpx.Response(200, json={"Temperatures": temps})

    publisher, metrics = MemoryPublisher(), IngestMetrics()
    queue = PublishQueue(publisher, metrics, capacity=1000, flush_timeout_s=5.0)
    queue.start()
    try:
        delivery = Delivery(queue, metrics, timeout_s=10.0, deadletter_max_bytes=64)
        client = httpx.Client(transport=httpx.MockTransport(bmc))
        puller = RedfishThermalPuller("http://bmc/Thermal", "h100-b-03", delivery, client=client, clock=lambda: T0)
        assert isinstance(source.build(delivery), RedfishThermalPuller)
        assert puller.poll() == 1
    finally:
        queue.stop(5.0)
    (batch,) = publisher.events(MetricBatch)
    assert isinstance(batch, MetricBatch)
    (sample,) = batch.samples
    assert (sample.name, sample.labels["sensor"], sample.labels["node"], sample.value, sample.ts) == (
        "redfish_temperature_celsius", "Inlet Temp", "h100-b-03", 24.0, T0,
    )  # fmt: skip
