"""Reliability instruments: what a real server survives and what it leaves behind.

- `fuzz`: generated client messages, connections and HTTP requests, each with the answer the protocol demands.
- `soak`: real-time sessions for minutes, clients coming, dropping and going; memory, descriptors, threads.
- `chaos`: faults injected while sessions stream (a backend killed, clients that never read, ...).

Each runs as `python -m bench.reliability.NAME`; the private modules are their shared parts.
"""
