"""``medic ingest …``: the ingest service's commands (a typer sub-app the main CLI mounts).

Each command builds one Settings object from the environment and passes it down.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

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


if __name__ == "__main__":
    app()
