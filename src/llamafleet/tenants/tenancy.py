"""One server's tenants: the keys it accepts now (reloaded when the keys files change or on SIGHUP, the old keys
kept when the new file is not valid), their limits and their usage. The middleware asks :meth:`Tenancy.admit`; the
service meters each admitted request's tokens through :meth:`Tenancy.meter`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
from collections.abc import Callable

from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import ApiKeysError, KeyRing, Tenant, load_keyring
from llamafleet.tenants.limits import Limiter, Refusal
from llamafleet.tenants.usage import Usage

log = logging.getLogger(__name__)
WATCH_S = 1.0  # how often the keys files' modification times are looked at
FLUSH_EVERY = 5  # usage goes to its SQLite file every this many looks


class Tenancy:
    """The keys, limiter and usage of one server; ``files``: (api_keys_file, admin_api_keys_file) to reload from
    (None: fixed keys, as tests give them)."""

    def __init__(self, ring: KeyRing, metrics: FleetMetrics, files: tuple[str | None, str | None] | None = None,
                 environ: dict[str, str] | None = None) -> None:
        self.ring = ring
        self.files = files
        self._environ = environ
        self.limiter = Limiter()
        self.usage = Usage(metrics)
        self._stamps = self._stamp()
        if ring.usage_file is not None:
            try:
                self.usage.open(ring.usage_file)
            except (OSError, sqlite3.Error) as e:  # a read-only folder beside the keys file, a damaged file
                log.warning("usage per key is kept in memory only: cannot open %s (%s); set usage_file in the keys "
                            "file to a writable place", ring.usage_file, e)

    def admit(self, tenant: Tenant) -> Refusal | None:
        refusal = self.limiter.admit(tenant)
        if refusal is None:
            self.usage.admitted(tenant.name)
        else:
            self.usage.refusal(tenant.name, refusal.limit)
        return refusal

    def meter(self, tenant: Tenant) -> Callable[[int, int, int], None]:
        """What counts one request's tokens as they come: (prompt tokens, of them cached, new completion tokens)."""
        weight = self.ring.cached_token_weight

        def used(prompt: int, cached: int, completion: int) -> None:
            self.usage.used(tenant.name, prompt, cached, completion)
            self.limiter.charge(tenant, prompt - cached + cached * weight + completion)

        return used

    # -- reloading -------------------------------------------------------------------------------------------------
    def reload(self) -> bool:
        """Read the keys files again; on an error, log it and keep the keys as they were."""
        if self.files is None:
            return False
        try:
            ring = load_keyring(*self.files, environ=self._environ)
        except ApiKeysError as e:
            log.error("the keys file was not reloaded, the previous keys stay in force: %s", e)
            return False
        self.ring = ring
        log.info("keys reloaded: %d key(s) of %s", len(ring.tenants), ", ".join(ring.names()) or "nobody")
        return True

    def _stamp(self) -> list[tuple[int, int] | None]:
        stamps: list[tuple[int, int] | None] = []
        for f in self.files or ():
            try:
                st = os.stat(f) if f else None
            except OSError:
                st = None
            stamps.append(None if st is None else (st.st_mtime_ns, st.st_size))
        return stamps

    async def watch(self) -> None:
        """Reload on SIGHUP (where the loop can take signals) and when a keys file changes; flush usage now and then."""
        hup = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no signals
            loop.add_signal_handler(signal.SIGHUP, hup.set)
        looks = 0
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WATCH_S):
                        await hup.wait()
                stamps = self._stamp()
                if hup.is_set() or stamps != self._stamps:
                    hup.clear()
                    self._stamps = stamps
                    self.reload()
                looks += 1
                if looks % FLUSH_EVERY == 0:
                    self.usage.flush()
        finally:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signal.SIGHUP)
            self.usage.close()

