"""The HAProxy configuration for a set of duplex replicas (HAProxy 2.6, the Debian package).

What it does, and why:

- New sessions go to the replica with the fewest connections relative to its weight (`leastconn`,
  weight = capacity), never more at once than the replica admits (`maxconn` = its capacity). A
  session is one long connection (a WebSocket), so connections count sessions.
- Each replica's agent (`--agent-port`, server/agent.py) refines that every second from the figures
  `/healthz` reports: `drain` (weight 0) while it has no place for a new session, so a new session
  goes to a replica with room, and when every replica is full the proxy refuses it at once with 503
  rather than queueing it; a resume that names the replica still reaches it (its detached session kept
  its place). `drain` too while the replica shuts down. The HTTP check on `/healthz` is what marks a
  replica down; the agent cannot (HAProxy ignores an agent it cannot reach, by design).
- A resume goes to the replica its token names: the token starts with the replica id
  (server/auth.py), and it travels in the `X-Duplex-Resume-Token` header, a `duplex-resume-token.`
  WebSocket subprotocol or `?resume_token=`. The prefix is not secret; the MAC the replica checks is
  what keeps a client from choosing a replica. When the named replica is down the rule does not apply
  and the resume is balanced like a new session (`option redispatch`).
- A resume (any request carrying a resume token) goes to a second backend of the same replicas,
  `duplex_resume`, whose agent check asks for the room for a *restored* session (`agent-send
  "resume"`: capacity plus `--restore-reserve`, server/agent.py). When its replica is down the resume
  is balanced over the replicas that still have that room, so a dead replica's sessions are taken over
  even when every place for new sessions is busy; when none has room the replica answers 503 with
  Retry-After and the session waits in the store until its resume grace ends.
- A connection refused or reset before the replica answered, and a 503 (a replica that filled up
  between two agent checks), is retried once on another replica (`retry-on all-retryable-errors`,
  `option redispatch 1`: each retry may pick another server).
- The client's address reaches a replica as `X-Forwarded-For`, set by the proxy to the connection's
  source (any the client sent is replaced); `duplex cluster` starts the replicas with
  `--forwarded-allow-ips` naming the proxy, so their per-client caps and rates count real clients.
- `POST /v1/realtime/calls` (WebRTC) is an ordinary request; its media flows peer to peer with the
  replica that answered, not through the proxy. A later request about the call
  (`/v1/realtime/calls/{id}/hangup`) is routed on the session id, which starts with the replica id.
- A connection that carries an ephemeral key (`ek_<replica id>.`, minted by `POST
  /v1/realtime/client_secrets` on whichever replica the proxy chose) goes to the replica that minted it
  and holds it, by the same rule as a resume token: in `Authorization: Bearer` or a
  `...api-key.` subprotocol.
- GPT-Live (`/v1/live/sessions`, server/live/) is routed the same way: its WebSocket and its WebRTC
  `POST` like a new session or, carrying a resume token, like a resume; `/v1/live/sessions/{id}/hangup`
  on the session id.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.auth import REPLICA_ID, RESUME_HEADER, RESUME_SUBPROTOCOL_PREFIX, check_secret, session_id_prefix
from server.client_secrets import PREFIX as KEY_PREFIX

BACKEND = "duplex"
RESUME_BACKEND = "duplex_resume"


@dataclass(frozen=True)
class Replica:
    id: str  # its --replica-id: the prefix of its resume tokens, and its server name here
    host: str
    port: int  # HTTP/WebSocket
    agent_port: int  # --agent-port
    capacity: int  # sessions it admits at once (/healthz "capacity")
    reserve: int = 0  # places above capacity for sessions restored from the store (--restore-reserve)

    def __post_init__(self) -> None:
        if not REPLICA_ID.match(self.id):
            raise ValueError(f"replica id {self.id!r} cannot name a server and prefix tokens")
        if self.capacity < 1:
            raise ValueError(f"replica {self.id}: capacity must be at least 1, got {self.capacity}")


@dataclass(frozen=True)
class ProxyOptions:
    bind: str = "127.0.0.1"
    port: int = 8000
    check_interval_ms: int = 1000  # HTTP check and agent check
    queue_timeout_s: float = 1.0  # a connection waiting for a place on a full replica, then 503
    tunnel_timeout_s: int = 3600  # an idle WebSocket (the server pings every 20 s, so only a dead one)
    api_key: str | None = None  # sent with the health check when the replicas require one
    stats_socket: str | None = None  # admin socket path (show servers state, ...), for tests and operators

    def __post_init__(self) -> None:
        if self.api_key is not None:  # written into the config: nothing in it may be read as syntax
            check_secret(self.api_key, "the API key")


def render(replicas: list[Replica], opts: ProxyOptions | None = None) -> str:
    """haproxy.cfg text for `replicas` behind one frontend."""
    o = opts or ProxyOptions()
    if not replicas:
        raise ValueError("no replicas")
    if len({r.id for r in replicas}) != len(replicas):
        raise ValueError("replica ids must be distinct: a token's prefix names exactly one")
    total = sum(r.capacity for r in replicas)
    lines = [
        "# Generated by deploy/haproxy.py; regenerate rather than edit.",
        "global",
        f"    maxconn {max(256, 4 * total)}",
        *([f"    stats socket {o.stats_socket} mode 600 level admin"] if o.stats_socket else []),
        "",
        "defaults",
        "    mode http",
        "    option http-server-close",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout server 60s",
        f"    timeout tunnel {o.tunnel_timeout_s}s",
        f"    timeout queue {int(o.queue_timeout_s * 1000)}ms",
        "    timeout http-request 10s",
        "    timeout check 2s",  # a replica busy for a moment is not marked down for a slow /healthz
        "    retries 2",
        "    option redispatch 1",
        "    retry-on all-retryable-errors",
        "",
        "frontend realtime",
        f"    bind {o.bind}:{o.port}",
        f"    maxconn {max(256, 4 * total)}",
        # The replicas trust this header from the proxy alone (--forwarded-allow-ips): it is set here to
        # the connection's own address, replacing whatever a client sent, so one address is one client.
        "    http-request set-header X-Forwarded-For %[src]",
        "    http-request del-header Forwarded",
        f"    acl resume req.hdr({RESUME_HEADER}) -m found",
        f"    acl resume req.hdr(sec-websocket-protocol) -m sub {RESUME_SUBPROTOCOL_PREFIX}",
        "    acl resume urlp(resume_token) -m found",
        f"    use_backend {RESUME_BACKEND} if resume",
        f"    default_backend {BACKEND}",
    ]
    lines += _backend(BACKEND, replicas, o, resume=False)
    lines += _backend(RESUME_BACKEND, replicas, o, resume=True)
    return "\n".join(lines) + "\n"


def _backend(name: str, replicas: list[Replica], o: ProxyOptions, resume: bool) -> list[str]:
    """One backend of every replica: new sessions (room for new ones), or resumes (room for restored ones)."""
    inter = f"{o.check_interval_ms}ms"
    lines = [
        "",
        f"backend {name}",
        "    balance leastconn",
        # POST /v1/realtime/calls carries its SDP offer as a body: buffered, so it can be retried.
        "    option http-buffer-request",
        "    option httpchk",
        "    http-check send meth GET uri /healthz"
        + (f" hdr Authorization \"Bearer {o.api_key}\"" if o.api_key else ""),
        "    http-check expect status 200",
    ]
    for r in replicas:
        acl = f"token_{r.id.replace('-', '_')}"
        lines += [
            f"    acl {acl} req.hdr({RESUME_HEADER}) -m beg {r.id}.",
            f"    acl {acl} req.hdr(sec-websocket-protocol) -m beg {RESUME_SUBPROTOCOL_PREFIX}{r.id}.",
            f"    acl {acl} urlp(resume_token) -m beg {r.id}.",
            f"    use-server {r.id} if {acl}",
            # An ephemeral key (server/client_secrets.py) is held by the replica that minted it, whose id
            # follows `ek_`: as a bearer header or an API-key subprotocol (browsers).
            f"    acl key_{acl} req.hdr(authorization) -m beg \"Bearer {KEY_PREFIX}{r.id}.\"",
            f"    acl key_{acl} req.hdr(sec-websocket-protocol) -m sub \"api-key.{KEY_PREFIX}{r.id}.\"",
            f"    use-server {r.id} if key_{acl}",
            # A request that names a session (a WebRTC call's hangup): its id starts with the replica's.
            f"    acl call_{acl} path_beg /v1/realtime/calls/{session_id_prefix(r.id)}",
            f"    acl call_{acl} path_beg /v1/live/sessions/{session_id_prefix(r.id)}",  # GPT-Live's hangup
            f"    use-server {r.id} if call_{acl}",
        ]
    for r in replicas:
        # The agent is told which room to report (server/agent.py); maxconn is that room's size.
        places = r.capacity + r.reserve if resume else r.capacity
        lines.append(
            f"    server {r.id} {r.host}:{r.port} maxconn {places} weight {min(256, r.capacity)}"
            f" check inter {inter} fall 2 rise 1"
            f" agent-check agent-addr {r.host} agent-port {r.agent_port} agent-inter {inter}"
            f" agent-send \"{'resume' if resume else 'new'}\\n\"")
    return lines
