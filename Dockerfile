# syntax=docker/dockerfile:1
# One image for every vmevents function: each Knative Service picks its function with
# FUNCTION_TARGET and FUNCTION_SOURCE (functions-framework reads both from the environment).
# Build: `make image` (podman or docker; where no base image can be pulled, PYTHON_IMAGE is a Python 3.11
# base built from Debian's packages by image/base.py, which holds the same interpreter under /usr).
# Runs as a non-root numeric user on a read-only root filesystem: nothing is written to the image at run
# time (bytecode is compiled here). The run-time stage holds only what the interpreter and the venv need
# (image/rootfs.py): no shell, no package manager.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/vmevents
COPY requirements.lock /src/requirements.lock
# Dependencies first, from the exact pins and their hashes (a layer that changes only when the pins do).
# The build host's TLS trust (behind an intercepting proxy pip needs it) comes in as the build secret
# pip-cert, mounted for this step only: it is in no layer of the image.
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi; \
    /opt/vmevents/bin/pip install --require-virtualenv --require-hashes --only-binary=:all: \
      -r /src/requirements.lock
COPY pyproject.toml /src/
COPY shared /src/shared
COPY functions /src/functions
# The package itself, without resolving anything new: every dependency is already pinned above.
# (pip fetches the build backend, setuptools, for it: the same secret.)
RUN --mount=type=secret,id=pip-cert \
    if [ -s /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi; \
    /opt/vmevents/bin/pip install --require-virtualenv --no-deps /src \
 && /opt/vmevents/bin/pip check \
 && /opt/vmevents/bin/python -m compileall -q -j 0 /opt/vmevents
COPY image/rootfs.py /src/rootfs.py
RUN /opt/vmevents/bin/python /src/rootfs.py /rootfs

FROM scratch
COPY --from=build /rootfs /
# FUNCTION_SOURCE paths (functions/<name>/main.py) are relative to the installed packages, so the
# file functions-framework loads and the modules it imports are the same, compiled, files.
WORKDIR /opt/vmevents/lib/python3.11/site-packages
# TMPDIR: gunicorn's worker keeps its heartbeat file in the temp dir (gunicorn/workers/workertmp.py
# mkstemp); /dev/shm is a writable tmpfs in every pod even with a read-only root filesystem.
# THREADS: gunicorn's threads in its one worker; each Knative Service's containerConcurrency
# equals it (deploy/base). Without it gunicorn would start 4 threads per *node* CPU.
# XDG_RUNTIME_DIR: gunicorn (>= 25.1) opens a control socket for `gunicornc` at $XDG_RUNTIME_DIR/gunicorn.ctl,
# else at $HOME/.gunicorn/ (gunicorn/config.py _get_default_control_socket, read when gunicorn is imported);
# functions-framework passes gunicorn no options, so this is the one handle: on the tmpfs, not the read-only
# root ("[ERROR] Control server error: [Errno 30] Read-only file system").
ENV PATH=/opt/vmevents/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/dev/shm \
    XDG_RUNTIME_DIR=/dev/shm \
    THREADS=8 \
    PORT=8080
# 65532: the conventional "nonroot" uid; numeric, so Kubernetes can verify runAsNonRoot.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["functions-framework"]
