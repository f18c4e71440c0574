"""This replica's claims on sessions in the session store (`--session-store`), and keeping them fresh.

A claim is an owner lease with a fencing epoch (server/store.py). While a session lives here, its
snapshot (server/_continuity.py) is written whenever it changed and its lease is renewed, so that
another replica can continue it if this one dies; its resume tokens name it in the store. The
`Runtime` decides *when* (attach, resume, detach, drain, close); this module knows *how*.
"""

from __future__ import annotations

import logging

from server._continuity import fingerprint, snapshot
from server.sessions import Session
from server.store import Claim, SessionStore

log = logging.getLogger(__name__)


class Claims:
    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._claims: dict[str, Claim] = {}  # session id -> this replica's claim on it
        self._saved: dict[str, str] = {}  # session id -> fingerprint of the snapshot last written

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
        if session.id in self._claims:
            await self.store.bind_token(session.resume_token, session.id, previous)

    async def alias(self, session: Session, token: str) -> None:
        """`token` (one the client may still hold) names the session in the store too."""
        if token and session.id in self._claims:
            await self.store.bind_token(token, session.id)

    async def hand_off(self, session: Session) -> None:
        """Write the session's last snapshot and give up its lease, keeping the snapshot, so that another
        replica can take it over at once (a drain); the local copy is then closed without a release."""
        claim = self._claims.pop(session.id, None)
        if claim is None:
            return
        self._saved.pop(session.id, None)
        if await self.store.save(claim, snapshot(session)):
            await self.store.hand_off(claim)

    async def release(self, session: Session) -> None:
        """The session ended here: its lease and snapshot go."""
        claim = self._claims.pop(session.id, None)
        self._saved.pop(session.id, None)
        if claim is not None:
            await self.store.release(claim)

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
                await self.bind_token(session)
            if renewed == 0 or (renewed is not None and await self.save(session, claim) is False):
                log.warning("session %s was taken over by another replica; closing it here", session.id)
                self._claims.pop(session.id, None)
                lost.append(session)
        return lost
