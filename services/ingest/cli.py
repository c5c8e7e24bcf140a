"""``medic ingest …``: the ingest service's commands (a typer sub-app the main CLI mounts).

Each command builds one Settings object from the environment and passes it down.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from services.core.events import MetricBatch
from services.core.settings import Settings

app = typer.Typer(help="Ingest from Prometheus, Loki, Alertmanager and Kubernetes into Kafka.", no_args_is_help=True)


@app.callback()
def ingest() -> None:
    """Ingest from Prometheus, Loki, Alertmanager and Kubernetes into Kafka."""


def _settings(**overrides: object) -> Settings:
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level.upper() != "DEBUG":
        for noisy in ("kafka", "aiokafka"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return settings


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Listen address (default: ingest_host).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: ingest_port).")] = None,
) -> None:
    """Run the push receivers: remote_write, Loki push, Alertmanager webhook, /metrics, /healthz."""
    import uvicorn

    from services.core.bus import KafkaPublisher, ensure_topics
    from services.ingest.http import create_app

    settings = _settings(ingest_host=host, ingest_port=port)
    ensure_topics(settings)
    web = create_app(settings, KafkaPublisher(settings))
    uvicorn.run(
        web,
        host=settings.ingest_host,
        port=settings.ingest_port,
        log_level=settings.log_level.lower(),
        access_log=settings.log_level.upper() == "DEBUG",
    )


@app.command("watch-k8s")
def watch_k8s() -> None:
    """Watch Kubernetes events (in-cluster or kubeconfig auth) into telemetry.events.v1."""
    from services.core.bus import KafkaPublisher, ensure_topics
    from services.core.events import DeadLetter, KubeEvent
    from services.ingest.kube import EventWatcher, api_client

    settings = _settings()
    ensure_topics(settings)
    publisher = KafkaPublisher(settings)

    def emit(events: list[KubeEvent | DeadLetter]) -> None:
        for event in events:
            publisher.publish(event)
        publisher.flush(settings.ingest_flush_timeout_s)  # acked before the watcher moves on

    watcher = EventWatcher(
        api_client(settings), emit, api_group=settings.ingest_k8s_api, namespace=settings.ingest_k8s_namespace
    )
    try:
        watcher.run()
    finally:
        publisher.close()


@app.command()
def nvml(
    listen: Annotated[
        str | None, typer.Option(help="host:port to serve DCGM-named /metrics (default: ingest_nvml_listen).")
    ] = None,
    publish: Annotated[
        bool | None, typer.Option(help="Publish readings to telemetry.metrics.v1 (default: ingest_nvml_publish).")
    ] = None,
    interval: Annotated[float | None, typer.Option(help="Seconds between readings.")] = None,
    once: Annotated[bool, typer.Option(help="Take one reading, print it as exposition text, exit.")] = False,
) -> None:
    """Read this host's GPUs through NVML (for nodes without dcgm-exporter): serve and/or publish them."""
    import threading

    from services.ingest.nvml import NvmlCollector, NvmlUnavailable, exposition
    from services.ingest.nvml_service import Exposition, run, serve_metrics

    settings = _settings(ingest_nvml_listen=listen, ingest_nvml_publish=publish, ingest_nvml_interval_s=interval)
    try:
        collector = NvmlCollector(settings.ingest_nvml_hostname).open()
    except NvmlUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    with collector:
        if once:
            typer.echo(exposition(collector.collect()), nl=False)
            return
        latest, stop = Exposition(), threading.Event()
        if settings.ingest_nvml_listen:
            serve_metrics(settings.ingest_nvml_listen, latest)
        sender = None
        if settings.ingest_nvml_publish:
            from services.core.bus import KafkaPublisher, ensure_topics

            ensure_topics(settings)
            publisher = KafkaPublisher(settings)

            def sender(batches: list[MetricBatch]) -> None:
                for batch in batches:
                    publisher.publish(batch)
                publisher.flush(settings.ingest_flush_timeout_s)

        typer.echo(f"reading {len(collector.gpus)} GPU(s) every {settings.ingest_nvml_interval_s:g}s", err=True)
        try:
            run(settings, collector, publish=sender, latest=latest, stop=stop)
        except KeyboardInterrupt:
            stop.set()


if __name__ == "__main__":
    app()
