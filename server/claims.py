"""This replica's claims on sessions in the session store (`--session-store`), and keeping them fresh.

A claim is an owner lease with a fencing epoch (server/store.py). While a session lives here, its
snapshot (server/_continuity.py) is written whenever it changed and its lease is renewed, so that
another replica can continue it if this one dies; its resume tokens name it in the store. The
`Runtime` decides *when* (attach, resume, detach, drain, close); this module knows *how*.

For a model that rebuilds a session's state from a log of its micro-turns (`Rebuilding`, models/base.py:
the native model), the log is appended to the store with each sync, so that another replica can replay
it; what the last sync before a kill -9 had not written (under STORE_SYNC) is the state's lag there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from models.base import InteractionModel, Rebuilding
from server._continuity import Restored, fingerprint, parse, restore, snapshot
from server.engine import Engine
from server.sessions import Refused, Session, check_pace
from server.store import Claim, SessionStore

log = logging.getLogger(__name__)

# Micro-turns replayed per trip to the inference thread: one, so that a long replay delays the live
# sessions' next step by one step's time at most.
REBUILD_CHUNK = 1


Opener = Callable[[str], Awaitable[Session]]  # opens a registry session under a given id


class Claims:
    def __init__(self, store: SessionStore, model: InteractionModel | None = None) -> None:
        self.store = store
        self.logs = model if isinstance(model, Rebuilding) else None  # keeps micro-turn logs to store
        self._claims: dict[str, Claim] = {}  # session id -> this replica's claim on it
        self._saved: dict[str, str] = {}  # session id -> fingerprint of the snapshot last written
        self._log_restart: set[str] = set()  # sessions whose stored log begins again with the next append
        self._unlogged: set[str] = set()  # sessions whose stored log has a hole: no longer appended

    def keep_log(self, session: Session, restart: bool = False) -> None:
        """Log the session's micro-turns (before its first step); `restart`: its stored log (a replay that
        failed) is replaced by this one."""
        if self.logs is not None:
            self.logs.keep_log(session.state)
            if restart:
                self._log_restart.add(session.id)

    async def rebuild(self, session: Session, run: Callable[..., Awaitable[Any]]) -> tuple[int, str | None]:
        """Replay the session's stored micro-turn log into its freshly opened model state, one micro-turn per
        call of `run` (Engine.call: the inference thread), so that live sessions' steps go in between
        instead of waiting for the whole replay. Returns the micro-turns replayed and, when it failed,
        why (the state is then to be opened afresh)."""
        if self.logs is None:
            return 0, None
        records = await self.store.load_log(session.id)
        if records is None:
            return 0, "its stored micro-turn log was refused (over its bound, or not written by a replica)"
        try:
            for i in range(0, len(records), REBUILD_CHUNK):
                await run(self.logs.rebuild, session.state, records[i : i + REBUILD_CHUNK])
        except ValueError as exc:
            return i, str(exc)
        return len(records), None

    async def write_log(self, session: Session, claim: Claim) -> None:
        """Append what the session logged since the last write."""
        if self.logs is None or session.state is None:
            return
        records = self.logs.take_log(session.state)
        restart = session.id in self._log_restart
        if (not records and not restart) or session.id in self._unlogged:
            return
        if await self.store.append_log(claim, records, restart=restart) is None:
            # Those records are gone from memory: a log with a hole rebuilds nothing, so stop writing it.
            log.warning("session %s: its micro-turn log could not be written; it cannot be rebuilt elsewhere",
                        session.id)
            self._unlogged.add(session.id)
        self._log_restart.discard(session.id)

    def holds(self, session: Session) -> bool:
        return session.id in self._claims

    async def own(self, session: Session) -> None:
        """A new session: claim it and write its first snapshot and its token. A store that is down
        leaves the session living here only (counted in duplex_store_errors)."""
        claim = await self.store.claim(session.id)
        if claim is None:
            return
        self._claims[session.id] = claim
        await self.save(session, claim)
        await self.bind_token(session)

    async def take_over(self, token: str, media: bool, open_session: Opener, engine: Engine,
                        grace: float) -> tuple[Session, Restored, str | None]:
        """A resume whose token another replica issued (it is down, or the proxy sent it here): read its
        session from the store, claim it, open it here under its own id (`open_session`) with its settings
        and conversation, and rebuild its model's state where the model can. Returns the session (not yet
        seated), what was restored, and why the model's state starts afresh (None when it does not).
        `grace`: how long the store keeps the session for a retry. Raises Refused."""
        store = self.store
        sid = await store.session_for(token)
        loaded = await store.load(sid) if sid is not None else None
        if sid is None or loaded is None:
            raise Refused("invalid_resume_token", "resume token is unknown or expired, and its replica cannot be "
                          "reached; open a new session", 404, 1008)
        try:
            restored = parse(loaded[1])
        except ValueError as exc:
            log.error("session %s cannot be restored from the store: %s", sid, exc)
            raise Refused("invalid_resume_token", "the stored session behind this resume token could not be "
                          "read; open a new session", 404, 1008) from None
        check_pace(restored.settings.pace, media)
        claim = await store.claim(sid)
        if claim is None:  # its replica still holds the lease: alive, or dead for less than its lease
            raise Refused("session_busy", "the session is still held by its replica; retry in a moment", 503, 1013,
                          {"Retry-After": "1"})
        try:
            session = await open_session(sid)
        except Refused as exc:
            await store.hand_off(claim)  # the lease goes, the snapshot stays: another replica may take it
            if exc.code != "server_full":
                raise
            raise Refused("no_room", "no place is free here for your session (its server went away); it is kept "
                          f"for {grace:g} s after your disconnect: retry with the same token",
                          503, 1013, {"Retry-After": "2"}) from None
        restore(session, restored)
        self.keep_log(session)
        await self.adopt(session, claim, previous_token=token)  # its lease is renewed during a rebuild
        replayed, failed = await self.rebuild(session, engine.call)  # the model's state, if it can
        if failed:
            log.warning("session %s: the model's state could not be rebuilt (%s); it starts afresh", sid, failed)
            await engine.call(engine.model.close, session.state)
            session.state = await engine.open_state(sid)
            self.keep_log(session, restart=True)
        log.info("session %s restored from the store (%d conversation entries, %d micro-turns replayed)", sid,
                 len(session.log.entries), replayed)
        return session, restored, failed

    async def adopt(self, session: Session, claim: Claim, previous_token: str) -> None:
        """A session restored here from the store under `claim`: write it and its new token."""
        self._claims[session.id] = claim
        await self.save(session, claim)
        await self.bind_token(session, previous=previous_token)

    async def save(self, session: Session, claim: Claim) -> bool | None:
        """Write the session's snapshot when it changed; False when another replica took it over."""
        snap = snapshot(session)
        mark = fingerprint(snap)
        if self._saved.get(session.id) == mark:
            return True
        written = await self.store.save(claim, snap)
        if written:
            self._saved[session.id] = mark
        return written

    async def bind_token(self, session: Session, previous: str | None = None) -> None:
        """The session's current token names it in the store (`previous` stops doing so)."""
        claim = self._claims.get(session.id)
        if claim is not None:
            await self.store.bind_token(session.resume_token, session.id, previous, claim.epoch)

    async def alias(self, session: Session, token: str) -> None:
        """`token` (one the client may still hold) names the session in the store too."""
        claim = self._claims.get(session.id)
        if token and claim is not None:
            await self.store.bind_token(token, session.id, epoch=claim.epoch)

    async def hand_off(self, session: Session) -> None:
        """Write the session's last snapshot and give up its lease, keeping the snapshot, so that another
        replica can take it over at once (a drain); the local copy is then closed without a release."""
        claim = self._claims.pop(session.id, None)
        if claim is None:
            return
        self._saved.pop(session.id, None)
        if await self.store.save(claim, snapshot(session)):
            await self.write_log(session, claim)
            await self.store.hand_off(claim)
        self._forget(session)

    async def release(self, session: Session) -> None:
        """The session ended here: its lease and snapshot go."""
        claim = self._claims.pop(session.id, None)
        self._saved.pop(session.id, None)
        self._forget(session)
        if claim is not None:
            await self.store.release(claim)

    def _forget(self, session: Session) -> None:
        self._log_restart.discard(session.id)
        self._unlogged.discard(session.id)

    async def sync(self, sessions: list[Session]) -> list[Session]:
        """Renew the leases of `sessions` and write changed snapshots; returns those another replica took
        over (they are served there now: the caller closes them here)."""
        lost = []
        for session in sessions:
            claim = self._claims.get(session.id)
            if claim is None:
                continue
            renewed = await self.store.renew(claim)
            if renewed == 2:  # the store restarted empty: write everything again
                log.info("session store lost session %s; writing it again", session.id)
                self._saved.pop(session.id, None)
                self._unlogged.add(session.id)  # its log's start is gone with the store's memory
                await self.bind_token(session)
            if renewed == 0 or (renewed is not None and await self.save(session, claim) is False):
                log.warning("session %s was taken over by another replica; closing it here", session.id)
                self._claims.pop(session.id, None)
                lost.append(session)
            elif renewed is not None:
                await self.write_log(session, claim)
        return lost
