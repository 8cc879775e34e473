# syntax=docker/dockerfile:1
#
# One image for the agentrt services (the trio and the operator console):
#   agentrt scheduler | agentrt executor | agentrt relay | agentrt migrate | agentrt console | agentrt maintain
# Build:  docker build -t agentrt/agentrt:0.1.0 .
#
# Stage 1 installs the dependencies from the hash-pinned lock (requirements/base.txt,
# compiled for Python 3.11 on Linux x86_64: keep the base image on 3.11), then the project
# itself without dependencies, into a virtualenv; stage 2 copies only that virtualenv onto a
# slim Python base and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agentrt
WORKDIR /src
COPY requirements/base.txt ./requirements/base.txt
RUN /opt/agentrt/bin/pip install --upgrade pip \
 && /opt/agentrt/bin/pip install --require-hashes -r requirements/base.txt
COPY pyproject.toml README.md* ./
COPY shared ./shared
COPY scheduler ./scheduler
COPY executor ./executor
COPY relay ./relay
COPY cli ./cli
COPY console ./console
RUN /opt/agentrt/bin/pip install --no-deps . \
 && /opt/agentrt/bin/pip check \
 && /opt/agentrt/bin/agentrt --version

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="agentrt" \
      org.opencontainers.image.description="Durable runtime for long AI-agent tasks: scheduler, executor, relay, console" \
      org.opencontainers.image.licenses="Apache-2.0"
# The root filesystem is read-only in Kubernetes: no bytecode writes, unbuffered logs.
ENV PATH=/opt/agentrt/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 agentrt \
 && useradd --system --uid 10001 --gid agentrt --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin agentrt
COPY --from=build /opt/agentrt /opt/agentrt
WORKDIR /app
# Numeric, so that Kubernetes can verify runAsNonRoot.
USER 10001:10001
# scheduler gRPC, executor health, relay health, Prometheus metrics, console HTTP
EXPOSE 50051 50052 50053 9464 8080
ENTRYPOINT ["agentrt"]
CMD ["--help"]
