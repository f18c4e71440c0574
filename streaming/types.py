"""Shared aliases and constants of the internal audio format (see docs/architecture.md: the model contract)."""

from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

# Audio inside the server is mono float32 at 24 kHz; an array at another rate says so in its name
# (`pcm16k`, `rate=`...). This is the one alias every package imports.
Audio: TypeAlias = npt.NDArray[np.float32]

SAMPLE_RATE: Final = 24_000
# One micro-turn (a "tick") is 200 ms.
TICK_SECONDS: Final = 0.2
TICK_SAMPLES: Final = 4_800  # SAMPLE_RATE * TICK_SECONDS
