"""Shared constants of the internal audio format."""

from typing import Final

# Audio inside the server is mono float32 at 24 kHz (DESIGN.md: Contracts).
SAMPLE_RATE: Final = 24_000
# One micro-turn is 200 ms.
TICK_SECONDS: Final = 0.2
TICK_SAMPLES: Final = 4_800  # SAMPLE_RATE * TICK_SECONDS
