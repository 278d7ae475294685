"""Proxying listeners whose metadata manager has read nothing yet: as one just started reads a long metadata topic
(or all of it into an empty cache), held until a test lets it read on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm.config import SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.rlmm_config import make_rlmm
from rlmm.topic_consumer import ConsumerTask

__all__ = ["Held", "held_listener"]


@dataclass
class Held:
    """Listeners whose metadata manager (``rlmm``, theirs) reads no record until ``released`` is set; ``listener``
    the first."""

    listeners: list[Listener]
    rlmm: Any
    released: threading.Event

    @property
    def listener(self) -> Listener:
        return self.listeners[0]

    def caught_up(self, topic: str, partition: int = 0) -> bool:
        """Whether the manager has caught up with the partition (:meth:`rlm.tier.TierView.ready`)."""
        served = self.listener.server.router.ctx.catalog.by_name(topic)
        return served is not None and self.rlmm.is_ready(served.tp(partition))


@contextmanager
def held_listener(settings: Sequence[SidecarSettings], rsm: Any, cache: Path, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[Held]:
    """A listener of each of ``settings`` (each on a port of its own; a proxy of each broker, told each other's
    ports, keeps a client among them), sharing one metadata manager (of the first settings, its cache in ``cache``)
    whose consumer is held back before it reads a record until :attr:`Held.released` (every other manager's consumer
    polls as usual): the tier they see is empty and not ready. Their tier views keep chains an hour: one read while
    held, if kept, would stay. Released, stopped and their answers read ahead let go of at exit (a later test's
    read-ahead gauge does not count them)."""
    released = threading.Event()
    consume_once = ConsumerTask._consume_once

    def held_back(task: ConsumerTask) -> None:
        if task.cache.path != cache or released.is_set():
            consume_once(task)
        else:
            time.sleep(0.05)
    monkeypatch.setattr(ConsumerTask, "_consume_once", held_back)
    rlmm = make_rlmm(settings[0], serve_all=True, cache_dir=cache, read_only=True)
    listeners: list[Listener] = []
    try:
        for s in settings:
            listeners.append(start_listener(s, rsm, rlmm=rlmm))
            listeners[-1].server.router.ctx.tier.ttl_s = 3600.0
        yield Held(listeners, rlmm, released)
    finally:
        released.set()
        for listener in listeners:
            listener.stop()
            proxy = listener.server.router.proxy
            for ahead in list(proxy.prefetched if proxy is not None else ()):
                ahead.claim.release()
        rlmm.close()
