"""Many requests at once: KV slots (runtime/backends/kvpool.py), requests as data, a step scheduler and
the thread that runs it."""

from .engine import Engine, EngineBusy, EngineClosed
from .request import Request, Stats
from .scheduler import Scheduler

__all__ = ["Engine", "EngineBusy", "EngineClosed", "Request", "Scheduler", "Stats"]
