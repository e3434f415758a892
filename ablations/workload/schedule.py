"""When each request of a trace may be sent: closed loop (sessions wait for answers) or open loop (timestamps).

Both schedules share one event API, usable by an async replayer and by a discrete-event simulator:
`initial()` gives the requests ready at the start, and `on_finish(request_id, t_s)` reports that a request
finished at time `t_s` (seconds since the replay start) and returns the requests that this releases, each
with the time it becomes ready (never before `t_s`). Request ids are indices into `trace.requests`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from ablations.workload.io import check_order
from ablations.workload.trace import Trace, TraceError, where

START_MODES = ("trace", "zero")


@dataclass(frozen=True, order=True)
class Release:
    """Request `request_id` may be sent from `ready_s` on (seconds since the replay start)."""

    ready_s: float
    request_id: int


class _Tracker:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.released: dict[int, float] = {}
        self.finished: set[int] = set()

    def release(self, request_id: int, ready_s: float) -> Release:
        self.released[request_id] = ready_s
        return Release(ready_s, request_id)

    def finish(self, request_id: int, t_s: float) -> None:
        if not isinstance(request_id, int) or not 0 <= request_id < len(self.trace.requests):
            raise ValueError(f"request_id: {request_id!r} is not a request of this trace "
                             f"(0..{len(self.trace.requests) - 1})")
        if request_id not in self.released:
            raise ValueError(f"request_id: {request_id} finished but was never released")
        if request_id in self.finished:
            raise ValueError(f"request_id: {request_id} finished twice")
        if not math.isfinite(t_s) or t_s < self.released[request_id]:
            raise ValueError(f"t_s: {t_s!r} for request {request_id} is before its release at "
                             f"{self.released[request_id]} s")
        self.finished.add(request_id)

    @property
    def is_done(self) -> bool:
        return len(self.finished) == len(self.trace.requests)


class OpenLoopSchedule:
    """Every request is ready at its timestamp (ms -> s, times `time_scale`); finishing releases nothing.

    The trace must be in timestamp order (as vLLM and aiperf send it); a decrease is an error naming the
    file and line.
    """

    def __init__(self, trace: Trace, *, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale: {time_scale!r} is not > 0")
        check_order(trace)
        self.trace = trace
        self.time_scale = time_scale
        self._tracker = _Tracker(trace)

    def initial(self) -> list[Release]:
        return [self._tracker.release(i, r.timestamp_ms / 1000 * self.time_scale)
                for i, r in enumerate(self.trace.requests)]

    def on_finish(self, request_id: int, t_s: float) -> list[Release]:
        self._tracker.finish(request_id, t_s)
        return []

    @property
    def is_done(self) -> bool:
        return self._tracker.is_done


class ClosedLoopSchedule:
    """A session's next turn is released `think_ms` after its previous turn and every sub-agent that turn
    spawned have finished; a sub-agent's first turn `think_ms` after its parent's spawning turn finished.

    A root session starts at its first turn's timestamp (`start="trace"`) or at 0 (`start="zero"`).
    With `max_live_sessions`, at most that many root sessions (each with its sub-agents) are live at once;
    the next root, in start order, begins when one completes (never before its own start). Concurrency is
    then the number of live sessions.
    """

    def __init__(self, trace: Trace, *, start: str = "trace", max_live_sessions: int | None = None) -> None:
        if start not in START_MODES:
            raise ValueError(f"start: invalid value {start!r}; valid choices: {', '.join(START_MODES)}")
        if not trace.has_sessions:
            raise TraceError(f"{where(trace.source, None)}a closed-loop schedule needs sessions (fields "
                             "'session', 'turn'); this trace has none: replay it open-loop")
        if max_live_sessions is not None and (isinstance(max_live_sessions, bool)
                                              or not isinstance(max_live_sessions, int) or max_live_sessions < 1):
            raise ValueError(f"max_live_sessions: {max_live_sessions!r} is not an integer >= 1 or None")
        self.trace = trace
        self.start = start
        self.max_live_sessions = max_live_sessions
        self._tracker = _Tracker(trace)
        sessions = trace.sessions
        key = {(r.session, r.turn): i for i, r in enumerate(trace.requests)}
        self._dependents: dict[int, list[int]] = {}
        self._waiting: dict[int, int] = {}
        self._latest: dict[int, float] = {}
        for (parent_id, parent_turn), children in trace.subagents_of().items():
            spawner = key[(parent_id, parent_turn)]
            follower = key.get((parent_id, parent_turn + 1))
            for child in children:
                self._depend(sessions[child].request_ids[0], spawner)
                if follower is not None:
                    self._depend(follower, sessions[child].request_ids[-1])
        for session in sessions.values():
            for before, after in zip(session.request_ids, session.request_ids[1:], strict=False):
                self._depend(after, before)
        self._roots = sorted(trace.root_sessions, key=lambda s: self._root_start(s.request_ids[0]))
        self._next_root = 0
        self._open_in_root: dict[str, int] = {}
        for request in trace.requests:
            root = trace.roots[request.session]
            self._open_in_root[root] = self._open_in_root.get(root, 0) + 1

    def _depend(self, after: int, before: int) -> None:
        self._dependents.setdefault(before, []).append(after)
        self._waiting[after] = self._waiting.get(after, 0) + 1

    def _root_start(self, request_id: int) -> float:
        return 0.0 if self.start == "zero" else self.trace.requests[request_id].timestamp_ms / 1000

    def _start_roots(self, now_s: float) -> list[Release]:
        limit = len(self._roots) if self.max_live_sessions is None else self.max_live_sessions
        live = sum(1 for s in self._roots[:self._next_root] if self._open_in_root[s.session_id] > 0)
        released = []
        while self._next_root < len(self._roots) and live < limit:
            first = self._roots[self._next_root].request_ids[0]
            released.append(self._tracker.release(first, max(now_s, self._root_start(first))))
            self._next_root += 1
            live += 1
        return released

    def initial(self) -> list[Release]:
        if self._tracker.released:
            raise ValueError("initial() was already called")
        return self._start_roots(0.0)

    def on_finish(self, request_id: int, t_s: float) -> list[Release]:
        self._tracker.finish(request_id, t_s)
        released = []
        for after in self._dependents.get(request_id, ()):
            self._waiting[after] -= 1
            self._latest[after] = max(self._latest.get(after, t_s), t_s)
            if self._waiting[after] == 0:
                think_s = self.trace.requests[after].think_ms / 1000
                released.append(self._tracker.release(after, self._latest[after] + think_s))
        root = self.trace.roots[self.trace.requests[request_id].session]
        self._open_in_root[root] -= 1
        if self._open_in_root[root] == 0:
            released.extend(self._start_roots(t_s))
        return released

    @property
    def is_done(self) -> bool:
        return self._tracker.is_done


Schedule = OpenLoopSchedule | ClosedLoopSchedule


def simulate(schedule: Schedule, service_s: Callable[[int], float]) -> list[tuple[float, float]]:
    """Run `schedule` with no queueing: request i runs `service_s(i)` seconds from its ready time.

    Returns (ready_s, finish_s) per request id. The smallest discrete-event driver of the event API.
    """
    times: dict[int, tuple[float, float]] = {}
    events: list[tuple[float, int]] = []

    def start(release: Release) -> None:
        finish_s = release.ready_s + service_s(release.request_id)
        times[release.request_id] = (release.ready_s, finish_s)
        heapq.heappush(events, (finish_s, release.request_id))

    for release in schedule.initial():
        start(release)
    while events:
        finish_s, request_id = heapq.heappop(events)
        for release in schedule.on_finish(request_id, finish_s):
            start(release)
    if not schedule.is_done:
        raise RuntimeError("simulate: the schedule never released some requests (a dependency cycle?)")
    return [times[i] for i in range(len(times))]
