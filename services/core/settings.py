"""The one Settings object.

Every entrypoint (CLI command, Faust worker, Celery worker, test fixture) builds one :class:`Settings`
and passes it down; nothing reads the environment at import time. Each field is documented here and in
docs/configuration.md; the environment variable is the field name upper-cased with the
``CLUSTERMEDIC_`` prefix (``kafka_port`` -> ``CLUSTERMEDIC_KAFKA_PORT``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.core.paths import REPO_ROOT


class Settings(BaseSettings):
    """Runtime configuration, read from ``CLUSTERMEDIC_*`` environment variables (and ``.env``)."""

    model_config = SettingsConfigDict(env_prefix="CLUSTERMEDIC_", env_file=".env", extra="ignore")

    state_dir: Path = Field(
        default=Path(".run"),
        description="Where the local infrastructure keeps data, logs and PID files (relative to the cwd).",
    )
    cache_dir: Path = Field(
        default=Path.home() / ".cache" / "clustermedic",
        description="Downloads reused across clones and runs (the Kafka broker jars).",
    )

    # Kafka
    kafka_bootstrap: str | None = Field(
        default=None,
        description="Kafka bootstrap servers 'host:port[,host:port]'. Unset: the local broker on kafka_port.",
    )
    kafka_port: int = Field(default=19092, description="Port of the local Kafka broker (infra/local).")
    kafka_controller_port: int = Field(default=19093, description="KRaft controller port of the local broker.")
    kafka_version: str = Field(default="4.1.1", description="Apache Kafka version resolved from Maven Central.")
    kafka_partitions: int = Field(
        default=4, ge=1, description="Partition count of every topic (Faust needs one count across a pipeline)."
    )
    topic_prefix: str = Field(
        default="", description="Prefix added to every topic name; tests use it to get fresh topics."
    )

    # PostgreSQL
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL (with pgvector). Unset: the embedded server under state_dir/pgdata.",
    )

    # Redis / Celery
    redis_url: str | None = Field(
        default=None, description="Redis URL for Celery. Unset: the local redis-server on redis_port."
    )
    redis_port: int = Field(default=16379, description="Port of the local redis-server (infra/local).")

    # Faust
    faust_app_id: str = Field(default="clustermedic", description="Faust application id (consumer group).")
    faust_web_port: int = Field(default=16066, description="Port of the Faust worker's web server.")
    routing_config: Path = Field(
        default=REPO_ROOT / "infra" / "config" / "routing.yaml",
        description="The routing tree (receivers, grouping, inhibition) correlate and the notifier load.",
    )
    faust_web_host: str = Field(
        default="127.0.0.1",
        description="Address the Faust worker's web server binds (its pages are unauthenticated: loopback by default).",
    )
    faust_fetch_max_wait_ms: int = Field(
        default=100,
        ge=1,
        description=(
            "Longest time the broker holds a Faust worker's fetch request when it has no new data. Faust's"
            " own 1500 ms stalls a busy worker: a request naming only idle partitions blocks the next one."
        ),
    )

    detectors: str = Field(
        default="", description="Comma-separated detector registry names the detect role runs; empty: all."
    )
    detect_model_refresh_s: float = Field(
        default=300.0, description="How often a detect worker looks for newer stored models to hot-swap."
    )
    detect_contamination: float = Field(
        default=0.005, gt=0, lt=0.5, description="Share of training scrapes the learned detectors treat as outliers."
    )
    detect_torch_threads: int = Field(
        default=1,
        ge=0,
        description="CPU threads torch uses for the LSTM in a detect worker; 0: torch's default (all cores).",
    )
    detect_retrain_interval_s: float = Field(
        default=21_600.0, gt=0, description="`medic detect retrain`: seconds between scheduled retrainings."
    )
    detect_retrain_lookback_s: float = Field(
        default=21_600.0, gt=0, description="Scheduled retraining learns from this many recent seconds of metrics."
    )
    detect_retrain_window_s: float = Field(
        default=300.0, gt=0, description="Retraining judges scrapes in windows this long per entity (s)."
    )
    detect_retrain_margin_s: float = Field(
        default=300.0, ge=0, description="Retraining leaves out windows within this many seconds of an anomaly."
    )
    detect_retrain_min_scrapes: int = Field(
        default=500, ge=1, description="Retraining stores nothing when fewer scrapes than this were judged normal."
    )
    trust_kernel_log_streams: str = Field(
        default="unit=kernel;transport=kernel",
        description=(
            "Loki stream selectors of a node's own kernel log, the only log an XID is believed from:"
            " 'label=value[,label=value]', ';' between alternatives; a stream with a pod or container label"
            " never matches (docs/security.md)."
        ),
    )

    log_level: str = Field(default="INFO", description="Log level of every ClusterMedic process.")

    # Ingest (services/ingest; docs/ingest.md)
    ingest_host: str = Field(
        default="127.0.0.1",
        description=(
            "Address the ingest HTTP service listens on. A non-loopback address needs ingest_token"
            " (or `--insecure`); docs/security.md."
        ),
    )
    ingest_port: int = Field(default=8081, description="Port of the ingest HTTP service.")
    ingest_token: str | None = Field(
        default=None,
        description="Bearer token every ingest push endpoint requires. Unset: allowed on a loopback address only.",
    )
    ingest_max_body_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1024, description="Largest request body the ingest receivers read (413 above)."
    )
    ingest_max_decompressed_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Largest decompressed body (snappy, gzip) accepted (413 above)."
    )
    ingest_max_records_per_request: int = Field(
        default=50_000,
        ge=1,
        description=(
            "Most records (samples, log entries, alerts) one push request may carry (413 above); a"
            " protobuf body may also hold at most 16 protobuf messages (series, labels, streams) per record,"
            " checked before it is decoded."
        ),
    )
    ingest_max_line_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description=(
            "Longest log line accepted, in UTF-8 bytes (Loki's max_line_size); a push holding a longer one gets 413."
        ),
    )
    ingest_max_label_bytes: int = Field(
        default=64 * 1024,
        ge=256,
        description=(
            "Most bytes of one series' or stream's labels, names and values together; a push holding a larger"
            " label set gets 413."
        ),
    )
    ingest_max_message_bytes: int = Field(
        default=1_000_000,
        ge=64 * 1024,
        description=(
            "Most bytes of one Kafka message ingest writes: keep it under the broker's message.max.bytes"
            " (1 MiB by default). Metric batches are split to fit; a larger record is dead-lettered on its own."
        ),
    )
    ingest_series_cache_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024 * 1024,
        description=(
            "Most bytes of decoded label sets the remote_write series cache keeps (also at most 200,000"
            " series); it starts afresh when full."
        ),
    )
    ingest_queue_capacity: int = Field(
        default=200_000,
        ge=1,
        description="Bound of the ingest publish queue, in samples (other events count one); 503 when full.",
    )
    ingest_flush_timeout_s: float = Field(
        default=10.0, gt=0, description="How long ingest waits for Kafka's acks before answering 503."
    )
    ingest_retry_after_s: int = Field(default=5, ge=1, description="Retry-After (s) on ingest 503 answers.")
    ingest_max_samples_per_batch: int = Field(
        default=1000, ge=1, description="Most samples in one MetricBatch message (keeps messages under 1 MB)."
    )
    ingest_dedup_ttl_s: float = Field(
        default=86_400.0, gt=0, description="How long a delivered Alertmanager alert state is remembered."
    )
    ingest_dedup_capacity: int = Field(
        default=100_000, ge=1, description="Most Alertmanager alert states remembered for dedup."
    )
    ingest_deadletter_max_bytes: int = Field(
        default=256 * 1024, ge=0, description="Most bytes of a rejected payload kept in its dead letter."
    )
    ingest_max_future_s: float = Field(
        default=600.0,
        ge=0,
        description=(
            "How far (s) ahead of the receiver's wall clock telemetry may be stamped; later entries are"
            " refused and dead-lettered (Loki's creation_grace_period)."
        ),
    )
    ingest_max_age_s: float = Field(
        default=7 * 86_400.0,
        gt=0,
        description=(
            "How old (s) telemetry may be when it reaches ingest; older entries are refused and"
            " dead-lettered (Loki's reject_old_samples_max_age)."
        ),
    )
    ingest_scrape_targets: list[str] = Field(
        default_factory=list, description="URLs of /metrics endpoints `medic ingest scrape` polls (JSON list)."
    )
    ingest_scrape_interval_s: float = Field(default=15.0, gt=0, description="Seconds between scrapes.")
    ingest_scrape_job: str = Field(
        default="scrape", description="`job` label `medic ingest scrape` sets on scraped samples (as Prometheus does)."
    )
    ingest_prometheus_url: str | None = Field(
        default=None, description="Prometheus base URL `medic ingest pull-prom` queries with query_range."
    )
    ingest_prometheus_queries: dict[str, str] = Field(
        default_factory=dict, description="Metric name -> PromQL, pulled with query_range (JSON object)."
    )
    ingest_pull_step_s: float = Field(default=15.0, gt=0, description="query_range step (s) for pull-prom.")
    ingest_pull_interval_s: float = Field(default=30.0, gt=0, description="Seconds between pull-prom/pull-loki polls.")
    ingest_loki_url: str | None = Field(default=None, description="Loki base URL `medic ingest pull-loki` queries.")
    ingest_loki_query: str = Field(default='{job=~".+"}', description="LogQL stream selector pull-loki follows.")
    ingest_loki_limit: int = Field(default=1000, ge=1, description="Most entries per Loki query_range page.")
    ingest_pull_max_catchup_s: float = Field(
        default=21_600.0,
        gt=0,
        description="pull-prom/pull-loki resume from their stored cursors (state_dir) at most this far back (s).",
    )
    ingest_k8s_api: str = Field(
        default="core",
        description="Kubernetes events API the watcher uses: 'core' (v1) or 'events' (events.k8s.io/v1).",
    )
    ingest_k8s_kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig for the events watcher. Unset: in-cluster config, else ~/.kube/config."
    )
    ingest_k8s_namespace: str = Field(default="", description="Namespace the events watcher follows; empty: all.")
    ingest_nvml_interval_s: float = Field(
        default=10.0, gt=0, description="Seconds between NVML readings of `medic ingest nvml`."
    )
    ingest_nvml_listen: str = Field(
        default="",
        description="host:port where `medic ingest nvml` serves DCGM-named /metrics; empty: do not serve.",
    )
    ingest_nvml_publish: bool = Field(
        default=True, description="Whether `medic ingest nvml` publishes its readings to telemetry.metrics.v1."
    )
    ingest_nvml_hostname: str | None = Field(
        default=None, description="Hostname label of NVML readings (default: this host's name; in Kubernetes the node)."
    )

    # Correlate: its clock and the anomaly history it writes (pipelines/correlate; docs/correlation.md)
    correlate_clock_rate: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description=(
            "Event seconds the correlate clock advances per wall second while no anomaly arrives (its timers:"
            " group_wait, repeat, auto-resolve). 1 in production; `medic demo` sets its --speed, since the"
            " simulator's telemetry then carries that many simulated seconds per wall second."
        ),
    )
    anomaly_retention_s: float = Field(
        default=604800.0,
        gt=0,
        description=(
            "How long the anomalies table keeps an anomaly, in event time (s): the correlate role deletes"
            " older rows as its clock passes them."
        ),
    )
    anomaly_evidence_max_bytes: int = Field(
        default=8192,
        ge=512,
        description=(
            "Most bytes of one stored anomaly's evidence JSON; larger evidence keeps its smallest fields"
            " and names the dropped ones under `_dropped`."
        ),
    )

    # Diagnostician and knowledge base (services/diagnostician; docs/diagnostician.md)
    diagnostician: str = Field(
        default="ranker", description="Diagnostician: 'ranker' (offline evidence ranker) or 'llm' (ranker as fallback)."
    )
    embedder: str = Field(
        default="minilm", description="Embedder: 'minilm' (offline all-MiniLM-L6-v2) or 'openai' (embeddings endpoint)."
    )
    embedder_threads: int = Field(
        default=1, ge=0, description="CPU threads torch uses for MiniLM; 0: torch's default (all cores)."
    )
    embedding_base_url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible embeddings endpoint (embedder='openai')."
    )
    embedding_model: str = Field(
        default="text-embedding-3-small", description="Embeddings model name (must return or be cut to 384 dims)."
    )
    embedding_api_key: str | None = Field(default=None, description="API key of the embeddings endpoint.")
    kb_dir: Path | None = Field(
        default=None, description="Knowledge folder (runbooks/, postmortems/). Unset: the repository's knowledge/."
    )
    kb_top_k: int = Field(default=8, ge=1, le=100, description="Hits returned by hybrid retrieval.")
    diagnostician_change_feed: bool = Field(
        default=True,
        description="The diagnostician follows telemetry.events.v1 for rollouts (ScalingReplicaSet) as evidence.",
    )
    diagnostician_change_lookback_s: float = Field(
        default=3600.0, gt=0, description="How far back the diagnostician's change feed starts reading (s)."
    )
    llm_base_url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama)."
    )
    llm_model: str = Field(default="gpt-4o-mini", description="Chat model the LLM diagnostician asks.")
    llm_api_key: str | None = Field(default=None, description="API key of the LLM endpoint.")
    llm_timeout_s: float = Field(
        default=20.0, gt=0, description="Seconds the LLM may take before the ranker's diagnosis is used instead."
    )
    llm_token_budget: int = Field(
        default=6000, ge=500, description="Prompt budget in tokens (approximated as characters / 4)."
    )

    # API (services/api; `medic api serve`)
    api_host: str = Field(
        default="127.0.0.1",
        description=(
            "Address the API service (incidents, silences, runs, tokens, audit) listens on. A non-loopback"
            " address needs api_token or a stored token from `medic token create` (or `--insecure`)."
        ),
    )
    api_port: int = Field(default=8080, description="Port of the API service.")
    api_token: str | None = Field(
        default=None,
        description=(
            "Bootstrap token of the API: an admin named `bootstrap`, for the first `POST /api/v1/tokens` and"
            " for deployments that set one secret. People and tools get their own (`medic token create`);"
            " every API route but /healthz, /metrics and the signed Slack button needs one or the other."
        ),
    )

    # Simulator control API (services/simulator/http.py)
    sim_token: str | None = Field(
        default=None,
        description=(
            "Bearer token every simulator control route requires. Unset: the control API may listen on a"
            " loopback address only."
        ),
    )

    @property
    def bootstrap_servers(self) -> str:
        """The Kafka bootstrap servers to connect to."""
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def broker_url(self) -> str:
        """The Redis URL used as Celery broker and result backend."""
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def run_dir(self) -> Path:
        """Absolute state directory."""
        return self.state_dir.expanduser().resolve()

    @property
    def pgdata(self) -> Path:
        """Data directory of the embedded PostgreSQL server."""
        return self.run_dir / "pgdata"

    def topic(self, name: str) -> str:
        """Return the full Kafka topic name for a base name such as ``telemetry.metrics.v1``."""
        return f"{self.topic_prefix}{name}"


def markdown_table() -> str:
    """The settings reference table of docs/configuration.md, generated from the fields above."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    home = str(Path.home())
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        shown = "" if default is None else str(default).replace(home, "~")
        rows.append(f"| `CLUSTERMEDIC_{name.upper()}` | `{shown}` | {field.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    # `python -m services.core.settings docs/configuration.md` rewrites the table between the markers
    import sys

    doc = Path(sys.argv[1])
    text = doc.read_text()
    begin, end = "<!-- settings:begin -->", "<!-- settings:end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    doc.write_text(f"{head}{begin}\n{markdown_table()}\n{end}{tail}")
