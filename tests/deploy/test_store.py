"""The session store's protocol against a real Redis server: owner leases, fencing, token lookup,
and a store that is down."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from server import store as store_module
from server.store import MAX_LOG_BYTES, MAX_SNAPSHOT_BYTES, SessionStore, _token_key
from tests.conftest import free_port

LEASE_S = 0.3


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[tuple[SessionStore, SessionStore]]:
    a = SessionStore.from_url(redis_url, "r1", ttl_s=30, lease_s=LEASE_S)
    b = SessionStore.from_url(redis_url, "r2", ttl_s=30, lease_s=LEASE_S)
    yield a, b
    await a.aclose()
    await b.aclose()


async def test_a_stale_owners_write_is_rejected_after_a_takeover(stores: tuple[SessionStore, SessionStore]) -> None:
    """T7: r1 owns the session and stops renewing (killed); r2 takes it over; r1's late write is refused."""
    a, b = stores
    sid = "sess_r1_takeover"
    first = await a.claim(sid)
    assert first is not None and first.epoch == 1
    assert await a.save(first, {"items": ["hello"]})
    assert await b.claim(sid) is None  # r1's lease lives: two replicas never serve one session
    assert await a.renew(first) == 1
    await asyncio.sleep(LEASE_S + 0.1)  # r1 stopped renewing
    second = await b.claim(sid)
    assert second is not None and second.epoch == 2
    assert await b.save(second, {"items": ["hello", "from r2"]})
    assert not await a.save(first, {"items": ["stale"]})  # the fencing counter moved on
    assert await a.renew(first) == 0  # and r1 learns it lost the session
    assert await a.load(sid) == (2, {"items": ["hello", "from r2"]})
    assert not await a.release(first) and await b.release(second)
    assert await a.load(sid) is None


async def test_tokens_name_sessions_and_rotate(stores: tuple[SessionStore, SessionStore]) -> None:
    a, b = stores
    assert await a.bind_token("r1.tok1.mac", "sess_r1_tok")
    assert await b.session_for("r1.tok1.mac") == "sess_r1_tok"
    assert await a.bind_token("r1.tok2.mac", "sess_r1_tok", previous="r1.tok1.mac")
    assert await b.session_for("r1.tok1.mac") is None
    assert await b.session_for("r1.tok2.mac") == "sess_r1_tok"


async def test_a_stale_owner_cannot_rebind_a_token(stores: tuple[SessionStore, SessionStore]) -> None:
    """r1 lost the session to r2; a late rotation from r1 would point a token it handed out (a client
    it no longer serves) at the session r2 now serves: fenced by the epoch like every other write."""
    a, b = stores
    sid = "sess_r1_rebind"
    first = await a.claim(sid)
    assert first is not None and await a.bind_token("r1.old.mac", sid, epoch=first.epoch)
    await asyncio.sleep(LEASE_S + 0.1)
    second = await b.claim(sid)
    assert second is not None
    assert not await a.bind_token("r1.late.mac", sid, previous="r1.old.mac", epoch=first.epoch)
    assert await b.session_for("r1.late.mac") is None and await b.session_for("r1.old.mac") == sid
    assert await b.bind_token("r2.new.mac", sid, previous="r1.old.mac", epoch=second.epoch)
    assert await b.session_for("r2.new.mac") == sid and await b.session_for("r1.old.mac") is None
    await b.release(second)


async def test_a_store_that_is_down_fails_soft() -> None:
    store = SessionStore.from_url(f"redis://127.0.0.1:{free_port()}/0", "r1", ttl_s=30)
    started = time.monotonic()
    assert await store.claim("sess_r1_x") is None
    assert await store.session_for("r1.t.m") is None
    assert store.errors == 2 and not store.reachable and time.monotonic() - started < 3
    await store.aclose()


async def test_an_owner_claims_again_what_a_restarted_store_lost(stores: tuple[SessionStore, SessionStore]) -> None:
    a, _ = stores
    claim = await a.claim("sess_r1_lost")
    assert claim is not None and await a.save(claim, {"n": 1})
    await a._r.flushdb()  # the store restarted without persistence
    assert await a.renew(claim) == 2  # claimed again, same epoch: the owner writes again
    assert await a.save(claim, {"n": 1}) and await a.load("sess_r1_lost") == (claim.epoch, {"n": 1})
    assert await a.renew(claim) == 1


def test_a_snapshot_that_cannot_be_read_is_refused_with_what_is_wrong() -> None:
    """What another replica (or anything else with access) left in the store is checked before a session
    is opened for it: each bad snapshot is a ValueError naming the fault, a good one reads back whole."""
    from server._continuity import SNAPSHOT_VERSION, parse

    good: dict[str, Any] = {"v": SNAPSHOT_VERSION, "settings": {"pace": "realtime", "in_rate": 24000, "out_rate": 16000,
                                                "instructions": "be brief", "tools": [], "tick_stats": False},
            "log": [{"t": 0.2, "role": "user", "text": "hi", "kind": "text"}], "tick": 3}
    restored = parse(good)
    assert restored.settings.out_format.rate == 16000 and restored.entries[0].text == "hi"
    bad_settings = [("pace", "warp"), ("in_rate", 7), ("out_rate", "fast"), ("tools", ["x"])]
    cases: list[Any] = [None, [], {"v": 99}, {"v": SNAPSHOT_VERSION}, {**good, "log": [{"t": "soon"}]},
             {**good, "log": [{"t": 1, "role": "god", "text": "", "kind": "text"}]}]
    cases += [{**good, "settings": {**good["settings"], k: v}} for k, v in bad_settings]
    # What a move carries besides (server/_continuity.py): items, the detached client's backlog, requests.
    cases += [{**good, "items": [{"type": "message"}]}, {**good, "backlog": [{"event": {"no": "type"}}]},
              {**good, "backlog": [{"tick": 1, "audio": "AAAA", "text": "", "user_text": "", "events": []}]},
              {**good, "background": [{"id": "bg_1"}]}]
    for snap in cases:
        with pytest.raises(ValueError, match="session snapshot is not readable"):
            parse(snap)


async def test_the_micro_turn_log_is_fenced_restartable_and_released(stores: tuple[SessionStore, SessionStore]) -> None:
    """A model's micro-turn log (server/claims.py) is appended under the claim's epoch, like a snapshot."""
    a, b = stores
    sid = "sess_r1_log"
    first = await a.claim(sid)
    assert first is not None
    assert await a.append_log(first, [b"t0", b"t1"]) == 2 and await a.append_log(first, [b"t2"]) == 3
    assert await b.load_log(sid) == [b"t0", b"t1", b"t2"]
    await asyncio.sleep(LEASE_S + 0.1)
    second = await b.claim(sid)
    assert second is not None
    assert await a.append_log(first, [b"stale"]) is None  # the old owner's write is refused
    assert await b.append_log(second, [b"again"], restart=True) == 1  # a failed rebuild starts it over
    assert await b.load_log(sid) == [b"again"]
    assert await b.release(second) and await a.load_log(sid) == []


async def test_what_the_store_holds_is_used_only_when_a_replica_wrote_it(redis_url: str) -> None:
    """Whoever can write to Redis (no AUTH, or a neighbour on its network) plants a snapshot, a log
    record and a token binding, or moves one session's snapshot under another's id: with the cluster
    secret each is refused (it was restored, replayed and resumed before)."""
    secret = "cluster-secret"
    a = SessionStore.from_url(redis_url, "r1", ttl_s=30, lease_s=LEASE_S, secret=secret)
    b = SessionStore.from_url(redis_url, "r2", ttl_s=30, lease_s=LEASE_S, secret=secret)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        sid, other = "sess_r1_mac", "sess_r1_mac2"
        claim, claim2 = await a.claim(sid), await a.claim(other)
        assert claim is not None and claim2 is not None
        assert await a.save(claim, {"items": ["mine"]}) and await a.save(claim2, {"items": ["theirs"]})
        assert await a.append_log(claim, [b"t0"]) == 1
        assert await a.bind_token("r1.tok.mac", sid)
        assert await b.load(sid) == (claim.epoch, {"items": ["mine"]})  # what a replica wrote is used
        assert await b.load_log(sid) == [b"t0"] and await b.session_for("r1.tok.mac") == sid
        # Planted: a snapshot, a record appended to the log, a token naming the session.
        await raw.hset(f"duplex:s:{sid}", "snap", json.dumps({"items": ["planted"]}))
        await raw.rpush(f"duplex:log:{sid}", b"planted")
        await raw.set(_token_key("r1.evil.mac"), sid)
        assert await b.load(sid) is None and await b.load_log(sid) is None
        assert await b.session_for("r1.evil.mac") is None
        # A genuine snapshot moved under another session's id.
        await raw.hset(f"duplex:s:{sid}", "snap", await raw.hget(f"duplex:s:{other}", "snap"))
        assert await b.load(sid) is None
        assert b.refused == 4
    finally:
        await raw.aclose()
        await a.aclose()
        await b.aclose()


async def test_a_log_record_is_bound_to_its_place(redis_url: str) -> None:
    """Genuine records of one session's log, dropped or reordered by whoever writes to Redis: the MAC
    covers each record's index, so the replay is refused rather than run on a log with a hole; and the
    owner stops appending to a log someone else lengthened."""
    secret = "cluster-secret"
    a = SessionStore.from_url(redis_url, "r1", ttl_s=30, lease_s=LEASE_S, secret=secret)
    b = SessionStore.from_url(redis_url, "r2", ttl_s=30, lease_s=LEASE_S, secret=secret)
    raw = aioredis.Redis.from_url(redis_url)
    key = "duplex:log:sess_r1_pos"
    try:
        claim = await a.claim("sess_r1_pos")
        assert claim is not None
        assert await a.append_log(claim, [b"t0", b"t1"]) == 2 and await a.append_log(claim, [b"t2"]) == 3
        assert await b.load_log("sess_r1_pos") == [b"t0", b"t1", b"t2"]
        stored = await raw.lrange(key, 0, -1)
        await raw.delete(key)
        await raw.rpush(key, stored[0], stored[2])  # t1 dropped: t2 now sits at index 1
        assert await b.load_log("sess_r1_pos") is None
        await raw.delete(key)
        await raw.rpush(key, stored[1], stored[0], stored[2])  # t0 and t1 swapped
        assert await b.load_log("sess_r1_pos") is None
        await raw.delete(key)
        await raw.rpush(key, *stored, stored[2])  # a genuine record replayed at the end
        assert await b.load_log("sess_r1_pos") is None
        assert await a.append_log(claim, [b"t3"]) is None, "the owner does not append after a stranger's record"
        assert b.refused == 3 and a.refused == 1
        # A restart (a failed rebuild) writes the log afresh, and appends go on from it.
        assert await a.append_log(claim, [b"u0"], restart=True) == 1 and await a.append_log(claim, [b"u1"]) == 2
        assert await b.load_log("sess_r1_pos") == [b"u0", b"u1"]
        assert await a.release(claim)
    finally:
        await raw.aclose()
        await a.aclose()
        await b.aclose()


async def test_reads_are_bounded_before_they_cross_the_network(redis_url: str, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot or a micro-turn log grown past its bound in Redis is refused there, not read whole."""
    store = SessionStore.from_url(redis_url, "r1", ttl_s=30, lease_s=LEASE_S)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        sid = "sess_r1_big"
        await raw.hset(f"duplex:s:{sid}", mapping={"epoch": 1, "snap": b"{" + b" " * MAX_SNAPSHOT_BYTES + b"}"})
        with caplog.at_level(logging.WARNING, logger="server.store"):
            assert await store.load(sid) is None
        assert f"over {MAX_SNAPSHOT_BYTES} bytes" in caplog.text  # refused by its size, inside Redis
        assert MAX_LOG_BYTES >= 64 * 1024 * 1024
        monkeypatch.setattr(store_module, "MAX_LOG_BYTES", 4 * 1024 * 1024)  # the same check, less to write
        await raw.rpush(f"duplex:log:{sid}", *[b"x" * 1000] * 600, b"x" * (4 * 1024 * 1024))
        assert await store.load_log(sid) is None and store.refused == 2
    finally:
        await raw.delete(f"duplex:s:{sid}", f"duplex:log:{sid}")
        await raw.aclose()
        await store.aclose()
