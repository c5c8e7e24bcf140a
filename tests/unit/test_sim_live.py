"""The live simulation: its clock, the Kubernetes events it serves, and the metrics it exposes."""

from __future__ import annotations

import json
import threading
import time

import pytest

from services.core.errors import ConfigError
from services.core.events import KubeEvent, ObjectRef
from services.ingest.normalise import kube_event
from services.simulator.live import EventLog, LiveSimulation, check_speed, core_v1_event, live_epoch
from services.simulator.scenario import load_scenario
from services.simulator.simulator import Simulator
from tests.conftest import poll


def _event(i: int, namespace: str = "llm-serving") -> KubeEvent:
    return KubeEvent(
        reason="BackOff",
        type="Warning",
        involved_object=ObjectRef(kind="Pod", name=f"vllm-{i}", namespace=namespace, uid=f"uid-{i}"),
        message=f"Back-off restarting failed container vllm in pod vllm-{i}",
        count=2,
        ts=1_800_000_000.0 + i,
        node="gpu-node-001",
        source_component="kubelet",
    )


def test_a_served_event_reads_back_as_the_same_kube_event_through_the_ingest_normaliser() -> None:
    for event in (_event(1), _event(2, namespace="")):
        assert kube_event(core_v1_event(event, 7)) == event


def test_a_watch_resumes_after_its_version_and_a_version_no_longer_kept_is_gone() -> None:
    log = EventLog(capacity=3)
    log.add([_event(i) for i in range(5)])  # versions 1..5, only 3..5 kept
    assert log.listing()["metadata"]["resourceVersion"] == "5"
    assert [o["metadata"]["resourceVersion"] for o in log.listing()["items"]] == ["3", "4", "5"]
    assert [o["metadata"]["resourceVersion"] for o in log.since(3) or []] == ["4", "5"]
    assert log.since(2) == [o for o in log.listing()["items"]]  # 3 is the oldest kept: nothing missed
    assert log.since(1) is None  # 2 was dropped: the watcher must relist
    stop = threading.Event()
    [line] = list(log.watch(1, "", timeout_s=0.1, stop=stop))
    gone = json.loads(line)
    assert gone["type"] == "ERROR" and gone["object"]["code"] == 410


def test_a_watch_streams_events_added_while_it_waits() -> None:
    log = EventLog()
    stop = threading.Event()
    got: list[dict] = []

    def follow() -> None:
        for line in log.watch(0, "llm-serving", timeout_s=30.0, stop=stop):
            got.append(json.loads(line))
            if len(got) == 2:
                stop.set()

    reader = threading.Thread(target=follow)
    reader.start()
    log.add([_event(1), _event(2, namespace="other"), _event(3)])
    reader.join(10.0)
    stop.set()
    assert [(g["type"], g["object"]["involvedObject"]["name"]) for g in got] == [
        ("ADDED", "vllm-1"),
        ("ADDED", "vllm-3"),
    ]


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan"), float("inf"), 5000.0])
def test_a_bad_speed_is_one_clear_error(speed: float) -> None:
    with pytest.raises(ConfigError, match="--speed must be above 0"):
        check_speed(speed)


def test_the_clock_runs_the_simulation_and_keeps_what_each_door_serves() -> None:
    started_minute = 60 * (time.time() // 60)
    sim = Simulator(load_scenario("baseline"), seed=3, epoch=started_minute)  # fault-free: no XID catalog
    live = LiveSimulation(sim, speed=1000.0, duration_s=120.0)
    live.start()
    try:
        poll(live.finished.is_set, timeout_s=60, what="120 simulated seconds at 1000x")
    finally:
        live.stop()
    assert sim.t == 120.0 and live.stats.steps == 120
    text = live.metrics.render()
    node = live.metrics.nodes()[0]
    assert f'Hostname="{node}"' in live.metrics.render(node)
    sample = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP"))
    stamp_ms = int(sample.rsplit(" ", 1)[1])
    # stamped with simulated time: the last scrape (t=105 s) after the start's wall-clock minute
    assert stamp_ms == round((started_minute + 105) * 1000)
    assert live.stats.log_lines > 0 and live.stats.metric_batches > 0


@pytest.mark.parametrize("speed", [1.0, 30.0, 1000.0])
def test_simulated_time_never_passes_the_wall_clock_and_reaches_it_at_the_end(speed: float) -> None:
    now, duration = 1_800_000_000.0, 1800.0
    epoch = live_epoch(now, duration, speed)
    assert epoch % 60 == 0
    for wall_elapsed in (0.0, duration / speed / 2, duration / speed):
        simulated = epoch + wall_elapsed * speed
        assert simulated <= now + wall_elapsed
    assert now + duration / speed - (epoch + duration) < 60  # the run ends within a minute of the wall clock
