# syntax=docker/dockerfile:1
# The jetcrawl image: one image for every service (`jetcrawl dispatcher`, `jetcrawl worker`,
# `jetcrawl topology --apply`, `jetcrawl status`), as compose.yaml runs them.
#
# The first stage builds wheels of jetcrawl and of all its dependencies (the render extra's too);
# the last, the default target, installs jetcrawl's wheels alone into a clean slim image (no
# compiler, no pip cache, no sources) and runs as an unprivileged user. The `renderer` target
# (`docker build --target renderer`, compose's renderer service) is the same plus Debian's Chromium
# and Playwright, for `jetcrawl renderer` only. Nothing secret is in either image: NATS passwords
# come from the environment.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# The build context is only what the distribution is built from (.dockerignore lists it).
COPY . ./
RUN pip wheel --wheel-dir /wheels '.[render]'

FROM ${PYTHON_IMAGE} AS renderer
RUN apt-get update \
    && apt-get install -y --no-install-recommends chromium \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        'jetcrawl[render]' \
    && groupadd --system --gid 10001 jetcrawl \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin jetcrawl
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
ENV JETCRAWL_METRICS_PORT=9464
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['JETCRAWL_METRICS_PORT'] + '/healthz', timeout=2)"]
ENTRYPOINT ["jetcrawl"]
CMD ["renderer"]

# The default target: every service but the renderer.
FROM ${PYTHON_IMAGE}
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels jetcrawl \
    && groupadd --system --gid 10001 jetcrawl \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin jetcrawl
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

USER 10001:10001
WORKDIR /tmp

# /healthz, /readyz and /metrics (Prometheus). Every service but `topology` serves them here.
ENV JETCRAWL_METRICS_PORT=9464
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['JETCRAWL_METRICS_PORT'] + '/healthz', timeout=2)"]

ENTRYPOINT ["jetcrawl"]
CMD ["--help"]
