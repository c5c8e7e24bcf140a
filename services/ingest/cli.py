"""``medic ingest …``: the ingest service's commands (a typer sub-app the main CLI mounts).

Each command builds one Settings object from the environment and passes it down. ``serve`` (the push
receivers), ``watch-k8s`` and ``nvml`` are written here; the pull sources' commands (``scrape``,
``pull-prom``, ``pull-loki``...) are built from the ingest-source registry by :func:`source_command`,
one per :data:`services.ingest.registry.SOURCES` entry.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from services.core.errors import ConfigError, PluginError
from services.core.events import MetricBatch
from services.core.settings import Settings

if TYPE_CHECKING:
    from typer._click.core import Command, Context  # typer vendors click: the types TyperGroup is written with

    from services.ingest.source import PullSource


class _IngestGroup(TyperGroup):
    """The ``ingest`` commands, plus one per registered pull source, added the first time one is asked for.

    A source's command needs its module (and what it imports: the protobuf schemas of remote_write,
    ~0.2 s), so the sources are loaded when ``medic ingest ...`` resolves a command or lists them,
    not when ``medic`` starts for another command.
    """

    _sources_added = False

    def _add_sources(self) -> None:
        if self._sources_added:
            return
        from services.ingest.registry import SOURCES

        for name in SOURCES.names():
            source = SOURCES.load(name)
            if source.command in self.commands:
                raise PluginError(f"ingest source {name!r}: the command {source.command!r} is already taken")
            single = typer.Typer(add_completion=False)
            single.command(source.command, help=source.summary)(source_command(source))
            self.commands[source.command] = typer.main.get_command(single)
        self._sources_added = True

    def list_commands(self, ctx: Context) -> list[str]:
        self._add_sources()
        return super().list_commands(ctx)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in self.commands:
            self._add_sources()
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    help="Ingest from Prometheus, Loki, Alertmanager and Kubernetes into Kafka.", no_args_is_help=True, cls=_IngestGroup
)


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

    ``make_client(delivery)`` builds the client (:meth:`PullSource.build <services.ingest.source.PullSource.build>`).
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


_ONCE = typer.Option(help="Poll once, print how many items were published, exit.")


def source_command(source: type[PullSource]) -> Callable[..., None]:
    """The ``medic ingest <source.command>`` function: the source's options, ``--once``, and the poll loop.

    Each option becomes ``--<name>`` (default None: the setting's value, or the source's default),
    overriding its setting or going to the source's own flags; the settings are built once, the source
    made from them and checked (a :class:`ConfigError` is printed as ``error: ...`` with exit code 2),
    and its client is polled through the publish queue (:func:`_run_pull`).
    """

    def command(**values: Any) -> None:
        once = bool(values.pop("once", False))
        try:
            overrides, flags = source.split(values)
            settings = _settings(**overrides)
            configured = source(settings, flags)
            configured.check()
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        _run_pull(settings, source.command, configured.interval_s, once, configured.build)

    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter(o.name, keyword, default=None, annotation=Annotated[o.type | None, typer.Option(help=o.help)])
        for o in source.options
    ]
    params.append(inspect.Parameter("once", keyword, default=False, annotation=Annotated[bool, _ONCE]))
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__name__ = command.__qualname__ = source.command.replace("-", "_")
    command.__doc__ = source.summary
    return command


if __name__ == "__main__":
    app()
