"""The shipped native:tiny checkpoint loaded once per test module, its floor's checks switched per run.

`load_native` builds the model, the Piper talker, the recogniser's worker process, Whisper's and the
text model's threads (~3-7 s a load on the 2-core box); the `--native-turn-check`, `--native-overlap-check`
and `--native-query` options only decide which of the floor's three parts it gets (`Floor(query, checker,
overlaps)`, models/interaction/floor.py; `None` where a mode is off or heard). A model loaded with all three
and run with some of them set to `None` is the model loaded with those modes off, without a load per mode.
"""

import contextlib
from collections.abc import Iterator

import torch

from models.interaction import NativeModel, load_native
from models.interaction.options import NativeOptions

PARTS = ("query", "checker", "overlaps")


@contextlib.contextmanager
def shipped_model() -> Iterator[NativeModel]:
    """native:tiny as shipped with Piper's voice and every check on (query whisper, turn check words, overlap
    check words), one torch thread (as `duplex serve` with DUPLEX_TORCH_THREADS=1), 64 MiB of KV."""
    before = torch.get_num_threads()
    opts = NativeOptions(threads=1, kv_budget_mb=64, voice="piper", query="whisper", turn_check="words",
                         overlap_check="words")
    model = load_native("tiny", None, device="cpu", options=opts)
    try:
        yield model
    finally:
        model.shutdown()
        torch.set_num_threads(before)


@contextlib.contextmanager
def without(model: NativeModel, *parts: str) -> Iterator[NativeModel]:
    """The model with the floor's `parts` (of `PARTS`) off: query -> `--native-query heard`, checker ->
    `--native-turn-check off`, overlaps -> `--native-overlap-check off`; put back after."""
    assert set(parts) <= set(PARTS), parts
    kept = {p: getattr(model.floor, p) for p in parts}
    assert all(v is not None for v in kept.values()), f"already off: {kept}"
    for p in parts:
        setattr(model.floor, p, None)
    try:
        yield model
    finally:
        for p, v in kept.items():
            setattr(model.floor, p, v)
