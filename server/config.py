"""Server configuration: one dataclass, filled by the CLI (server/cli.py documents every field)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from models.interaction.options import NativeOptions
from models.registry import DEFAULT_MODEL
from server.auth import REPLICA_ID, new_replica_id
from server.limits import COLLECT_EVERY, DEFAULT_OUTBOX_BYTES, TCP_USER_TIMEOUT_S

DEFAULT_SESSIONS_PER_CLIENT = 8  # a household or an office behind one address, not one client holding every place
DEFAULT_NEW_SESSIONS_PER_MINUTE = 30.0


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = DEFAULT_MODEL
    checkpoint: str | None = None
    device: str | None = None
    # The native model's serving options (--native-deterministic, --torch-threads, --native-matmul,
    # --native-graphs, --graph-max-batch, --kv-budget-mb); the other models ignore them.
    native: NativeOptions = field(default_factory=NativeOptions.from_env)
    api_key: str | None = None  # when set, every API endpoint requires it
    allow_no_auth: bool = False  # explicit opt-in to serve a non-loopback interface without a key
    api_docs: bool = False  # serve /docs, /redoc and /openapi.json (Swagger UI comes from a CDN)
    allowed_origins: list[str] = field(default_factory=list)  # extra browser origins ("*" = any)
    ephemeral_key_ttl: float = 60.0  # seconds a key minted at /v1/realtime/client_secrets may open its session
    max_sessions: int | None = None  # None = measured at start-up (see server/admission.py)
    phase_groups: int | None = None  # phase slots per micro-turn for real-time sessions; None = from calibration
    guard_ms: float = 1.0  # margin between a chunk's arrival and its tick
    late_input_ms: float = 20.0  # how long a tick waits for a late chunk before stepping silence
    max_backlog_ticks: int = 10  # input buffered per session before the oldest is dropped
    max_frame_bytes: int = 256 * 1024  # larger client messages are refused with an error event
    resume_grace: float = 30.0  # seconds a dropped session waits for its client to resume
    idle_timeout: float = 600.0  # seconds without client activity before an attached session is closed (0 = never)
    background: str = "auto"  # background reasoner: auto | none | llama-server | llamacpp | openai | sglang
    background_url: str | None = None  # openai backend: base URL
    background_model: str | None = None  # openai backend: model name; llamacpp: GGUF path
    background_policy: str = "supersede"  # a new request supersedes the running one, or queues behind it
    background_timeout: float | None = None  # whole-request timeout (s); None = the worker's default
    background_tool_timeout: float | None = None  # client tool round-trip timeout (s)
    background_max_tokens: int | None = None  # answer length cap
    background_max_sentences: int | None = None  # llamacpp: stop after N sentences (None = its default, 0 = off)
    background_threads: int = 1  # llama.cpp threads; 1 leaves a core to the foreground
    background_slots: int | None = None  # llama-server: conversations kept evaluated and answered at once
    ice_servers: list[str] = field(default_factory=list)  # WebRTC STUN/TURN URLs
    rtc_connect_timeout: float = 15.0  # s for a WebRTC peer's first sign of life; then the call is closed
    ice_candidates: str = "auto"  # an offer's candidates tried: public | any | auto (any on loopback only)
    # Sessions one client address may hold at once, and new sessions (WebSockets, WebRTC offers) it may
    # open a minute (0 = no limit; None = DEFAULT_* where clients can be told apart from the operator:
    # a server reachable beyond loopback, or behind a named proxy; else no limit).
    max_sessions_per_client: int | None = None
    new_sessions_per_minute: float | None = None
    # Proxies whose X-Forwarded-For names the client (uvicorn's forwarded_allow_ips); none: the peer is.
    forwarded_allow_ips: list[str] = field(default_factory=list)
    max_outbox_bytes: int = DEFAULT_OUTBOX_BYTES  # events queued for a client that does not read, then it is cut
    step_watchdog_s: float = 2.0  # a model step running longer is reported (log, metric, /healthz 503)
    stalled_connection_s: float = TCP_USER_TIMEOUT_S  # a TCP peer not acknowledging our data this long is dropped
    collect_every: float = COLLECT_EVERY  # seconds between the reaper's full collections (server/limits.py: why)
    ws_compression: bool = False  # per-message deflate on WebSockets (costs CPU and memory per session)
    ws_ping_interval: float = 20.0  # seconds between the server's WebSocket pings (0 = none)
    ws_ping_timeout: float = 20.0  # seconds a pong may take, while the server reads (server/ws_keepalive.py)
    max_session_minutes: float | None = None  # a session's longest life, attached or not (None = no limit)
    session_expiry_warning_s: float = 60.0  # duplex.session.expiring this long before that limit closes it
    session_usage_every: float = 15.0  # seconds between duplex.session.usage events (0 = none)
    log_level: str = "info"
    # Running as one of several replicas (deploy/): the id that starts every resume token (so the proxy
    # routes a resume to it), the secret the tokens' MACs use (None: unsigned tokens, one server), and
    # the TCP port where HAProxy's agent check reads this replica's state (0 = no agent).
    replica_id: str = field(default_factory=new_replica_id)
    cluster_secret: str | None = None
    agent_port: int = 0
    session_store: str | None = None  # redis://HOST:PORT/DB: sessions can continue on another replica
    drain_grace: float = 0.0  # seconds live sessions may go on after SIGTERM before they are closed (0 = at once)
    # Places above capacity that only sessions restored from the store take (their replica died): with
    # every place busy, a dead replica's sessions still find room (deploy/README.md: how to size it).
    restore_reserve: int = 1

    def __post_init__(self) -> None:
        tell_apart = not self.is_loopback() or bool(self.forwarded_allow_ips)
        if self.max_sessions_per_client is None:
            self.max_sessions_per_client = DEFAULT_SESSIONS_PER_CLIENT if tell_apart else 0
        if self.new_sessions_per_minute is None:
            self.new_sessions_per_minute = DEFAULT_NEW_SESSIONS_PER_MINUTE if tell_apart else 0.0

    def ice_public_only(self) -> bool:
        """Whether an offer's candidates that are not public addresses are dropped (server/ice_candidates.py)."""
        return self.ice_candidates == "public" or (self.ice_candidates == "auto" and not self.is_loopback())

    def is_loopback(self) -> bool:
        if self.host in ("localhost", "ip6-localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check(self) -> None:
        """Refuse unsafe or impossible settings before anything starts."""
        if not self.api_key and not self.is_loopback() and not self.allow_no_auth:
            raise ValueError(
                f"refusing to serve {self.host} without an API key: anyone who can reach it could use it. "
                "Set --api-key (or DUPLEX_API_KEY), bind 127.0.0.1, or pass --allow-no-auth to accept the risk."
            )
        if self.phase_groups is not None and not 1 <= self.phase_groups <= 200:
            raise ValueError(f"--phase-groups must be between 1 and 200, got {self.phase_groups}")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"--max-sessions must be at least 1, got {self.max_sessions}")
        if self.max_backlog_ticks < 1:
            raise ValueError("--max-backlog-ticks must be at least 1")
        if self.background not in ("auto", "none", "llama-server", "llamacpp", "openai", "sglang"):
            raise ValueError("--background must be auto, none, llama-server, llamacpp, openai or sglang; "
                             f"got {self.background!r}")
        if self.background_slots is not None and self.background_slots < 1:
            raise ValueError(f"--background-slots must be 1 or more, got {self.background_slots}")
        if self.background == "openai" and not self.background_url:
            raise ValueError("--background openai needs --background-url (e.g. http://127.0.0.1:30000/v1)")
        if self.new_sessions_per_minute is not None and self.new_sessions_per_minute < 0:
            raise ValueError("--new-sessions-per-minute must be 0 (no limit) or more, got "
                             f"{self.new_sessions_per_minute}")
        if self.max_sessions_per_client is not None and self.max_sessions_per_client < 0:
            raise ValueError("--max-sessions-per-client must be 0 (no limit) or more, got "
                             f"{self.max_sessions_per_client}")
        if self.max_outbox_bytes < 64 * 1024:
            raise ValueError(f"--max-outbox-bytes must be at least 65536, got {self.max_outbox_bytes}")
        if self.ice_candidates not in ("auto", "public", "any"):
            raise ValueError(f"--ice-candidates must be auto, public or any; got {self.ice_candidates!r}")
        if self.step_watchdog_s <= 0 or self.rtc_connect_timeout <= 0:
            raise ValueError("--step-watchdog-s and --rtc-connect-timeout must be positive")
        if not 1 <= self.collect_every <= 3600:
            raise ValueError(f"--collect-every must be within 1..3600 seconds, got {self.collect_every}")
        if not 1 <= self.stalled_connection_s <= 3600:
            raise ValueError(f"--stalled-connection-s must be within 1..3600 seconds, got {self.stalled_connection_s}")
        if self.background_policy not in ("supersede", "queue"):
            raise ValueError(f"--background-policy must be supersede or queue; got {self.background_policy!r}")
        if not REPLICA_ID.match(self.replica_id):
            raise ValueError("--replica-id must be 1-32 of a-z, 0-9 and '-', starting with a letter or digit; "
                             f"got {self.replica_id!r}")
        if self.session_store is not None and not self.session_store.startswith(("redis://", "rediss://")):
            raise ValueError(f"--session-store must be a redis:// URL, got {self.session_store!r}")
        if not 0 <= self.drain_grace <= 3600:
            raise ValueError(f"--drain-grace must be within 0..3600 seconds, got {self.drain_grace}")
        if not 0 <= self.restore_reserve <= 1000:
            raise ValueError(f"--restore-reserve must be within 0..1000 sessions, got {self.restore_reserve}")
        if not 0 <= self.agent_port <= 65535:
            raise ValueError(f"--agent-port must be a TCP port (0 = off), got {self.agent_port}")
        if not 0 <= self.ws_ping_interval <= 3600 or not 0 < self.ws_ping_timeout <= 3600:
            raise ValueError("--ws-ping-interval must be within 0..3600 s and --ws-ping-timeout within (0, 3600] s")
        if self.max_session_minutes is not None and not 0 < self.max_session_minutes <= 7 * 24 * 60:
            raise ValueError(f"--max-session-minutes must be positive (at most a week), got {self.max_session_minutes}")
        if not 1 <= self.ephemeral_key_ttl <= 7200:
            raise ValueError(f"--ephemeral-key-ttl must be within 1..7200 seconds, got {self.ephemeral_key_ttl}")
        if self.session_usage_every < 0:
            raise ValueError(f"--session-usage-every must be 0 (none) or more, got {self.session_usage_every}")
        if self.session_expiry_warning_s < 0:
            raise ValueError(f"--session-expiry-warning-s must be 0 or more, got {self.session_expiry_warning_s}")
        if self.background_max_sentences is not None and self.background_max_sentences < 0:
            raise ValueError("--background-max-sentences must be 0 (no limit) or more, got "
                             f"{self.background_max_sentences}")
