"""The engine: one thread that runs scheduler steps while there is work; any number of client
threads (or an asyncio loop) submit requests and read their tokens from a queue.

Clients never touch a model: `submit` checks the request's limits, puts it in the bounded
waiting queue (or raises `EngineBusy`), and the engine thread does everything else. A single
`generate` is a client with batch 1: the same code path.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ..backends.kvpool import kv_bytes_per_slot
from .request import Request
from .scheduler import Scheduler, end_unstarted

IDLE_S = 0.5  # an idle engine thread ends after this long


class EngineBusy(RuntimeError):
    """Every slot is taken and the waiting queue is full: try again later."""


class EngineClosed(RuntimeError):
    """The engine was shut down."""


class Engine:
    def __init__(self, scheduler: Scheduler, max_queue: int = 64):
        """max_queue: requests that may wait for a slot; beyond it `submit` raises EngineBusy."""
        self.sched = scheduler
        self.max_queue = max_queue
        self._waiting: deque[Request] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.started = time.time()

    # --- client side -------------------------------------------------------------------------
    def submit(self, r: Request) -> None:
        with self._cv:
            if self._closed:
                raise EngineClosed("the engine is shut down")
            waiting = len(self._waiting) + len(self.sched.deferred)
            if waiting >= self.max_queue + self.sched.pool.free_slots:
                raise EngineBusy(f"all {self.sched.pool.slots} slots are busy and {waiting} requests "
                                 f"are waiting (max_queue={self.max_queue}); retry later")
            r.t_submit = time.perf_counter()  # timeouts and queue time count from here
            self._waiting.append(r)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="specrt-engine", daemon=True)
                self._thread.start()
            self._cv.notify()

    def cancel(self, r: Request) -> None:
        """Stop a request; its slot is free at the next step (a waiting one never starts)."""
        r.cancelled = True
        with self._cv:
            self._cv.notify()

    def counters(self) -> dict:
        """A snapshot: running / waiting requests, the slots and their KV bytes (every pool),
        and the scheduler's totals."""
        with self._cv:
            waiting = len(self._waiting) + len(self.sched.deferred)
        c = self.sched.counters.snapshot()
        per_slot = kv_bytes_per_slot(self.sched.pools)
        c.update(running=len(self.sched.running), waiting=waiting, slots=self.sched.pool.slots,
                 kv_bytes_per_slot=per_slot, kv_bytes=per_slot * self.sched.pool.slots)
        return c

    def alive(self) -> bool:
        """Whether the engine can serve: not closed, and no request waits without a thread to
        run it (the thread ends when idle and a submit starts one; a dead thread with work left
        is a bug). Serving layers report it as their health."""
        with self._cv:
            if self._closed:
                return False
            return not self._waiting or (self._thread is not None and self._thread.is_alive())

    def close(self, timeout: float | None = 5.0) -> None:
        """Refuse new requests, end the running ones (stop_reason "stop"), stop the thread."""
        with self._cv:
            self._closed = True
            for r in list(self._waiting) + list(self.sched.running) + list(self.sched.deferred):
                r.cancelled = True
            self._cv.notify()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    # --- engine thread -----------------------------------------------------------------------
    def _take_waiting(self) -> Request | None:
        with self._cv:
            r = self._waiting.popleft() if self._waiting else None
            if r is not None and self._closed:
                r.cancelled = True
        return r

    def _purge_waiting(self) -> None:
        """Cancelled or timed-out requests leave the queue now, not when a slot frees."""
        now = time.perf_counter()
        with self._cv:
            gone = [r for r in self._waiting if r.cancelled or r.expired(now)]
            for r in gone:
                self._waiting.remove(r)
        for r in gone:
            end_unstarted(r, "stop" if r.cancelled else "timeout")

    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # whatever ended the loop, no client waits on a thread that is gone
            with self._cv:
                if self._thread is threading.current_thread():
                    self._thread = None
                orphans = list(self._waiting) if self._closed else []
                for r in orphans:
                    self._waiting.remove(r)
                if self._waiting and self._thread is None:  # ended by an error with work left
                    self._thread = threading.Thread(target=self._loop, name="specrt-engine", daemon=True)
                    self._thread.start()
            for r in orphans:
                end_unstarted(r, "stop")

    def _serve(self) -> None:
        while True:
            with self._cv:
                if not self._waiting and not self.sched.running and not self.sched.deferred and not self._closed:
                    self._cv.wait(IDLE_S)
                if not self._waiting and not self.sched.running and not self.sched.deferred:
                    # idle (or closed): the thread ends, so a pipeline nobody holds can be freed;
                    # the next submit (same lock) starts a new one
                    self._thread = None
                    return
            self._purge_waiting()
            try:
                self.sched.step(self._take_waiting)
            except Exception as e:  # noqa: BLE001 - an engine bug must not hang its clients
                self.sched.fail_running(e)
            if self._closed:
                try:
                    self.sched.admit(self._take_waiting)  # retires the cancelled ones
                except Exception:  # noqa: BLE001 - the next turn of the loop retires them again
                    pass
