"""What the native model reads in a micro-turn: each session's audio, typed and background text, video and
heard words, as one batch of features; the text waits in per-session queues for its input slots."""

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from models.base import BackgroundChunk, TickInput
from models.interaction import dmel
from models.interaction.config import NO_BYTE, InteractionConfig
from models.interaction.dmel import DMelFrontend
from models.interaction.floor import Floor
from models.interaction.model import TickFeatures
from models.interaction.session import NativeSession
from models.interaction.video import PATCH, frame_patches

if TYPE_CHECKING:
    from models.interaction.listener import Listener

log = logging.getLogger(__name__)
QUEUE_LIMIT = 16_384  # bytes of typed/background text waiting for slots; beyond it new text is dropped


def take_bytes(queue: bytearray, n: int) -> list[int]:
    got = list(queue[:n])
    del queue[:n]
    return got + [NO_BYTE] * (n - len(got))


def enqueue(queue: bytearray, data: bytes, what: str, sid: str) -> None:
    room = QUEUE_LIMIT - len(queue)
    if len(data) > room:
        log.warning("session %s: %s queue full, dropping %d bytes", sid, what, len(data) - max(room, 0))
    queue += data[: max(room, 0)]


def background_bytes(chunk: BackgroundChunk) -> bytes:
    if chunk.error:
        return f"[background error: {chunk.error}]\n".encode()
    return chunk.text.encode() + (b"\n" if chunk.done else b"")


def features(batch: Sequence[tuple[NativeSession, TickInput]], cfg: InteractionConfig, dev: torch.device,
             frontend: DMelFrontend, deterministic: bool, listener: "Listener | None", floor: Floor) -> TickFeatures:
    """The batch's features for one micro-turn; each session's typed and background text is queued, and a
    typed message's words go to its floor (`Floor.typed`)."""
    audio = []
    for st, tick in batch:
        a = torch.cat([st.user_tail, torch.from_numpy(tick.audio).to(dev)])  # [CONTEXT + 4800]
        st.user_tail = a[-dmel.CONTEXT :]
        audio.append(a)
        for text in tick.text:
            st.last_typed = text
            enqueue(st.typed, text.encode() + b"\n", "typed", st.session_id)
            floor.typed(st, text.strip(), -(-len(st.typed) // cfg.typed_tokens))
        for chunk in tick.background:
            enqueue(st.background, background_bytes(chunk), "background", st.session_id)
            if st.writer is not None:
                st.writer.hear_background(background_bytes(chunk))  # what an answer may quote
    p = cfg.video_grid**2
    video = [
        frame_patches(t.video, cfg.video_grid, dev)
        if t.video is not None
        else torch.zeros(p, PATCH, PATCH, 3, device=dev)
        for _, t in batch
    ]

    def ids(rows: list[list[int]]) -> Tensor:
        return torch.tensor(rows, dtype=torch.long, device=dev)

    heard = None
    if listener is not None:
        # The words of last micro-turn's audio, then this one's audio to the recogniser, which decodes
        # it in its own process while the model steps (listener.py).
        hears = [st.hear for st, _ in batch if st.hear is not None]
        heard = ids(listener.step(hears, [tick.audio for _, tick in batch]))

    return TickFeatures(
        user_dmel=frontend(torch.stack(audio), deterministic),
        self_dmel=torch.stack([st.self_dmel for st, _ in batch]),
        video=torch.stack(video),
        video_present=torch.tensor([t.video is not None for _, t in batch], device=dev),
        typed=ids([take_bytes(st.typed, cfg.typed_tokens) for st, _ in batch]),
        background=ids([take_bytes(st.background, cfg.background_tokens) for st, _ in batch]),
        own_text=ids([st.own_text for st, _ in batch]),
        heard=heard,
    )
