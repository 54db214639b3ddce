"""An engine's lifecycle: the states its pipeline can be in and the moves between them.

Guarantee: the state changes only through `Lifecycle.move`, only along `TRANSITIONS`, and
each change is logged once, here, with its reason. A move the table does not allow is
refused (`TransitionRefused`) and the state stays. The engine's main loop (a query that
died, recovered or repaired; a restore that reached sync), the admin API's operations
(start, stop, persist, restore: under the engine's lock) and its shutdown move it; a status
read never does. Moving to the state the engine is in only changes the reason.

The state's value is what `GET /pipeline` says (`PipelineInfo.state`): the API and its
clients see the same strings as before.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Mapping


class State(enum.StrEnum):
    STOPPED = "stopped"
    """No query runs and the engine is out of the election (never started, stopped, shut
    down, or a start refused: the reason says why and what to do)."""
    RUNNING = "running"
    """The query runs; the engine contends in the election."""
    RESTORING = "restoring"
    """Loaded a snapshot (or rebuilds cold) and replays the inbound topic until in sync."""
    PERSISTING = "persisting"
    """A standby's query is stopped while its checkpoint and buffer are copied."""
    RECOVERING = "recovering"
    """The query died: a quarantine search's next step, or a restart after a backoff."""


# Where each state may go. Moving to the same state is always allowed (a new reason).
TRANSITIONS: Mapping[State, frozenset[State]] = {
    # start, restore; a start refused keeps it stopped (the same state, a reason).
    State.STOPPED: frozenset({State.RUNNING, State.RESTORING}),
    # stop, the query died, persist.
    State.RUNNING: frozenset({State.STOPPED, State.RECOVERING, State.PERSISTING}),
    # in sync (the main loop), stop, the query died, a repair's restart of the query.
    State.RESTORING: frozenset({State.RUNNING, State.STOPPED, State.RECOVERING}),
    # the copy is done and the query restarted; or its restart failed (retried after a
    # backoff).
    State.PERSISTING: frozenset({State.RUNNING, State.RECOVERING}),
    # the query restarted, stop, restore (a restore's refused start stops it).
    State.RECOVERING: frozenset({State.RUNNING, State.STOPPED, State.RESTORING}),
}


class TransitionRefused(RuntimeError):
    """A move `TRANSITIONS` does not allow: a bug in the engine's coordination."""


class Lifecycle:
    """The state and its reason. Thread-safe: a move checks and changes the state under a
    lock of its own, which it holds for nothing else (a leaf: see docs/design.md, "Threads
    and locks")."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._state = State.STOPPED
        self._reason = "not started"

    @property
    def state(self) -> State:
        return self._state

    @property
    def reason(self) -> str:
        return self._reason

    def move(self, to: State, reason: str = "", *, only_from: State | None = None) -> bool:
        """Go to `to` for `reason`; False (and no change) when `only_from` is given and the
        state is another. Raises TransitionRefused for a move the table does not allow."""
        with self._lock:
            was = self._state
            if only_from is not None and was is not only_from:
                return False
            if to is not was and to not in TRANSITIONS[was]:
                raise TransitionRefused(
                    f"the pipeline cannot go from {was} to {to} ({reason or 'no reason'}); "
                    f"allowed from {was}: {', '.join(sorted(TRANSITIONS[was])) or 'nothing'}. "
                    "This is a bug of the engine: report it with this log"
                )
            self._state, self._reason = to, reason
        if to is not was:
            self._log.info("%s -> %s%s", was, to, f" ({reason})" if reason else "")
        return True
