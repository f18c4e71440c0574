"""Session limits an operator sets (`--max-session-minutes`, in fractions of a minute here): a warning
before the end, then a close with a documented code and reason; and the periodic usage report."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.exceptions import ConnectionClosed

from server.session_limits import TIME_LIMIT_CLOSE, TIME_LIMIT_REASON
from tests.wsclient import open_ws, recv_event

EXTENSIONS = {"X-Duplex-Extensions": "1"}


async def _events_until_closed(ws: object, timeout: float, t0: float) -> list[tuple[float, dict[str, object]]]:
    seen = []
    with pytest.raises(ConnectionClosed):
        while True:
            event = await asyncio.wait_for(recv_event(ws, timeout), timeout)  # type: ignore[arg-type]
            seen.append((time.monotonic() - t0, event))
    return seen


async def test_a_session_is_warned_then_closed_at_its_time_limit(duplex_server) -> None:
    # 0.06 minutes = 3.6 s, warned 2 s before; usage every second.
    server = duplex_server("--model", "echo", "--max-session-minutes", "0.06", "--session-expiry-warning-s", "2",
                           "--session-usage-every", "1")
    t0 = time.monotonic()
    ws = await open_ws(server.ws_url, additional_headers=EXTENSIONS)
    seen = await _events_until_closed(ws, 10, t0)
    by_type = {e["type"]: (t, e) for t, e in reversed(seen)}  # the first of each type
    t_warn, warn = by_type["duplex.session.expiring"]
    t_close, closing = by_type["duplex.session.closing"]
    assert 0 < float(str(warn["seconds_left"])) <= 2
    assert warn["close_code"] == TIME_LIMIT_CLOSE and warn["reason"] == TIME_LIMIT_REASON
    assert closing["code"] == TIME_LIMIT_CLOSE and str(closing["reason"]).startswith(TIME_LIMIT_REASON)
    assert ws.close_code == TIME_LIMIT_CLOSE
    assert 1.0 <= t_close - t_warn <= 3.5
    assert 3.6 <= t_close <= 6.0, t_close  # within a second or so of the limit
    usage = [e for _, e in seen if e["type"] == "duplex.session.usage"]
    assert len(usage) >= 2
    assert float(str(usage[-1]["seconds"])) > float(str(usage[0]["seconds"]))
    context = usage[0]["reasoner_context"]
    wanted = {"usage_ratio", "summarised_turns", "notes"}
    assert context is None or (isinstance(context, dict) and wanted <= set(context))
    assert usage[0]["seconds_left"] is not None

