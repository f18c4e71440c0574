"""The ASR worker process: pocketsphinx utterances decoded outside the server process.

pocketsphinx holds the GIL for as long as it decodes (~20 ms of CPU per 200 ms of speech), so
decoding on the cascade's tick thread stalls every session and the event loop. The server starts
this module as a child process (`python -m models.speech.sphinx_worker`, see `sphinx_remote`) and
talks to it over stdin/stdout with fixed binary frames:

    request  = header(op, utterance, seq, nbytes) + payload   (ops: START FEED FEED_QUIET FINISH ABORT)
    reply    = header(op, utterance, seq, nbytes) + UTF-8     (READY once, then PARTIAL WORDS ERROR)

Requests are handled in order; FEED and FINISH are answered, the others are not. The process exits
when its stdin closes (the server stopped or died), so it never outlives the server.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from typing import IO

from models import heap
from models.speech.sphinx import CONFIGS, DecoderPool, SphinxRecognizer

HEADER = struct.Struct("<BIII")  # op, utterance id, sequence number, payload bytes
START, FEED, FEED_QUIET, FINISH, ABORT = 1, 2, 3, 4, 5
READY, PARTIAL, WORDS, ERROR = 100, 102, 104, 255
MAX_PAYLOAD = 16 * 2**20  # a request larger than this is a protocol error, not audio
TRIM_EVERY_S = 10.0


def read_exact(stream: IO[bytes], n: int) -> bytes | None:
    """n bytes, or None at end of stream."""
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def write_frame(stream: IO[bytes], op: int, utt: int, seq: int, payload: bytes = b"") -> None:
    stream.write(HEADER.pack(op, utt, seq, len(payload)) + payload)
    stream.flush()


def _trim_now(last: float) -> float:
    """After an utterance, at most every `TRIM_EVERY_S`: give the freed search memory back (models.heap)."""
    now = time.monotonic()
    if now - last < TRIM_EVERY_S:
        return last
    heap.trim()
    return now


def serve(inp: IO[bytes], out: IO[bytes], decoders: int, config: str = "streaming") -> int:
    pool = DecoderPool(decoders, **CONFIGS[config])
    live: dict[int, SphinxRecognizer] = {}
    trimmed = time.monotonic()
    write_frame(out, READY, 0, 0)
    while True:
        head = read_exact(inp, HEADER.size)
        if head is None:
            break  # the server closed our stdin: shut down
        op, utt, seq, n = HEADER.unpack(head)
        if n > MAX_PAYLOAD:
            sys.stderr.write(f"sphinx_worker: request of {n} bytes is not a valid frame; exiting\n")
            return 2
        payload = read_exact(inp, n) if n else b""
        if payload is None:
            break
        try:
            if op == START:
                old = live.pop(utt, None)
                if old is not None:
                    old.abort()
                fresh = SphinxRecognizer(pool)
                fresh.start()
                live[utt] = fresh
            elif op in (FEED, FEED_QUIET):
                rec = live.get(utt)
                if rec is None:
                    if op == FEED:
                        write_frame(out, ERROR, utt, seq, b"unknown utterance (not started or already ended)")
                    continue
                rec.feed_pcm(payload, reply=op == FEED)
                if op == FEED:
                    write_frame(out, PARTIAL, utt, seq, rec.partial.encode())
            elif op == FINISH:
                done = live.pop(utt, None)
                words = done.finish().words if done is not None else []
                write_frame(out, WORDS, utt, seq, json.dumps(words).encode())
                trimmed = _trim_now(trimmed)
            elif op == ABORT:
                dropped = live.pop(utt, None)
                if dropped is not None:
                    dropped.abort()
            else:
                write_frame(out, ERROR, utt, seq, f"unknown op {op}".encode())
        except Exception as e:  # one broken utterance must not end the others
            live.pop(utt, None)
            if op in (FEED, FINISH):
                write_frame(out, ERROR, utt, seq, f"{type(e).__name__}: {e}".encode())
            else:  # nobody waits for an answer: say it here; the next FEED learns the utterance is gone
                sys.stderr.write(f"sphinx_worker: utterance {utt} dropped: {type(e).__name__}: {e}\n")
    for rec in live.values():
        rec.abort()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.speech.sphinx_worker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decoders", type=int, default=2, help="decoders built before READY (more are built on demand)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="streaming",
                    help="decoder search settings (models.speech.sphinx): partials is cheaper, less accurate")
    args = ap.parse_args(argv)
    # The frames own stdout: anything a library prints goes to stderr instead of corrupting them.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, out, max(0, args.decoders), args.config)


if __name__ == "__main__":
    sys.exit(main())
