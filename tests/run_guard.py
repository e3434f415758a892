"""The test run's limits and its process guard, as a pytest plugin (tests/conftest.py takes its hooks; a pytest
run in a subprocess loads it with `-p run_guard`).

Limits (pyproject `[tool.pytest.ini_options]`): `timeout` per test (pytest-timeout), `engine_timeout` per test
marked `e2e` (vLLM engines and servers start inside the first test that needs them). At the end of the run a
process it started that is still alive fails the run, named, and is ended.
"""

import signal

import procs
import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("engine_timeout", "seconds a test marked e2e may take (it may start vLLM engines)", default="900")
    parser.addini("guard_grace", "seconds the run's processes get to exit after its last test", default="10")


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}: the run was told to stop")


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (CI's overall `timeout`) ends the run as Ctrl-C does: fixtures are torn down and the process guard
    # below ends what the run started.
    signal.signal(signal.SIGTERM, _terminate)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Engine tests get the larger named limit unless they set their own."""
    engine_timeout = float(config.getini("engine_timeout"))
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(engine_timeout))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process it started is still alive at its end (after a grace period for shutdowns),
    naming each one; they are ended here so none outlives the run."""
    if session.config.pluginmanager.hasplugin("dsession"):
        return      # pytest-xdist's controller: its workers are its children until it ends them; each checks its own
    grace_s = float(session.config.getini("guard_grace"))
    left = procs.wait_gone(within_s=grace_s)
    if not left:
        return
    procs.end_processes(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"process guard: {len(left)} process(es) of this test run still alive {grace_s:g} s after its "
             "last test (ended now):", *(f"  {p}" for p in left)]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
