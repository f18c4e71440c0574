"""`duplex serve`: its options, and the `ServerConfig` they make (the process itself: server/process.py).

The `duplex` command's dispatcher (duplex/cli.py) adds this command beside the others; `python -m
server.cli serve ...` runs it alone (tests and benches start servers that way).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from models.interaction.options import (
    GRAPH_MODES,
    MATMUL_MODES,
    OVERLAP_CHECK_MODES,
    QUERY_MODES,
    TURN_CHECK_MODES,
    VOICE_MODES,
    NativeOptions,
)
from models.registry import DEFAULT_MODEL, available
from server.auth import check_secret, read_secret
from server.config import ServerConfig
from server.limits import COLLECT_EVERY, DEFAULT_OUTBOX_BYTES, TCP_USER_TIMEOUT_S
from server.process import serve


def _auto_int(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number, got {value!r}") from None


def _auto_float(value: str) -> float | None:
    if value == "auto":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """A `duplex` parser with only `serve` (what `python -m server.cli` understands)."""
    parser = argparse.ArgumentParser(
        prog="duplex", description="duplex: a real-time full-duplex multimodal interaction server.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_serve_command(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def add_serve_command(sub: Any) -> None:
    """Add `serve` and its options to a parser's subcommands (`sub`: what add_subparsers returned)."""
    serve = sub.add_parser("serve", help="run the server", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                           description="Run the duplex server: WebSocket /v1/realtime, WebRTC /v1/realtime/calls, "
                           "the web client at /, /metrics and /healthz.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind; a non-loopback one needs --api-key")
    serve.add_argument("--port", type=int, default=8000, help="TCP port")
    serve.add_argument("--model", default=DEFAULT_MODEL,
                       help=f"foreground interaction model: one of {', '.join(available())}, with an option after "
                       "a colon (echo:2 = echo delayed 2 micro-turns, native:tiny, native:base, "
                       "moshi:slots=4,greedy=true: models/moshi/options.py)")
    serve.add_argument("--checkpoint", default=None,
                       help="weights for the model (native: a safetensors file; moshi: a released folder or a Hugging "
                       "Face repo id already in the local cache, read offline)")
    serve.add_argument("--device", default=None, help="torch device for the model (cpu, cuda, cuda:1)")
    _add_native_options(serve)
    # No default here: the help shows defaults, and it must never print the key's value.
    serve.add_argument("--api-key", default=None,
                       help="require this key on every API endpoint (if not given: $DUPLEX_API_KEY)")
    serve.add_argument("--api-key-file", default=None, metavar="PATH",
                       help="read the API key from the first line of this file (kept out of argv, which `ps` shows)")
    serve.add_argument("--api-docs", action="store_true",
                       help="serve the OpenAPI description and its pages (/docs, /redoc, /openapi.json); off: "
                       "/docs loads Swagger UI from a CDN into the web client's origin")
    serve.add_argument("--allow-no-auth", action="store_true",
                       help="allow binding a non-loopback interface without an API key")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="browser origin allowed besides the server's own ('*' = any): on the WebSockets "
                       "(their Origin check), the WebRTC offer and hangup, and as CORS on every HTTP endpoint "
                       "(preflights answered, Access-Control-Allow-Origin echoed); repeatable")
    serve.add_argument("--ephemeral-key-ttl", type=float, default=60.0, metavar="SECONDS",
                       help="how long an ephemeral key minted at POST /v1/realtime/client_secrets may open its one "
                       "session (WebSocket or WebRTC), 1..7200; a request's shorter expires_after is kept")
    serve.add_argument("--max-sessions", type=int, default=None,
                       help="sessions admitted at once; default: measured at start-up from the step time")
    serve.add_argument("--phase-groups", type=_auto_int, default="auto", metavar="auto|N",
                       help="phase slots per 200 ms micro-turn: each real-time session ticks in the slot just after "
                       "its input arrives (1 = one shared tick). auto: as many as the model's per-batch cost "
                       "allows, measured at start-up")
    serve.add_argument("--guard-ms", type=float, default=1.0, help="margin after a chunk arrives before its tick")
    serve.add_argument("--late-input-ms", type=float, default=20.0,
                       help="how long a real-time tick waits for a late chunk before stepping silence (jitter buffer)")
    serve.add_argument("--max-backlog-ticks", type=int, default=10,
                       help="micro-turns of input buffered per session before the oldest is dropped")
    serve.add_argument("--max-frame-bytes", type=int, default=256 * 1024, help="largest client message accepted")
    serve.add_argument("--resume-grace", type=float, default=30.0,
                       help="seconds a disconnected session can be resumed with its token")
    serve.add_argument("--idle-timeout", type=float, default=600.0,
                       help="close sessions whose client sent nothing for this many seconds (0 = never)")
    serve.add_argument("--background", default="auto",
                       help="background reasoner: auto (embedded llama.cpp when the model delegates), none, "
                       "llama-server (llama.cpp's server as a supervised child: per-session prompt cache, sessions "
                       "answered together), llamacpp, openai, sglang")
    serve.add_argument("--background-url", default=None,
                       help="openai backend: base URL of an OpenAI-compatible server (e.g. http://127.0.0.1:30000/v1)")
    serve.add_argument("--background-model", default=None,
                       help="openai/sglang backend: model name; llamacpp/llama-server backend: path of a GGUF file")
    serve.add_argument("--background-policy", default="supersede", choices=["supersede", "queue"],
                       help="what a new background request does to one still running")
    serve.add_argument("--background-timeout", type=float, default=None,
                       help="seconds a background request may take before it ends with an error (default: worker's)")
    serve.add_argument("--background-tool-timeout", type=float, default=None,
                       help="seconds to wait for a client-executed tool's output")
    serve.add_argument("--background-max-tokens", type=int, default=None,
                       help="cap on a background answer's length in tokens (default: the backend's; 160 for the "
                       "embedded one)")
    serve.add_argument("--background-max-sentences", type=int, default=None,
                       help="embedded (llamacpp, llama-server) reasoner: stop an answer after N sentences "
                            "(0 = no limit; default 3), which frees its generation for other sessions sooner")
    serve.add_argument("--background-threads", type=int, default=1,
                       help="llama.cpp threads; 1 keeps a core free for the foreground model")
    serve.add_argument("--background-slots", type=int, default=None,
                       help="llama-server backend: conversations kept evaluated and answered at once (default 8)")
    serve.add_argument("--ice-server", action="append", default=[], metavar="URL",
                       help="WebRTC STUN/TURN server URL (stun:host:port, turn:user:pass@host:port); repeatable")
    serve.add_argument("--rtc-connect-timeout", type=float, default=15.0,
                       help="seconds a WebRTC peer has to show its first sign of life; then the call and its new "
                       "session are closed")
    serve.add_argument("--ice-candidates", choices=("auto", "public", "any"), default="auto",
                       help="which ICE candidates of a WebRTC offer the server tries: public = globally routable "
                       "IP addresses only (no loopback, link-local, private or mDNS/DNS names: a client could make "
                       "the server probe its own network); any = all (a server for a LAN); auto = any on a "
                       "loopback --host, else public. Offers naming over 32 candidates are refused")
    serve.add_argument("--max-sessions-per-client", type=_auto_int, default="auto", metavar="auto|N",
                       help="sessions one client address may hold at once, attached, awaiting resume or a WebRTC "
                       "offer not yet connected (0 = no limit); auto: 8 where clients can be told apart (a "
                       "non-loopback --host, or --forwarded-allow-ips), else no limit")
    serve.add_argument("--new-sessions-per-minute", type=_auto_float, default="auto", metavar="auto|N",
                       help="new WebSockets and WebRTC offers one client address may open a minute, in bursts of "
                       "up to 10 (0 = no limit); auto: 30 where clients can be told apart, else no limit")
    serve.add_argument("--forwarded-allow-ips", action="append", default=[], metavar="ADDR",
                       help="a proxy (address or network) whose X-Forwarded-For header names the client; "
                       "repeatable; none: the connection's peer is the client, whatever it sends")
    serve.add_argument("--max-outbox-bytes", type=int, default=DEFAULT_OUTBOX_BYTES,
                       help="bytes of events queued for a client that does not read before it is disconnected "
                       "(its session stays resumable)")
    serve.add_argument("--step-watchdog-s", type=float, default=2.0,
                       help="a model step running longer is reported as hung (log, metric, /healthz 503)")
    serve.add_argument("--stalled-connection-s", type=float, default=TCP_USER_TIMEOUT_S,
                       help="a client connection whose data stays unacknowledged this long (gone, or never "
                       "reading) is dropped by the kernel (TCP_USER_TIMEOUT); its session stays resumable")
    serve.add_argument("--collect-every", type=float, default=COLLECT_EVERY, metavar="SECONDS",
                       help="seconds between full garbage collections, which free finished connections (their "
                       "objects sit in reference cycles) and trim the heap; 1..3600")
    serve.add_argument("--ws-compression", action="store_true",
                       help="offer per-message deflate to WebSocket clients (off: audio deltas are base64 PCM, "
                       "which deflate barely shrinks at a real CPU cost per session, plus ~300 kB of zlib state "
                       "per connection)")
    serve.add_argument("--ws-ping-interval", type=float, default=20.0, metavar="SECONDS",
                       help="seconds between the server's WebSocket keepalive pings (0 = none)")
    serve.add_argument("--ws-ping-timeout", type=float, default=20.0, metavar="SECONDS",
                       help="seconds a client's pong may take before the connection is closed (1011); time the "
                       "server itself stops reading (a media-pace client sending ahead) does not count")
    serve.add_argument("--max-session-minutes", type=float, default=None, metavar="MINUTES",
                       help="close every session this long after it opened, attached or not (fractions allowed; "
                       "default: no limit); close code 4000, reason 'session_time_limit' (docs/long-sessions.md)")
    serve.add_argument("--session-expiry-warning-s", type=float, default=60.0, metavar="SECONDS",
                       help="with --max-session-minutes: how long before the end a session is warned "
                       "(duplex.session.expiring)")
    serve.add_argument("--session-usage-every", type=float, default=15.0, metavar="SECONDS",
                       help="seconds between duplex.session.usage events (session time, the reasoner's context "
                       "fill and what was summarised) to each session (0 = none)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="the server log's verbosity")
    _add_cluster_options(serve)


def _add_cluster_options(serve: argparse.ArgumentParser) -> None:
    """Options for a replica behind a proxy (deploy/ generates the proxy's configuration)."""
    cluster = serve.add_argument_group("cluster", "running as one of several replicas behind HAProxy")
    cluster.add_argument("--replica-id", default=None,
                         help="this replica's id, the prefix of every resume token it issues, so the proxy "
                         "routes a resume back to it (default: a random short id)")
    # No default shown: the help must never print the secret.
    cluster.add_argument("--cluster-secret", default=None,
                         help="secret shared by the replicas: resume tokens carry an HMAC made with it, so a "
                         "forged or re-labelled token is refused (if not given: $DUPLEX_CLUSTER_SECRET; "
                         "none: unsigned tokens)")
    cluster.add_argument("--cluster-secret-file", default=None, metavar="PATH",
                         help="read the cluster secret from the first line of this file (kept out of argv)")
    cluster.add_argument("--agent-port", type=int, default=0,
                         help="TCP port answering HAProxy's agent check with this replica's state "
                         "(room for sessions, drain), from the same figures as /healthz (0 = off)")
    cluster.add_argument("--session-store", default=None, metavar="redis://HOST:PORT/DB",
                         help="Redis (or Valkey) holding what a session needs to continue on another replica "
                         "(its settings, conversation, missed events, background requests, and the native "
                         "model's micro-turn log, replayed there); none: sessions live here only (if not "
                         "given: $DUPLEX_SESSION_STORE; its AUTH password: in the URL as redis://:PASSWORD@HOST, or "
                         "$DUPLEX_SESSION_STORE_PASSWORD, kept out of argv; with --cluster-secret what is stored "
                         "is MACed and refused when the MAC fails)")
    cluster.add_argument("--drain-grace", type=float, default=0.0, metavar="S",
                         help="on SIGTERM, stop taking sessions (the agent says drain), tell each client "
                         "(duplex.session.draining) and let live sessions go on for up to S seconds before "
                         "closing them; 0 = close them at once")
    cluster.add_argument("--restore-reserve", type=int, default=1, metavar="N",
                         help="with --session-store: places above the capacity that only sessions restored from "
                         "another replica (one that died) may take, so they find room when every place is busy; "
                         "a resume that finds none gets 503 with Retry-After and its session stays in the store")


def _add_native_options(serve: argparse.ArgumentParser) -> None:
    """The native model's serving options; each default is overridden by its environment variable."""
    try:
        env = NativeOptions.from_env()
    except ValueError as exc:  # a DUPLEX_* variable that is not what it stands for: say which, no traceback
        raise SystemExit(f"duplex: {exc}") from None
    native = serve.add_argument_group("native model", "how --model native:* is served (other models ignore these); "
                                      "the defaults shown include any DUPLEX_* environment overrides")
    native.add_argument("--native-deterministic", action=argparse.BooleanOptionalAction, default=env.deterministic,
                        help="batch-invariant mode: a session's output is bit-identical alone or batched "
                        "(--no-native-deterministic: fast mode) [$DUPLEX_NATIVE_DETERMINISTIC=0|1]")
    native.add_argument("--torch-threads", type=int, default=env.threads, metavar="N",
                        help="intra-op torch threads on a CPU (0 = every core this process may use) "
                        "[$DUPLEX_TORCH_THREADS]")
    native.add_argument("--native-matmul", choices=MATMUL_MODES, default=env.matmul,
                        help="what the transformer blocks' products run in; bf16 uses serving copies of the "
                        "weights (measure its quality with bench.native.precision first) [$DUPLEX_NATIVE_MATMUL]")
    native.add_argument("--native-graphs", choices=("auto", *GRAPH_MODES), default=env.graphs or "auto",
                        help="bucketed transformer step: cuda = replayed from CUDA graphs, eager = the same buckets "
                        "without graphs, off = plain; auto = cuda on a GPU, off on a CPU [$DUPLEX_NATIVE_GRAPHS]")
    native.add_argument("--graph-max-batch", type=int, default=env.graph_max_batch, metavar="N",
                        help="largest bucket of the bucketed step (bigger steps run as several) "
                        "[$DUPLEX_GRAPH_MAX_BATCH]")
    native.add_argument("--kv-budget-mb", type=float, default=env.kv_budget_mb, metavar="MB",
                        help="KV pool size (sessions = budget / KV bytes per session); default: 512 on a CPU, "
                        "85%% of free GPU memory [$DUPLEX_KV_BUDGET_MB]")
    native.add_argument("--voice", choices=VOICE_MODES, default=env.voice,
                        help="what the native model speaks with: flow = its own flow head; piper = its text "
                        "spoken by Piper joe (the talker); auto = flow only where the checkpoint's metadata "
                        "records a phrase word error <= 0.15, else piper [$DUPLEX_NATIVE_VOICE]")
    native.add_argument("--native-onset", type=float, default=env.onset, metavar="P",
                        help="p(speak) the native model needs to start speaking (it goes on greedily once it "
                        "speaks); default: the threshold calibrated into the checkpoint's metadata "
                        "(bench.native.onset), else 0 = greedy [$DUPLEX_NATIVE_ONSET]")
    native.add_argument("--native-delegate", type=float, default=env.delegate, metavar="P",
                        help="p(delegate) at which the native model, not speaking, hands the request to the "
                        "background reasoner (a rare decision seldom the argmax); default: the threshold "
                        "calibrated into the checkpoint's metadata (train.evaluate), else 0 = the argmax; where "
                        "the turn check heard the user's words, they settle it instead [$DUPLEX_NATIVE_DELEGATE]")
    native.add_argument("--native-query", choices=QUERY_MODES, default=env.query,
                        help="the words a native hand-off gives the background reasoner: whisper = Whisper "
                        "tiny.en on the user's last words, off the inference thread (0.8 s later; at once where "
                        "the turn check heard them); heard = what pocketsphinx streamed; auto = whisper where "
                        "installed [$DUPLEX_NATIVE_QUERY]")
    native.add_argument("--native-turn-check", choices=TURN_CHECK_MODES, default=env.turn_check,
                        help="words = when the user stops, Whisper tiny.en and the text model judge whether "
                        "their words are finished (off the inference thread, a micro-turn later): finished, "
                        "the native model takes the turn when speaking and handing off together outscore "
                        "silence; unfinished, it waits (3 s at most, then it takes the turn); words 5 dB under "
                        "the user's answered turns (a bystander's) are no turn to take; a turn it takes is a "
                        "hand-off to the reasoner where the words ask to look up, find, check or search "
                        "something, else speech; off = the model alone; auto = words where Whisper is installed "
                        "[$DUPLEX_NATIVE_TURN_CHECK]")
    native.add_argument("--native-overlap-check", choices=OVERLAP_CHECK_MODES, default=env.overlap_check,
                        help="words = when the user speaks over the native model, the overlap probe (its first "
                        "~100 ms) and Whisper tiny.en's words of it (a micro-turn later) hold a stop the model "
                        "decides while they say backchannel (\"mm-hm\", \"okay\", \"oh, really?\"), and speech 5 dB "
                        "under the user's own voice holds one while it lasts; a probe sure of an interruption "
                        "(P >= 0.9) at the user's level stops the model at once; off = the model alone; auto = "
                        "words where Whisper is installed [$DUPLEX_NATIVE_OVERLAP_CHECK]")


def native_options(args: argparse.Namespace) -> NativeOptions:
    return NativeOptions(deterministic=args.native_deterministic, threads=args.torch_threads,
                         matmul=args.native_matmul, graphs=None if args.native_graphs == "auto" else args.native_graphs,
                         graph_max_batch=args.graph_max_batch, kv_budget_mb=args.kv_budget_mb, voice=args.voice,
                         onset=args.native_onset, delegate=args.native_delegate, query=args.native_query,
                         turn_check=args.native_turn_check, overlap_check=args.native_overlap_check)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host, port=args.port, model=args.model, checkpoint=args.checkpoint, device=args.device,
        native=native_options(args),
        api_key=_secret(args.api_key, args.api_key_file, "DUPLEX_API_KEY", "--api-key"), api_docs=args.api_docs,
        allow_no_auth=args.allow_no_auth,
        allowed_origins=args.allow_origin, ephemeral_key_ttl=args.ephemeral_key_ttl,
        max_sessions=args.max_sessions, phase_groups=args.phase_groups, guard_ms=args.guard_ms,
        late_input_ms=args.late_input_ms,
        max_backlog_ticks=args.max_backlog_ticks, max_frame_bytes=args.max_frame_bytes,
        resume_grace=args.resume_grace, idle_timeout=args.idle_timeout, background=args.background,
        background_url=args.background_url, background_model=args.background_model,
        background_policy=args.background_policy, background_timeout=args.background_timeout,
        background_tool_timeout=args.background_tool_timeout, background_max_tokens=args.background_max_tokens,
        background_max_sentences=args.background_max_sentences, background_threads=args.background_threads,
        background_slots=args.background_slots,
        ice_servers=args.ice_server, rtc_connect_timeout=args.rtc_connect_timeout, ice_candidates=args.ice_candidates,
        max_sessions_per_client=args.max_sessions_per_client, new_sessions_per_minute=args.new_sessions_per_minute,
        forwarded_allow_ips=args.forwarded_allow_ips, max_outbox_bytes=args.max_outbox_bytes,
        step_watchdog_s=args.step_watchdog_s, stalled_connection_s=args.stalled_connection_s,
        collect_every=args.collect_every,
        ws_compression=args.ws_compression, log_level=args.log_level,
        ws_ping_interval=args.ws_ping_interval, ws_ping_timeout=args.ws_ping_timeout,
        max_session_minutes=args.max_session_minutes, session_expiry_warning_s=args.session_expiry_warning_s,
        session_usage_every=args.session_usage_every,
        **_cluster_config(args))


def _secret(given: str | None, path: str | None, env: str, what: str) -> str | None:
    """A key or secret from its option, its file option, or the environment, in that order; checked."""
    if given and path:
        raise ValueError(f"give {what} or {what}-file, not both")
    value = read_secret(path, f"{what}-file") if path else (given or os.environ.get(env) or None)
    return check_secret(value, what) if value is not None else None


def _cluster_config(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"agent_port": args.agent_port, "drain_grace": args.drain_grace,
                           "restore_reserve": args.restore_reserve,
                           "session_store": args.session_store or os.environ.get("DUPLEX_SESSION_STORE") or None,
                           "cluster_secret": _secret(args.cluster_secret, args.cluster_secret_file,
                                                     "DUPLEX_CLUSTER_SECRET", "--cluster-secret")}
    if args.replica_id is not None:
        out["replica_id"] = args.replica_id
    return out


def run(args: argparse.Namespace) -> int:
    """`duplex serve` with parsed options."""
    try:
        config = config_from_args(args)
    except ValueError as exc:  # options that do not fit together (NativeOptions checks its own)
        print(f"duplex: {exc}", file=sys.stderr)
        return 2
    return serve(config)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
