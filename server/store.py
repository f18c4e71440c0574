"""The session store: what a session needs to continue on another replica, in Redis (or Valkey).

This module is the store's protocol; the runtime does not use it yet (resuming a session from the store
on another replica is the next step). Keys, all under `duplex:`:

- `s:{session}` (hash): `epoch` (the fencing counter), `owner` (replica id), `snap` (JSON snapshot);
  expires after the resume grace, renewed by the owner.
- `lease:{session}` (string): `{replica}:{epoch}`, who serves the session now; expires after `lease_s`,
  renewed by the owner every second.
- `t:{sha256(token)}` (string): the session a resume token names (tokens are credentials: stored
  hashed); expires after the resume grace.
- `log:{session}` (list): the model's micro-turn log, for a model that rebuilds a session's state by
  replaying it (`Rebuilding`, models/base.py: the native model); appended under the same fencing epoch,
  expiring with the session.

A replica that attaches a session **claims** it: the lease is taken with `SET NX` (or kept, if it is
already its own), and the session's epoch is incremented; the new epoch is the fencing token every later
write carries. A write whose epoch is not the current one (a stale owner, after a takeover) is
rejected inside Redis (a Lua script, server/store_scripts.py: check and write are one step). Two
replicas never serve one session: the second claim fails while the first owner's lease lives (it renews
it every second; a replica killed with -9 stops renewing, and after `lease_s` another may claim).

Every operation returns a plain result and counts failures instead of raising: when the store is down,
sessions go on where they are (only cross-replica resume is lost).

Nothing read back is trusted more than the store is: with the cluster secret, every snapshot, log record
and token binding carries an HMAC-SHA256 (over its kind, the session it belongs to and its bytes) and one
whose MAC does not verify is refused as if it were not there, so whoever can write to Redis cannot make a
replica restore a conversation, replay micro-turns or resume a session that no replica wrote. A log
record's MAC covers its position too, and an append must find the log as long as its writer left it: a
record dropped, moved or planted in between fails the read back or stops the writes (only a cut of the
newest records is not seen by the MACs). Reads are bounded: a snapshot over MAX_SNAPSHOT_BYTES and a log
over MAX_LOG_BYTES are refused inside Redis, before they cross the network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.store_scripts import (
    APPEND_LOG,
    BIND_TOKEN,
    CLAIM,
    HAND_OFF,
    LOAD,
    LOAD_LOG_PAGE,
    RELEASE,
    RENEW,
    SAVE,
)

log = logging.getLogger(__name__)

PREFIX = "duplex:"
PASSWORD_ENV = "DUPLEX_SESSION_STORE_PASSWORD"  # the store's AUTH password, kept out of argv and URLs
MAX_SNAPSHOT_BYTES = 32 * 1024 * 1024  # a session's text, items and detached backlog are bounded well below
MAX_LOG_BYTES = 64 * 1024 * 1024  # a micro-turn log read back for a replay
LOG_PAGE = 512  # log records per read
_MAC_BYTES = 16


def _at(session_id: str, index: int) -> str:
    """What a log record's MAC is bound to: its session and its place in the log."""
    return f"{session_id}#{index}"


def _token_key(token: str) -> str:
    return f"{PREFIX}t:{hashlib.sha256(token.encode()).hexdigest()}"


@dataclass(frozen=True)
class Claim:
    session_id: str
    epoch: int  # the fencing token: every write for this ownership carries it


class SessionStore:
    """Use `SessionStore.from_url("redis://HOST:PORT/DB", replica_id, ttl_s)`; `aclose()` at the end."""

    def __init__(self, client: aioredis.Redis, replica_id: str, ttl_s: float, lease_s: float = 3.0,
                 secret: str | None = None) -> None:
        self._r = client
        self._key = secret.encode() if secret else None  # the cluster secret: what is stored is MACed
        self._overhead = _MAC_BYTES if self._key is not None else 0
        self.replica_id = replica_id
        self.ttl_s = max(1, int(ttl_s + 0.999))  # the resume grace, whole seconds
        self.lease_ms = int(lease_s * 1000)
        self.errors = 0  # operations that failed because the store was unreachable or answered an error
        self.reachable = True  # the last operation reached the store (/healthz reports it)
        self._claim = client.register_script(CLAIM)
        self._save = client.register_script(SAVE)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._hand_off = client.register_script(HAND_OFF)
        self._append_log = client.register_script(APPEND_LOG)
        self._load = client.register_script(LOAD)
        self._log_page = client.register_script(LOAD_LOG_PAGE)
        self._bind_token = client.register_script(BIND_TOKEN)
        self.refused = 0  # entries read back whose MAC did not verify, or over their bound
        self._log_len: dict[str, int] = {}  # session id -> its stored log's length after our last append

    @classmethod
    def from_url(cls, url: str, replica_id: str, ttl_s: float, lease_s: float = 3.0,
                 secret: str | None = None) -> SessionStore:
        """`url` may carry a password (`redis://:PASSWORD@HOST:PORT/DB`); else $DUPLEX_SESSION_STORE_PASSWORD
        is sent, if set."""
        # Short timeouts: a store that hangs must not hold a session's event handling for long.
        extra: dict[str, Any] = {}
        if os.environ.get(PASSWORD_ENV) and "@" not in url.partition("://")[2].partition("/")[0]:
            extra["password"] = os.environ[PASSWORD_ENV]
        client = aioredis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5, **extra)
        return cls(client, replica_id, ttl_s, lease_s, secret)

    # -- MACs ---------------------------------------------------------------------------------------

    def _mac(self, kind: bytes, owner: str, data: bytes) -> bytes:
        assert self._key is not None
        msg = kind + b"\0" + owner.encode() + b"\0" + data
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:_MAC_BYTES]

    def _seal(self, kind: bytes, owner: str, data: bytes) -> bytes:
        """`data` as stored: after its MAC when there is a secret."""
        return data if self._key is None else self._mac(kind, owner, data) + data

    def _open(self, kind: bytes, owner: str, stored: bytes) -> bytes | None:
        """What `_seal` stored, or None when its MAC does not verify (counted and logged)."""
        if self._key is None:
            return stored
        mac, data = stored[:_MAC_BYTES], stored[_MAC_BYTES:]
        if len(mac) == _MAC_BYTES and hmac.compare_digest(mac, self._mac(kind, owner, data)):
            return data
        self._refuse(f"{kind.decode()} of {owner} is not MACed with the cluster secret")
        return None

    def _refuse(self, what: str) -> None:
        self.refused += 1
        log.warning("session store: refused what it holds: %s", what)

    async def aclose(self) -> None:
        await self._r.aclose()

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        self.reachable = False
        log.warning("session store: %s failed: %s", what, exc)

    async def claim(self, session_id: str) -> Claim | None:
        """Take (or keep) the session's lease; None while another replica holds it, or the store fails."""
        try:
            epoch = int(await self._claim(keys=[f"{PREFIX}lease:{session_id}", f"{PREFIX}s:{session_id}"],
                                          args=[self.replica_id, self.lease_ms, self.ttl_s]))
        except RedisError as exc:
            self._failed("claim", exc)
            return None
        self.reachable = True
        return Claim(session_id, epoch) if epoch else None

    async def save(self, claim: Claim, snapshot: dict[str, Any]) -> bool:
        """Write the session's snapshot; False when the claim is stale (rejected) or the store fails."""
        try:
            ok = await self._save(keys=[f"{PREFIX}s:{claim.session_id}"],
                                  args=[str(claim.epoch), self._seal(b"snap", claim.session_id, json.dumps(
                                      snapshot, separators=(",", ":")).encode()), self.ttl_s])
        except RedisError as exc:
            self._failed("save", exc)
            return False
        return bool(ok)

    async def renew(self, claim: Claim) -> int | None:
        """Keep the lease (several times per lease while the session is held): 1 renewed, 0 another
        replica took the session, 2 the store had lost it (restarted empty) and it is claimed again with
        the same epoch (write the snapshot and token again), None the store could not be asked."""
        try:
            result = int(await self._renew(
                keys=[f"{PREFIX}lease:{claim.session_id}", f"{PREFIX}s:{claim.session_id}",
                      f"{PREFIX}log:{claim.session_id}"],
                args=[f"{self.replica_id}:{claim.epoch}", self.lease_ms, self.ttl_s, claim.epoch, self.replica_id]))
        except RedisError as exc:
            self._failed("renew", exc)
            return None
        self.reachable = True
        return result

    async def release(self, claim: Claim) -> bool:
        """The session closed for good: forget it (only if still ours)."""
        self._log_len.pop(claim.session_id, None)
        try:
            ok = await self._release(keys=[f"{PREFIX}lease:{claim.session_id}", f"{PREFIX}s:{claim.session_id}",
                                           f"{PREFIX}log:{claim.session_id}"],
                                     args=[f"{self.replica_id}:{claim.epoch}"])
        except RedisError as exc:
            self._failed("release", exc)
            return False
        return bool(ok)

    async def hand_off(self, claim: Claim) -> bool:
        """Give the session up but keep its snapshot (a drain): another replica may claim it at once."""
        self._log_len.pop(claim.session_id, None)
        try:
            ok = await self._hand_off(keys=[f"{PREFIX}lease:{claim.session_id}"],
                                      args=[f"{self.replica_id}:{claim.epoch}"])
        except RedisError as exc:
            self._failed("hand_off", exc)
            return False
        return bool(ok)

    async def load(self, session_id: str) -> tuple[int, dict[str, Any]] | None:
        """The session's epoch and last snapshot; None when unknown, expired or the store fails."""
        try:
            epoch, snap = await self._load(keys=[f"{PREFIX}s:{session_id}"], args=[MAX_SNAPSHOT_BYTES + self._overhead])
        except RedisError as exc:
            self._failed("load", exc)
            return None
        if epoch is None or snap is None:
            return None
        if snap == -1:
            self._refuse(f"the snapshot of {session_id} is over {MAX_SNAPSHOT_BYTES} bytes")
            return None
        snap = self._open(b"snap", session_id, snap if isinstance(snap, bytes) else str(snap).encode())
        if snap is None:
            return None
        try:
            snapshot: dict[str, Any] = json.loads(snap)
            return int(epoch), snapshot
        except ValueError as exc:  # not JSON, or an epoch that is not a number: nothing to restore
            self.errors += 1  # the store answered (still reachable); what it holds is unusable
            log.warning("session store: session %s holds an unreadable snapshot: %s", session_id, exc)
            return None

    async def append_log(self, claim: Claim, records: list[bytes], restart: bool = False) -> int | None:
        """Append to the session's micro-turn log (`restart`: it begins again, from these); returns its
        length, or None when the claim is stale, the log is not as long as this replica left it (written
        by someone else: no more appends) or the store fails."""
        sid = claim.session_id
        key = f"{PREFIX}log:{sid}"
        try:
            # Each record is sealed with the index it will have: the log's length as we last left it
            # (asked of the store once, when this replica first appends to the session).
            base = 0 if restart else self._log_len.get(sid)
            if base is None:
                base = int(await self._r.llen(key))
            n = int(await self._append_log(keys=[f"{PREFIX}s:{sid}", key],
                                           args=[str(claim.epoch), self.ttl_s, "1" if restart else "0", base,
                                                 *(self._seal(b"log", _at(sid, base + i), r)
                                                   for i, r in enumerate(records))]))
        except RedisError as exc:
            self._failed("append_log", exc)
            return None
        if n == -2:
            self._refuse(f"the micro-turn log of {sid} is not as long as this replica left it ({base})")
        if n < 0:
            self._log_len.pop(sid, None)
            return None
        self._log_len[sid] = n
        return n

    async def load_log(self, session_id: str) -> list[bytes] | None:
        """The session's micro-turn log, oldest first; empty when there is none or the store fails; None
        when it is refused (over MAX_LOG_BYTES, or a record not MACed with the cluster secret)."""
        records: list[bytes] = []
        left = MAX_LOG_BYTES
        try:
            while True:
                page = await self._log_page(keys=[f"{PREFIX}log:{session_id}"],
                                            args=[len(records), len(records) + LOG_PAGE - 1, left])
                if page == -1:
                    self._refuse(f"the micro-turn log of {session_id} is over {MAX_LOG_BYTES} bytes")
                    return None
                for stored in page:
                    record = self._open(b"log", _at(session_id, len(records)),
                                        stored if isinstance(stored, bytes) else stored.encode())
                    if record is None:
                        return None
                    records.append(record)
                    left -= len(stored)
                if len(page) < LOG_PAGE:
                    return records
        except RedisError as exc:
            self._failed("load_log", exc)
            return []

    async def bind_token(self, token: str, session_id: str, previous: str | None = None,
                         epoch: int | None = None) -> bool:
        """`token` now names `session_id` (a rotation: `previous` stops naming it). With `epoch` (the
        claim's), only while it is the session's current one: a stale owner cannot re-bind a token."""
        key = _token_key(token)
        sealed = self._seal(b"token", key, session_id.encode())
        try:
            if epoch is not None:
                return bool(await self._bind_token(
                    keys=[f"{PREFIX}s:{session_id}", key, _token_key(previous) if previous else key],
                    args=[str(epoch), sealed, self.ttl_s, "1" if previous else "0"]))
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.set(key, sealed, ex=self.ttl_s)
                if previous is not None:
                    pipe.delete(_token_key(previous))
                await pipe.execute()
        except RedisError as exc:
            self._failed("bind_token", exc)
            return False
        return True

    async def session_for(self, token: str) -> str | None:
        """The session a resume token names; None when unknown, expired or the store fails."""
        key = _token_key(token)
        try:
            stored = await self._r.get(key)
        except RedisError as exc:
            self._failed("session_for", exc)
            return None
        if stored is None:
            return None
        sid = self._open(b"token", key, stored if isinstance(stored, bytes) else str(stored).encode())
        if sid is None or len(sid) > 256:
            return None
        return sid.decode(errors="replace")
