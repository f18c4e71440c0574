"""`duplex cluster`: a local cluster (deploy/cluster.py) until Ctrl-C or SIGTERM.

Options it does not know are `duplex serve` options, passed to every replica
(`duplex cluster --replicas 3 --port 9000 --model echo --max-sessions 4`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from deploy.cluster import ClusterSpec, LocalCluster


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex cluster", allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Start a Redis server, N duplex replicas and HAProxy in front of them, on loopback, as real "
        "processes; stop them all on Ctrl-C or SIGTERM. Other options are passed to every `duplex serve`.")
    parser.add_argument("--replicas", type=int, default=2, help="duplex replicas to start")
    parser.add_argument("--port", type=int, default=8000, help="the proxy's port: where clients connect")
    parser.add_argument("--host", default="127.0.0.1", help="interface every part binds (loopback by default)")
    parser.add_argument("--model", default=None, help="each replica's --model (default: the server's default)")
    parser.add_argument("--state", type=Path, default=None, metavar="FILE",
                        help="write the cluster's state here as JSON (proxy's and store's pid and port, each "
                        "replica's id, pid and port), again whenever it changes")
    parser.add_argument("--check-interval", type=float, default=1.0, metavar="S",
                        help="seconds between the proxy's health and agent checks of each replica")
    parser.add_argument("--restart-replicas", action="store_true",
                        help="start a replica again (same id and ports) when it exits, as a rolling restart "
                        "needs; without it a dead replica stays dead, as a fail-over test needs")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="logs and haproxy.cfg (default: a new directory under $TMPDIR or /tmp)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, serve_args = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health poll
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster = LocalCluster(ClusterSpec(replicas=args.replicas, port=args.port, host=args.host, model=args.model,
                                           serve_args=serve_args, workdir=args.workdir, state_file=args.state,
                                           check_interval=args.check_interval,
                                           restart_replicas=args.restart_replicas))
        cluster.start()
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"duplex cluster: {exc}", file=sys.stderr)
        return 1
    state = cluster.state()
    print(f"duplex cluster: connect to {state['url']} (HAProxy, pid {state['proxy']['pid']})", flush=True)
    for r in state["replicas"]:
        print(f"  replica {r['id']}: port {r['port']}, {r['capacity']} sessions, pid {r['pid']}", flush=True)
    print(f"  store: {state['store']['url']}; logs and haproxy.cfg in {state['workdir']}; Ctrl-C stops it all",
          flush=True)
    if args.state is not None:
        print(f"  state: {args.state}", flush=True)
    try:
        cluster.run(stop)
    finally:
        cluster.stop()
    print("duplex cluster: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
