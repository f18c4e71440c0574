"""Prometheus metrics for the engine and transports, on a registry of their own per server.

Two protocols share the runtime: OpenAI Realtime (`/v1/realtime`, `/v1/realtime/calls`) and GPT-Live
(`/v1/live/sessions`). The series that existed before GPT-Live keep their names and labels, and count
both protocols (dashboards built on them go on working); each session/connection series has a
per-protocol twin named `duplex_protocol_*` with a `protocol` label (`realtime`, `live`):

- `duplex_protocol_sessions{protocol, transport}`: sessions held, by protocol and transport
  (`websocket`, `webrtc`, `detached` while awaiting a resume), counted when scraped;
- `duplex_protocol_client_errors_total{protocol, code}`, `duplex_protocol_dropped_events_total{protocol,
  reason}`, `duplex_protocol_sessions_refused_total{protocol}`: the twins of the unlabelled counters.
  GPT-Live counts its own (`client_error`, `dropped_event`, `session_refused` with protocol "live");
  the realtime series are the total less those, worked out when scraped, so code that predates the
  protocols (which increments the total alone) is counted as realtime without knowing about them.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Buckets in seconds, dense below one micro-turn where the interesting numbers live.
_TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04,
                 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A background answer is heard in seconds, not milliseconds.
_ANSWER_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)


PROTOCOLS = ("realtime", "live")
TRANSPORTS = ("websocket", "webrtc", "detached")


class _ProtocolTwins(Collector):
    """The `duplex_protocol_*` series (see the module's docstring), computed when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        held = GaugeMetricFamily("duplex_protocol_sessions", "Sessions held, by protocol and transport (detached: "
                                 "awaiting a resume)", labels=["protocol", "transport"])
        for protocol in PROTOCOLS:
            for transport in TRANSPORTS:
                held.add_metric([protocol, transport], m.census.get((protocol, transport), 0))
        yield held
        yield self._split("duplex_protocol_client_errors", "Error events sent to clients, by protocol and code",
                          "code", m.client_errors, m.live_counts["client_errors"])
        yield self._split("duplex_protocol_dropped_events", "Events not kept for a client, by protocol and reason",
                          "reason", m.dropped_events, m.live_counts["dropped_events"])
        yield self._split("duplex_protocol_sessions_refused", "Connections refused because the server was full, by "
                          "protocol", None, m.sessions_refused, m.live_counts["sessions_refused"])

    @staticmethod
    def _split(name: str, doc: str, label: str | None, total: Counter, live: Tally[str]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["protocol", *([label] if label else [])])
        totals = {s.labels.get(label, "") if label else "": s.value
                  for fam in total.collect() for s in fam.samples if s.name.endswith("_total")}
        for key in sorted(set(totals) | set(live)):
            extra = [key] if label else []
            family.add_metric(["live", *extra], float(live.get(key, 0)))
            family.add_metric(["realtime", *extra], max(0.0, totals.get(key, 0.0) - live.get(key, 0)))
        return family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes etc., for the load test
        self.step_seconds = Histogram(
            "duplex_tick_step_seconds", "Wall time of one batched model step", registry=r, buckets=_TIME_BUCKETS
        )
        self.lateness_seconds = Histogram(
            "duplex_tick_lateness_seconds",
            "How late a real-time session's step started against its absolute deadline",
            registry=r,
            buckets=_TIME_BUCKETS,
        )
        self.turnaround_seconds = Histogram(
            "duplex_tick_turnaround_seconds",
            "Real-time: from a micro-turn of input completing to its output reaching the transport",
            registry=r,
            buckets=_TIME_BUCKETS,
        )
        self.batch_size = Histogram(
            "duplex_tick_batch_size", "Sessions stepped together in one batch", registry=r, buckets=_BATCH_BUCKETS
        )
        self.ticks = Counter("duplex_ticks", "Micro-turns stepped, by pace", ["pace"], registry=r)
        self.missed_deadlines = Counter(
            "duplex_missed_deadlines",
            "Real-time micro-turns whose output was not ready before the session's next deadline",
            registry=r,
        )
        self.underruns = Counter(
            "duplex_input_underruns", "Real-time micro-turns stepped with less than 200 ms of input", registry=r
        )
        self.dropped_samples = Counter(
            "duplex_input_dropped_samples", "Input samples dropped because a client ran ahead of real time",
            registry=r,
        )
        self.sessions_live = Gauge("duplex_sessions_live",
                                   "Sessions held (attached or awaiting resume) or being opened", registry=r)
        self.sessions_refused = Counter(
            "duplex_sessions_refused", "Connections refused because the server was full", registry=r
        )
        self.drains = Counter("duplex_drains", "Drains with a grace for live sessions (--drain-grace)", registry=r)
        self.sessions_restored = Counter(
            "duplex_sessions_restored", "Sessions another replica held, restored here from the session store",
            registry=r)
        self.sessions_taken_over = Counter(
            "duplex_sessions_taken_over",
            "Resumes that took a session from a connection not yet seen to end (it was hung up on)", registry=r)
        self.restore_seconds = Histogram(
            "duplex_restore_seconds", "Time to restore a session from the store (look-up, claim, open)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r)
        self.store_errors = Gauge("duplex_store_errors",
                                  "Session store operations that failed (store down or erroring), since start",
                                  registry=r)
        self.step_failures = Counter(
            "duplex_step_failures", "Sessions whose model step raised (they got silence and model_error)", registry=r
        )
        self.hung_steps = Counter(
            "duplex_hung_steps", "Model steps that ran past the watchdog limit (--step-watchdog-s)", registry=r
        )
        self.delivery_errors = Counter(
            "duplex_delivery_errors", "Micro-turn outputs that could not be handed to their transport", registry=r
        )
        self.dropped_events = Counter(
            "duplex_dropped_events", "Events not kept for a client, by reason (outbox_full, backlog_full, "
            "inbox_full)", ["reason"], registry=r
        )
        self.asyncio_tasks = Gauge(
            "duplex_asyncio_tasks", "Tasks alive on the server's event loop (set when /metrics is read)", registry=r
        )
        self.loop_lag_seconds = Histogram(
            "duplex_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 100 ms, and how long each periodic full collection held "
            "it: a blocked loop delays every client's bytes",
            registry=r,
            buckets=_TIME_BUCKETS,
        )
        self.client_errors = Counter(
            "duplex_client_errors", "Error events sent to clients, by code", ["code"], registry=r
        )
        # The embedded reasoner serves every session on one thread: with several sessions asking at
        # once, answers wait for each other, which the tick metrics cannot show.
        self.background_first_text_seconds = Histogram(
            "duplex_background_first_text_seconds",
            "Wall time from a background request being asked to its first text, queueing behind earlier "
            "requests included",
            registry=r,
            buckets=_ANSWER_BUCKETS,
        )
        self.background_restarts = Counter(
            "duplex_background_restarts",
            "Restarts of the background model's server process (llama-server) after a crash or a hang",
            registry=r,
        )
        self.background_requests = Counter(
            "duplex_background_requests",
            "Background requests ended, by status: completed, cancelled (superseded or the session ended) "
            "or the error code",
            ["status"],
            registry=r,
        )

        # The per-protocol twins: GPT-Live's own counts, and the held sessions as last counted.
        self.live_counts: dict[str, Tally[str]] = {"client_errors": Tally(), "dropped_events": Tally(),
                                                   "sessions_refused": Tally()}
        self.census: Mapping[tuple[str, str], int] = {}
        r.register(_ProtocolTwins(self))

    def client_error(self, code: str, protocol: str = "realtime") -> None:
        """An error event sent to a client (`duplex_client_errors` and its protocol's twin)."""
        self.client_errors.labels(code).inc()
        if protocol == "live":
            self.live_counts["client_errors"][code] += 1

    def dropped_event(self, reason: str, protocol: str = "realtime", count: int = 1) -> None:
        self.dropped_events.labels(reason).inc(count)
        if protocol == "live":
            self.live_counts["dropped_events"][reason] += count

    def session_refused(self, protocol: str) -> None:
        """A GPT-Live connection refused for a full server (the runtime counted the total already)."""
        if protocol == "live":
            self.live_counts["sessions_refused"][""] += 1

    def count_sessions(self, sessions: Iterable[tuple[str, str]]) -> None:
        """The held sessions' (protocol, transport), counted before a scrape (server/live/census.py)."""
        self.census = Tally(sessions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
