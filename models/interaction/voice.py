"""Which voice a native checkpoint speaks with (`--voice flow|piper|auto`), from what its metadata says.

The flow head is the model's own voice; it is used only where the checkpoint earned it: its phrase
word error (ASR on the flow head's audio of held-out phrases, `train/evaluate.py`, recorded at export
under `PHRASE_WER_KEY`) at most `FLOW_MAX_WER`, the project's floor on what the model says. A
checkpoint without the field (the first shipped `native:tiny`, measured at 1.0 by pocketsphinx) has
not shown it can be understood, so `auto` gives it Piper. Weights no trainer made (random, or set by
hand in tests: no `trainer` in the metadata) have no text worth speaking; `auto` leaves them the flow
head, whose audio is what such checkpoints exist to exercise.
"""

from __future__ import annotations

VOICES = ("auto", "flow", "piper")
PHRASE_WER_KEY = "phrase_word_error"  # checkpoint metadata: word error of the flow head's phrases, "0.12"
FLOW_MAX_WER = 0.15


def choose_voice(requested: str, meta: dict[str, str]) -> tuple[str, str]:
    """("flow" | "piper", why) for `--voice requested` and a checkpoint's metadata."""
    if requested not in VOICES:
        raise ValueError(f"--voice {requested!r} (DUPLEX_NATIVE_VOICE): use one of {', '.join(VOICES)}")
    if requested != "auto":
        return requested, f"--voice {requested}"
    raw = meta.get(PHRASE_WER_KEY)
    if raw is None and "trainer" not in meta:
        return "flow", "auto: untrained weights (no trainer in the checkpoint's metadata) have no text to speak"
    if raw is None:
        return "piper", (f"auto: the checkpoint records no measured phrase word error ({PHRASE_WER_KEY}), "
                         "so its flow head has not earned the voice")
    try:
        wer = float(raw)
    except ValueError:
        return "piper", f"auto: the checkpoint's {PHRASE_WER_KEY} {raw!r} is not a number"
    if wer <= FLOW_MAX_WER:
        return "flow", f"auto: the flow head's measured phrase word error {wer:.3f} <= {FLOW_MAX_WER}"
    return "piper", f"auto: the flow head's measured phrase word error {wer:.3f} > {FLOW_MAX_WER}"
