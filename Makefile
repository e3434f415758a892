# The two commands of the README. Both create .venv and install on first use (scripts/bootstrap.sh).
PY := .venv/bin/python

.PHONY: run test lint env
run: env
	$(PY) -m ablations $(ARGS)

test: env
	$(PY) -m ruff check .
	$(PY) -m pytest $(ARGS)

lint: env
	$(PY) -m ruff check .

env:
	@scripts/bootstrap.sh
