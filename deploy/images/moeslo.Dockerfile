# moeslo in one image: the controller, the embedded engine, the router and the CLI are the
# same package, so the pod's command picks the role (`moeslo controller serve`,
# `moeslo serve`, `moeslo policy apply`, ...).  Build it from the repository root with
# `make images`, which tags it as deploy/components/images/kustomization.yaml says.
#
# torch is pinned and installed first, on its own, as the Makefile does, and from
# PyTorch's CPU index: otherwise pip resolves the multi-GB CUDA build for `torch==2.13.0`.
FROM python:3.11.13-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/moeslo
ENV PATH=/opt/moeslo/bin:$PATH
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

WORKDIR /src
COPY . .
# The package itself (not editable); its pinned dependencies come from pyproject.toml, and the
# `postgres` extra the PostgreSQL driver of controllers that share a store (postgresql+psycopg://).
RUN pip install --no-cache-dir './[postgres]'

FROM python:3.11.13-slim-bookworm

# The pods run with a read-only root filesystem: no bytecode writes, caches under /tmp.
ENV PATH=/opt/moeslo/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /opt/moeslo /opt/moeslo
# The uid the manifests' securityContext names (runAsUser: 10001).
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin moeslo
USER 10001
WORKDIR /tmp
# 8000: engine (OpenAI API, /metrics); 8090: controller (REST API, /metrics).
EXPOSE 8000 8090
ENTRYPOINT ["moeslo"]
CMD ["--help"]
