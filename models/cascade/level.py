"""Speech level in dBFS, for telling the user's own voice from quieter speech around them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FRAME = 320  # 20 ms at 16 kHz


def peak_db(x: npt.NDArray[np.float32]) -> float:
    """The loudest 20 ms frame of a 16 kHz chunk, in dBFS (-120 for silence).

    The peak frame rather than the whole chunk's mean: a micro-turn that holds only a little
    speech (an onset, a word's tail) still gives the level of that speech, not of the silence.
    """
    n = len(x) // FRAME * FRAME
    if n == 0:
        return -120.0
    power = np.mean(np.square(x[:n].astype(np.float64)).reshape(-1, FRAME), axis=1)
    return float(10.0 * np.log10(max(float(power.max()), 1e-12)))
