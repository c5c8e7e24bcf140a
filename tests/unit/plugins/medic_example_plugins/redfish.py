"""An ingest source: a node's BMC temperatures over Redfish, polled into ``telemetry.metrics.v1``.

A GPU node's baseboard controller reports inlet, CPU and GPU-board temperatures that no exporter on the
node sees (the BMC keeps reading when the host is hung). ``GET <url>/redfish/v1/Chassis/<id>/Thermal``
answers ``{"Temperatures": [{"Name": "Inlet Temp", "ReadingCelsius": 24}, ...]}`` (DMTF Redfish); each
reading becomes ``redfish_temperature_celsius{node, sensor}``.

One module and one entry-point line (``clustermedic.ingest_sources``): the class declares its command
and flags, and ClusterMedic builds ``medic ingest pull-redfish`` from them. Its flags are its own (no
ClusterMedic setting holds a BMC's address), so they reach it in ``flags``. Fetching, dead letters,
time bounds and publishing are ClusterMedic's (:mod:`services.ingest.pull`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, ClassVar

import httpx

from services.core.errors import ConfigError
from services.ingest import normalise
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.pull import Clock, Delivery, Series, check_answer, fetch, http_client
from services.ingest.source import Option, PullSource

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024  # a Thermal resource is a few kB; a BMC answering megabytes is broken


def readings(body: bytes, what: str) -> list[tuple[str, float]]:
    """``(sensor name, degrees C)`` of a Redfish Thermal resource; sensors without a reading are left out.

    Raises:
        RejectedInput: not JSON, or no ``Temperatures`` list.
    """
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RejectedInput(f"{what}: answer is not JSON: {exc}", reason="json") from exc
    temperatures = payload.get("Temperatures") if isinstance(payload, dict) else None
    if not isinstance(temperatures, list):
        raise RejectedInput(f'{what}: answer has no "Temperatures" list', reason="schema")
    out: list[tuple[str, float]] = []
    for sensor in temperatures:
        if not isinstance(sensor, dict):
            continue
        name, value = sensor.get("Name"), sensor.get("ReadingCelsius")
        if isinstance(name, str) and name and isinstance(value, int | float) and not isinstance(value, bool):
            out.append((name[:100], float(value)))
    return out


class RedfishThermalPuller:
    """Polls one BMC's Thermal resource.

    Args:
        url: the Thermal resource (``https://bmc-07/redfish/v1/Chassis/1/Thermal``).
        node: the Kubernetes node the BMC belongs to (the ``node`` label of every sample).
        delivery: where events and dead letters go.
        client: HTTP client (tests pass one with a MockTransport).
        clock: wall clock (seconds), for sample timestamps.
    """

    receiver = "redfish"

    def __init__(
        self,
        url: str,
        node: str,
        delivery: Delivery,
        *,
        client: httpx.Client | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.url = url
        self.node = node
        self._delivery = delivery
        self._client = client or http_client(10.0)
        self._clock = clock

    def poll(self) -> int:
        """Read the temperatures once and publish them; never raises for a bad or absent BMC."""
        what = f"redfish {self.url}"
        now = self._clock()
        try:
            answer = fetch(self._client, self.url, params={}, max_bytes=MAX_BYTES, Accept="application/json")
        except httpx.HTTPError as exc:
            log.warning("%s: cannot reach it: %s", what, exc or type(exc).__name__)
            return 0
        try:
            check_answer(answer, what, MAX_BYTES)
            found = readings(answer.body, what)
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"pull:{self.url}", key=self.node, raw=answer.body, error=exc
            )
            return 0
        series: list[Series] = [
            ({"__name__": "redfish_temperature_celsius", "node": self.node, "sensor": name}, [(value, now)])
            for name, value in found
        ]
        batches, _dropped = normalise.metric_batches(
            series, source="redfish", max_samples=1000, check=self._delivery.time_check(now)
        )
        try:
            self._delivery.publish(batches)
        except Overloaded as exc:
            log.warning("%s: not published, retried next poll: %s", what, exc)
            return 0
        return sum(len(b.samples) for b in batches)


class RedfishSource(PullSource):
    """``medic ingest pull-redfish --url ... --node ...``: a :class:`RedfishThermalPuller`."""

    name = "redfish"
    command = "pull-redfish"
    summary = "Poll a node's BMC temperatures over Redfish into telemetry.metrics.v1."
    options: ClassVar[tuple[Option, ...]] = (
        Option("url", str, None, "The BMC's Thermal resource (https://bmc/redfish/v1/Chassis/1/Thermal)."),
        Option("node", str, None, "The Kubernetes node the BMC belongs to."),
        Option("interval", float, None, "Seconds between polls (default: 30)."),
    )

    def check(self) -> None:
        if not self.flags["url"] or not self.flags["node"]:
            raise ConfigError("pull-redfish needs --url and --node")

    @property
    def interval_s(self) -> float:
        interval: Any = self.flags["interval"]
        return float(interval) if interval else 30.0

    def build(self, delivery: Delivery) -> RedfishThermalPuller:
        return RedfishThermalPuller(self.flags["url"], self.flags["node"], delivery)
