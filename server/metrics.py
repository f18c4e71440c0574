"""Prometheus metrics for the engine and transports, on a registry of their own per server."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

# Buckets in seconds, dense below one micro-turn where the interesting numbers live.
_TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04,
                 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A background answer is heard in seconds, not milliseconds.
_ANSWER_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
