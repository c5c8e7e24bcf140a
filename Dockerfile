# One image for every ClusterMedic role; docker-compose.yml and infra/k8s pick the role by command.
#
#   docker build -t clustermedic:local .
#
# torch comes from PyPI with its CUDA wheels (several GB). The detectors only use its CPU kernels,
# so for a smaller image point pip at a CPU-only wheel index:
#   docker build --build-arg PIP_EXTRA_INDEX_URL=<cpu wheel index> -t clustermedic:local .
FROM python:3.11-slim

ARG PIP_EXTRA_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The code finds knowledge/ and infra/config/ relative to its own source tree, so /app is put
    # first on the path: the installed distribution provides the dependencies and `medic`, while
    # imports resolve to /app/services and /app/pipelines next to those folders.
    PYTHONPATH=/app \
    CLUSTERMEDIC_STATE_DIR=/var/lib/clustermedic \
    CLUSTERMEDIC_CACHE_DIR=/var/cache/clustermedic

WORKDIR /app

# Dependencies first, in their own layer, pinned by the lock file: editing code does not reinstall torch.
COPY pyproject.toml requirements.lock README.md* ./
RUN mkdir -p services pipelines \
    && touch services/__init__.py pipelines/__init__.py \
    && pip install --constraint requirements.lock . \
    && rm -rf services pipelines build *.egg-info

COPY . .
RUN pip install --no-deps --constraint requirements.lock . \
    && rm -rf build *.egg-info \
    && useradd --system --uid 10001 --home-dir /var/lib/clustermedic --create-home medic \
    && mkdir -p /var/cache/clustermedic \
    && chown medic /var/lib/clustermedic /var/cache/clustermedic

USER medic

# ingest (Alertmanager webhook, remote_write, Loki push) and the REST API.
EXPOSE 8080 8081

# No ENTRYPOINT: each deployment states the whole command line (`medic ingest serve`, ...).
CMD ["medic", "--help"]
