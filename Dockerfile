# syntax=docker/dockerfile:1
#
# One image for the agentrt trio:
#   agentrt scheduler | agentrt executor | agentrt relay | agentrt migrate
# Build:  docker build -t agentrt/agentrt:0.1.0 .
#
# Stage 1 installs the project and its dependencies into a virtualenv; stage 2
# copies only that virtualenv onto a slim Python base and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agentrt
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY shared ./shared
COPY scheduler ./scheduler
COPY executor ./executor
COPY relay ./relay
COPY devstack ./devstack
RUN /opt/agentrt/bin/pip install --upgrade pip \
 && /opt/agentrt/bin/pip install . \
 && /opt/agentrt/bin/agentrt --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="agentrt" \
      org.opencontainers.image.description="Durable runtime for long AI-agent tasks: scheduler, executor, relay" \
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
# scheduler gRPC, executor health, relay health, Prometheus metrics
EXPOSE 50051 50052 50053 9464
ENTRYPOINT ["agentrt"]
CMD ["--help"]
