# syntax=docker/dockerfile:1
# xds-relay container image.
#
#   docker build -t xds-relay:dev .
#   docker run --rm -p 18000:18000 -p 19000:19000 xds-relay:dev
#
# With no config mounted, the image serves the sample resources in config/resources
# (the file-source config deploy/compose/origin.yaml). Mount your own relay.yaml at
# /etc/xds-relay/ to run a zone relay instead (see deploy/kubernetes/).

# ---- build: install the package and its dependencies into a virtual environment
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/xds-relay
WORKDIR /src
# README.md is the package's long description, so setuptools needs it.
COPY pyproject.toml README.md ./
COPY relay/ ./relay/
RUN /opt/xds-relay/bin/pip install .

# ---- runtime
FROM python:3.11-slim

ENV PATH=/opt/xds-relay/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# A fixed numeric UID, so that Kubernetes can check runAsNonRoot against it.
RUN groupadd --system --gid 10001 xds-relay \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
            --home-dir /nonexistent --shell /usr/sbin/nologin xds-relay

COPY --from=build /opt/xds-relay /opt/xds-relay

# upstream.files paths are relative to the working directory: config/resources.
WORKDIR /app
COPY config/ ./config/
COPY deploy/compose/origin.yaml /etc/xds-relay/relay.yaml

USER 10001:10001

# 18000: xDS over gRPC (server.address); 19000: admin HTTP (admin.address).
EXPOSE 18000 19000

# SIGTERM drains: /ready turns 503 and client streams close spread over
# server.drain_period; give `docker stop -t` (or stop_grace_period) more than that.
STOPSIGNAL SIGTERM

# slim has no curl; urlopen raises on a refused connection or a non-2xx answer.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19000/healthz', timeout=2)"]

ENTRYPOINT ["xds-relay"]
CMD ["run", "--config", "/etc/xds-relay/relay.yaml"]
