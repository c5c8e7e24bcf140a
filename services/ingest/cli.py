"""``medic ingest …``: the ingest service's commands (a typer sub-app the main CLI mounts).

Each command builds one Settings object from the environment and passes it down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

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
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback address without CLUSTERMEDIC_INGEST_TOKEN.")
    ] = False,
) -> None:
    """Run the push receivers: remote_write, Loki push, Alertmanager webhook, /metrics, /healthz.

    On a non-loopback address the receivers need CLUSTERMEDIC_INGEST_TOKEN, or --insecure (a warning,
    and clustermedic_insecure_listener{role="ingest"} 1 on /metrics).
    """
    import uvicorn

    from services.core.bus import ensure_topics
    from services.core.exposure import UnsafeListener, check_listener
    from services.ingest.aiopublisher import AioKafkaPublisher
    from services.ingest.http import create_app

    settings = _settings(ingest_host=host, ingest_port=port)
    try:
        # before anything else: a refused listener must not create topics or connect to Kafka
        listener = check_listener(
            "ingest",
            settings.ingest_host,
            settings.ingest_port,
            token=settings.ingest_token,
            token_variable="CLUSTERMEDIC_INGEST_TOKEN",
            insecure=insecure,
        )
    except UnsafeListener as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    ensure_topics(settings)
    # aiokafka: one record batch per partition and round, acks overlapping (docs/ingest.md, Performance)
    web = create_app(settings, AioKafkaPublisher(settings), listener=listener)
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
    from services.ingest.timebounds import TimeCheck

    settings = _settings()
    ensure_topics(settings)
    publisher = KafkaPublisher(settings)

    def emit(events: list[KubeEvent | DeadLetter]) -> None:
        for event in events:
            publisher.publish(event)
        publisher.flush(settings.ingest_flush_timeout_s)  # acked before the watcher moves on

    watcher = EventWatcher(
        api_client(settings),
        emit,
        api_group=settings.ingest_k8s_api,
        namespace=settings.ingest_k8s_namespace,
        time_window=lambda now: TimeCheck.of(settings, now),
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


def _run_pull(settings: Settings, name: str, interval_s: float, once: bool, make_client: Callable[..., Any]) -> None:
    """Run a pull client against the real Kafka: once, or every ``interval_s`` until SIGTERM / Ctrl-C.

    ``make_client(delivery)`` builds the client (a Scraper, PrometheusPuller or LokiPuller).
    """
    import signal
    import threading

    from services.core.bus import KafkaPublisher, ensure_topics
    from services.ingest.pull import delivery_for, run_every

    ensure_topics(settings)
    delivery = delivery_for(settings, KafkaPublisher(settings))
    client = make_client(delivery)
    stop = threading.Event()
    try:
        if once:
            count = client.poll()
            typer.echo(f"{name}: {count} items published", err=True)
            return
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        typer.echo(f"{name}: polling every {interval_s:g}s", err=True)
        try:
            run_every(client.poll, interval_s, stop, name=name)
        except KeyboardInterrupt:
            stop.set()
    finally:
        delivery.queue.stop(settings.ingest_flush_timeout_s)


def _cursor_store(settings: Settings, command: str) -> Any:
    """The command's cursors file in the state directory: a restart resumes where the last run stopped."""
    from services.ingest.pull import CursorStore

    return CursorStore(settings.state_dir / f"ingest-{command}-cursors.json")


_ONCE = typer.Option(help="Poll once, print how many items were published, exit.")


@app.command()
def scrape(
    target: Annotated[
        list[str] | None,
        typer.Option(help="URL of a /metrics endpoint; repeat for several (default: ingest_scrape_targets)."),
    ] = None,
    interval: Annotated[
        float | None, typer.Option(help="Seconds between scrapes (default: ingest_scrape_interval_s).")
    ] = None,
    job: Annotated[str | None, typer.Option(help="job label of scraped samples (default: ingest_scrape_job).")] = None,
    once: Annotated[bool, _ONCE] = False,
) -> None:
    """Scrape Prometheus /metrics endpoints (text format) into telemetry.metrics.v1."""
    from services.ingest.pull import Scraper

    settings = _settings(ingest_scrape_targets=target or None, ingest_scrape_interval_s=interval, ingest_scrape_job=job)
    if not settings.ingest_scrape_targets:
        typer.echo("error: no targets: pass --target URL or set CLUSTERMEDIC_INGEST_SCRAPE_TARGETS", err=True)
        raise typer.Exit(2)

    def make(delivery: Any) -> Scraper:
        return Scraper(
            settings.ingest_scrape_targets,
            delivery,
            job=settings.ingest_scrape_job,
            timeout_s=min(settings.ingest_scrape_interval_s, 10.0),
            max_bytes=settings.ingest_max_decompressed_bytes,
            max_samples=settings.ingest_max_samples_per_batch,
        )

    _run_pull(settings, "scrape", settings.ingest_scrape_interval_s, once, make)


@app.command("pull-prom")
def pull_prom(
    url: Annotated[str | None, typer.Option(help="Prometheus base URL (default: ingest_prometheus_url).")] = None,
    query: Annotated[
        list[str] | None,
        typer.Option(help="NAME=PROMQL to pull; repeat for several (default: ingest_prometheus_queries)."),
    ] = None,
    step: Annotated[
        float | None, typer.Option(help="query_range step in seconds (default: ingest_pull_step_s).")
    ] = None,
    interval: Annotated[
        float | None, typer.Option(help="Seconds between polls (default: ingest_pull_interval_s).")
    ] = None,
    once: Annotated[bool, _ONCE] = False,
) -> None:
    """Pull PromQL queries from Prometheus with query_range into telemetry.metrics.v1, resuming per query."""
    from services.ingest.pull import PrometheusPuller

    queries: dict[str, str] = {}
    for item in query or []:
        name, sep, promql = item.partition("=")
        if not sep or not name.strip() or not promql.strip():
            typer.echo(f"error: --query {item!r} is not NAME=PROMQL", err=True)
            raise typer.Exit(2)
        queries[name.strip()] = promql.strip()
    settings = _settings(
        ingest_prometheus_url=url,
        ingest_prometheus_queries=queries or None,
        ingest_pull_step_s=step,
        ingest_pull_interval_s=interval,
    )
    if not settings.ingest_prometheus_url or not settings.ingest_prometheus_queries:
        typer.echo("error: pull-prom needs --url and at least one --query NAME=PROMQL (or their settings)", err=True)
        raise typer.Exit(2)
    base_url = settings.ingest_prometheus_url

    def make(delivery: Any) -> PrometheusPuller:
        return PrometheusPuller(
            base_url,
            settings.ingest_prometheus_queries,
            delivery,
            step_s=settings.ingest_pull_step_s,
            lookback_s=settings.ingest_pull_interval_s,
            max_bytes=settings.ingest_max_decompressed_bytes,
            max_samples=settings.ingest_max_samples_per_batch,
            cursors=_cursor_store(settings, "pull-prom"),
            max_catchup_s=settings.ingest_pull_max_catchup_s,
        )

    _run_pull(settings, "pull-prom", settings.ingest_pull_interval_s, once, make)


@app.command("pull-loki")
def pull_loki(
    url: Annotated[str | None, typer.Option(help="Loki base URL (default: ingest_loki_url).")] = None,
    query: Annotated[str | None, typer.Option(help="LogQL log query to follow (default: ingest_loki_query).")] = None,
    limit: Annotated[
        int | None, typer.Option(help="Entries per query_range page (default: ingest_loki_limit).")
    ] = None,
    interval: Annotated[
        float | None, typer.Option(help="Seconds between polls (default: ingest_pull_interval_s).")
    ] = None,
    once: Annotated[bool, _ONCE] = False,
) -> None:
    """Follow a LogQL query with Loki's query_range into telemetry.logs.v1 (no duplicates, no gaps)."""
    from services.ingest.pull import LokiPuller

    settings = _settings(
        ingest_loki_url=url, ingest_loki_query=query, ingest_loki_limit=limit, ingest_pull_interval_s=interval
    )
    if not settings.ingest_loki_url:
        typer.echo("error: pull-loki needs --url (or CLUSTERMEDIC_INGEST_LOKI_URL)", err=True)
        raise typer.Exit(2)
    base_url = settings.ingest_loki_url

    def make(delivery: Any) -> LokiPuller:
        return LokiPuller(
            base_url,
            settings.ingest_loki_query,
            delivery,
            limit=settings.ingest_loki_limit,
            lookback_s=settings.ingest_pull_interval_s,
            max_bytes=settings.ingest_max_decompressed_bytes,
            cursors=_cursor_store(settings, "pull-loki"),
            max_catchup_s=settings.ingest_pull_max_catchup_s,
        )

    _run_pull(settings, "pull-loki", settings.ingest_pull_interval_s, once, make)


if __name__ == "__main__":
    app()
