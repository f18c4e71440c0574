"""Media and time: PCM conversion, resampling, micro-turn chunking, deadline clocks, wav I/O.

This package knows nothing about models, sessions or the network.
"""

from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS

__all__ = ["SAMPLE_RATE", "TICK_SAMPLES", "TICK_SECONDS"]
