# vmevents: `make run` plays the whole system, `make test` runs the tests (both install what they need).
PYTHON ?= python3
STAMP := .run/installed

.PHONY: install run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@mkdir -p .run && touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PYTHON) -m tests.sim.run $(STORY)

test: $(STAMP)
	$(PYTHON) -m pytest

bench: $(STAMP)
	$(PYTHON) -m tests.bench $(BENCH)

clean:
	rm -rf .run .pytest_cache build *.egg-info
