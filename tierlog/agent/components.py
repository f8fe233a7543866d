"""The agent's two components (tierlog's rlmm and rsm), each created when its configuration arrives.

Creating the rlmm can wait on the broker that is configuring it, so creation runs in the background.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from rlmm.errors import InvalidArgumentError, RemoteStorageError, RemoteStorageNotReadyError
from tierlog.agent.broker_config import rlmm_config, rsm_config

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long Configure waits for a component to exist before answering: long enough to report a bad
# config key straight away, short enough not to hold up a broker whose own startup the rlmm waits for.
CONFIG_ERROR_WAIT_S = 2.0


class ComponentName(enum.IntEnum):
    """The protocol's Component values."""

    REMOTE_LOG_METADATA_MANAGER = 1
    REMOTE_STORAGE_MANAGER = 2

    @property
    def short(self) -> str:
        return "rlmm" if self is ComponentName.REMOTE_LOG_METADATA_MANAGER else "rsm"


class NotConfiguredError(RemoteStorageError):
    """The component has no configuration in this agent (it was restarted, or creating it failed)."""


class ComponentSlot(Generic[T]):
    """One component: created in the background from its config, closed once.

    Calls that only inform the component (leadership changes) may arrive before it exists; they are
    queued with `when_ready` and run in order right after creation, as Kafka's own manager does.
    """

    def __init__(
        self, name: ComponentName, factory: Callable[[Mapping[str, Any]], T], config: Mapping[str, Any]
    ) -> None:
        self.name = name
        self.config = dict(config)
        self._factory = factory
        self._lock = threading.Lock()
        self._created = threading.Event()
        self._instance: T | None = None
        self._error: BaseException | None = None
        self._pending: list[Callable[[T], None]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._create, name=f"create-{name.short}", daemon=True)
        self._thread.start()

    def _create(self) -> None:
        try:
            instance = self._factory(self.config)
        except BaseException as exc:  # reported to every caller, so a bad config names itself
            log.error("creating the %s failed: %s", self.name.short, exc)
            with self._lock:
                self._error = exc
            self._created.set()
            return
        with self._lock:
            pending, self._pending = self._pending, []
            closed = self._closed
            if not closed:
                self._instance = instance
        if closed:
            _close(instance)
        else:
            for action in pending:
                self._run_quietly(action, instance)
        self._created.set()
        log.info("%s created", self.name.short)

    def _run_quietly(self, action: Callable[[T], None], instance: T) -> None:
        try:
            action(instance)
        except Exception:
            log.exception("a queued call to the %s failed", self.name.short)

    def wait_created(self, timeout: float) -> BaseException | None:
        """Wait up to `timeout` for creation; return the creation error, if any."""
        self._created.wait(timeout)
        with self._lock:
            return self._error

    @property
    def failed(self) -> BaseException | None:
        with self._lock:
            return self._error

    def get(self, timeout: float) -> T:
        """The component, waiting up to `timeout` seconds for it to be created."""
        if not self._created.wait(max(timeout, 0.0)):
            raise RemoteStorageNotReadyError(
                f"the {self.name.short} is still starting in the agent; retry shortly"
            )
        with self._lock:
            if self._error is not None:
                raise NotConfiguredError(f"creating the {self.name.short} failed: {self._error}")
            if self._instance is None:
                raise NotConfiguredError(f"the {self.name.short} is closed")
            return self._instance

    def get_nowait(self) -> T | None:
        with self._lock:
            return self._instance

    def get_if_created(self) -> T | None:
        """The component, or None while it is still being created; NotConfiguredError if creating it failed,
        so that the broker's adapter configures it again instead of taking it for one still starting."""
        with self._lock:
            if self._error is not None:
                raise NotConfiguredError(f"creating the {self.name.short} failed: {self._error}")
            return self._instance

    def when_ready(self, action: Callable[[T], None]) -> None:
        """Run `action` now if the component exists, else right after it is created."""
        with self._lock:
            instance = self._instance
            if instance is None and self._error is None and not self._closed:
                self._pending.append(action)
                return
        if instance is not None:
            action(instance)
        else:
            raise NotConfiguredError(f"the {self.name.short} is not available: {self._error or 'closed'}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            instance, self._instance = self._instance, None
            self._pending.clear()
        if instance is not None:
            _close(instance)


def _close(instance: object) -> None:
    close = getattr(instance, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            log.exception("closing %r failed", instance)


class Components:
    """The agent's rlmm and rsm slots, created by the broker's Configure calls (or the agent's config)."""

    def __init__(
        self,
        factories: Mapping[ComponentName, Callable[[Mapping[str, Any]], Any]],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self._factories = dict(factories)
        self._on_idle = on_idle
        self._lock = threading.Lock()
        self._slots: dict[ComponentName, ComponentSlot[Any]] = {}
        self._preset: set[ComponentName] = set()

    @staticmethod
    def translate(name: ComponentName, config: Mapping[str, Any]) -> dict[str, Any]:
        return (
            rlmm_config(config) if name is ComponentName.REMOTE_LOG_METADATA_MANAGER else rsm_config(config)
        )

    def preset(self, name: ComponentName, config: Mapping[str, Any]) -> None:
        """Create a component from the agent's own config; a broker's later Configure leaves it alone."""
        self._install(name, self.translate(name, config))
        self._preset.add(name)

    def configure(self, name: ComponentName, broker_config: Mapping[str, Any]) -> None:
        if name in self._preset:
            log.info(
                "the %s was configured by the agent's own config; the broker's config is not used", name.short
            )
            return
        config = self.translate(name, broker_config)
        slot = self._install(name, config, reuse=True)
        error = slot.wait_created(CONFIG_ERROR_WAIT_S)
        if error is not None:
            raise error

    def _install(self, name: ComponentName, config: dict[str, Any], reuse: bool = False) -> ComponentSlot[Any]:
        """A new slot for `config` in place of the current one; with `reuse`, the current one unless it failed.

        Checked and installed under one lock: the broker's threads that find a restarted agent unconfigured all
        configure it at once, and two rlmm slots created side by side would both open its view, which RocksDB
        lets one opener hold (the second fails for good, "lock hold by current process")."""
        with self._lock:
            old = self._slots.get(name)
            if reuse and old is not None and old.failed is None:
                if old.config != config:
                    raise InvalidArgumentError(
                        f"the {name.short} is already configured with a different config; "
                        "each broker needs its own agent (agent.socket.path)"
                    )
                return old
            slot: ComponentSlot[Any] = ComponentSlot(name, self._factories[name], config)
            self._slots[name] = slot
        if old is not None:
            old.close()
        return slot

    def slot(self, name: ComponentName) -> ComponentSlot[Any]:
        with self._lock:
            slot = self._slots.get(name)
        if slot is None:
            raise NotConfiguredError(
                f"the {name.short} is not configured in this agent (did the agent restart?)"
            )
        return slot

    def get(self, name: ComponentName, timeout: float) -> Any:
        return self.slot(name).get(timeout)

    def configured(self) -> list[ComponentName]:
        with self._lock:
            return sorted(n for n, s in self._slots.items() if s.failed is None)

    def close(self, name: ComponentName) -> None:
        with self._lock:
            slot = self._slots.pop(name, None)
            idle = not self._slots
        if slot is not None:
            slot.close()
            log.info("the broker closed the %s", name.short)
        if idle and slot is not None and self._on_idle is not None:
            self._on_idle()

    def close_all(self) -> None:
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            slot.close()
