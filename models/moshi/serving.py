"""MoshiModel: Moshi-family weights as an `InteractionModel`, N conversations stepped in one batch.

The model holds moshi's streaming state for N fixed slots (the LM's KV ring buffers and delayed token
cache in `SlotLMGen`, Mimi's encoder and decoder states), entered once at start and kept for the
model's life. A session takes a free slot (`reset_streaming` of that row only) and keeps it until it
is closed, through a detached grace too, so a resumed conversation goes on where it was.

Per micro-turn and batch, all on the inference thread:

1. each session's 4,800 new samples join what it had left over; Mimi eats 1,920-sample frames
   (80 ms at 24 kHz), so a session has 2 or 3 whole frames this micro-turn and carries the rest;
2. for frame f = 0, 1, 2: every slot steps at once, `exec_mask` true only for the sessions that have
   an f-th frame (others, idle slots and detached sessions included, keep their state untouched):
   Mimi encodes -> `SlotLMGen.step` (text token + 8 audio tokens per slot, each session sampling from
   its own generator) -> Mimi decodes the slots whose tokens are generated (the first frames are
   not, moshi's delays) -> 1,920 samples per slot;
3. each session's output joins its queue, which started with 960 samples of silence so that 2 or 3
   frames always cover the 4,800 samples a micro-turn sends; its text tokens are its transcript.

Every frame computes all N slots, whoever is live: the cost of a step depends on N, not on the batch,
so N should be what the machine serves at once (`slots=`, models/moshi/options.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.base import TickInput, TickOutput, check_slot_batch
from models.moshi.lmgen import SlotLMGen
from models.moshi.runtime import import_moshi
from models.moshi.sampling import Sampling
from streaming.types import TICK_SAMPLES, Audio

log = logging.getLogger(__name__)


@dataclass
class MoshiSession:
    session_id: str
    slot: int  # the row of every streaming state this session owns until close
    seed: int  # of `generator`; derived from the session id unless given to `open`
    generator: torch.Generator  # this session's sampling draws, and nobody else's
    pending: Audio  # input samples not yet a whole Mimi frame: float32[< frame]
    queue: Audio  # output samples made and not yet sent: float32[n]
    frames: int = 0  # Mimi frames stepped so far
    tick: int = 0  # micro-turns stepped so far
    closed: bool = False


# Told, per session and frame, the tokens moshi made: [1 + dep_q] (text, then audio) or None while the
# delays leave the frame ungenerated. For tests that compare a session with moshi's own LMGen.
FrameObserver = Callable[[MoshiSession, list[int] | None], None]


def seed_of(session_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "little") >> 1


class MoshiModel:
    delegates = False  # Moshi speaks for itself: it never asks the background reasoner

    def __init__(self, lm: Any, mimi: Any, tokenizer: Any, n_slots: int, sampling: Sampling, name: str = "moshi",
                 slot_bytes: int = 0, conditions: Any = None) -> None:
        """`conditions`: a conditioned LM's (Hibiki's) condition tensors for `n_slots` rows, else None."""
        if n_slots < 1:
            raise ValueError(f"moshi needs at least one slot, got {n_slots}")
        self.name = name
        self.lm, self.mimi, self.tokenizer = lm, mimi, tokenizer
        self.device: torch.device = lm.device
        self.n_slots = n_slots
        self.max_sessions: int | None = n_slots
        self.session_bytes = slot_bytes  # streaming state per slot (bench.engine_scaling reports it)
        self.sampling = sampling
        self.frame = int(mimi.frame_size)  # 1920 samples at 24 kHz
        # Queue lead: after n micro-turns floor(n * 4800 / frame) frames exist, which is short of n * 4800
        # samples by at most one frame less the remainder (960 at 24 kHz); with that much silence first,
        # a session's micro-turn never waits for a frame that the next micro-turn brings.
        self.lead = (self.frame - TICK_SAMPLES % self.frame) % self.frame
        self.gen = SlotLMGen(lm, sampling, n_slots, conditions)
        self.gen.streaming_forever(n_slots)
        self.mimi.streaming_forever(n_slots)
        if self.device.type == "cuda" and not sampling.greedy:
            # Per-session generators cannot be captured in moshi's CUDA graph of the depth step.
            self.gen._streaming_state.graphed_depth.disable = True
        self.skip_text = {lm.text_padding_token_id, lm.end_of_text_padding_id}
        # On a CPU torch.compile costs 14.5 s cold and buys nothing: off even if moshi was imported
        # before models.moshi could set NO_TORCH_COMPILE (runtime.py). A GPU keeps moshi's choice.
        compile_mod = import_moshi().utils.compile
        self._compile: Callable[[], contextlib.AbstractContextManager[Any]] = (
            compile_mod.no_compile if self.device.type == "cpu" else contextlib.nullcontext)
        self._free = list(range(n_slots - 1, -1, -1))  # a stack: the lowest slot is handed out first

    # -- lifecycle ----------------------------------------------------------------------------

    @torch.inference_mode()  # moshi's state tensors are replaced inside steps (inference mode): reset them there too
    def open(self, session_id: str, seed: int | None = None) -> MoshiSession:
        """Take a free slot and reset its row of every streaming state; `seed`: the session's sampling
        seed (default: derived from the session id, so the same id replays the same conversation)."""
        if not self._free:
            raise RuntimeError(f"all {self.n_slots} moshi slots are held; close a session first "
                               "(admission keeps below this: raise slots= or budget_mb= to hold more)")
        slot = self._free.pop()
        mask = torch.zeros(self.n_slots, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.gen.reset_streaming(mask)  # the LM's KV and token cache of this row, and its offsets
        self.mimi.reset_streaming(mask)  # Mimi's convolution and transformer state of this row
        seed = seed_of(session_id) if seed is None else seed
        generator = torch.Generator(device=self.device).manual_seed(seed)
        self.gen.generators[slot] = generator
        return MoshiSession(session_id, slot, seed, generator, np.zeros(0, np.float32),
                            np.zeros(self.lead, np.float32))

    def close(self, state: MoshiSession) -> None:
        if not state.closed:
            state.closed = True
            self.gen.generators[state.slot] = None
            self._free.append(state.slot)

    # -- the micro-turn -----------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, batch: Sequence[tuple[MoshiSession, TickInput]],
             observe: FrameObserver | None = None) -> list[TickOutput]:
        """One micro-turn for every session of `batch`; `observe` (tests) sees each frame's tokens."""
        if not batch:
            return []
        with self._compile():
            return self._step(batch, observe)

    def _step(self, batch: Sequence[tuple[MoshiSession, TickInput]],
              observe: FrameObserver | None) -> list[TickOutput]:
        states = [s for s, _ in batch]
        check_slot_batch(states)
        # 1. whole frames per session, the rest carried
        frames: list[list[Audio]] = []
        for st, tick in batch:
            audio = np.concatenate([st.pending, tick.audio])
            n = len(audio) // self.frame
            frames.append([audio[i * self.frame:(i + 1) * self.frame] for i in range(n)])
            st.pending = audio[n * self.frame:]
        texts: list[list[str]] = [[] for _ in batch]
        made: list[list[Audio]] = [[] for _ in batch]
        # 2. one batched pass over every slot per frame index
        for f in range(max(len(fr) for fr in frames)):
            rows = [i for i, fr in enumerate(frames) if len(fr) > f]
            pcm, tokens = self._frame([states[i].slot for i in rows], np.stack([frames[i][f] for i in rows]))
            for j, i in enumerate(rows):
                st = states[i]
                st.frames += 1
                if observe is not None:
                    observe(st, tokens[j])
                made[i].append(pcm[j])
                tok = tokens[j]
                if tok is not None and tok[0] not in self.skip_text:
                    texts[i].append(self.tokenizer.id_to_piece(tok[0]).replace("▁", " "))
        # 3. each session's queue: what was made joins, one micro-turn leaves
        outs = []
        for i, (st, tick) in enumerate(batch):
            queue = np.concatenate([st.queue, *made[i]])
            if tick.cancel:  # the client asked us to stop: what was made and not yet sent is dropped
                queue[:] = 0.0
            if len(queue) < TICK_SAMPLES:  # cannot happen with the lead; never send a short micro-turn
                queue = np.concatenate([queue, np.zeros(TICK_SAMPLES - len(queue), np.float32)])
            st.queue = queue[TICK_SAMPLES:]
            st.tick += 1
            outs.append(TickOutput(np.ascontiguousarray(queue[:TICK_SAMPLES]), text="".join(texts[i])))
        return outs

    def _frame(self, slots: list[int], audio: np.ndarray) -> tuple[np.ndarray, list[list[int] | None]]:
        """One Mimi frame for the sessions in `slots` (all others masked out).

        audio [b, frame] float32 -> (pcm [b, frame] float32, tokens per session: [1 + dep_q] or None).
        """
        n, dev = self.n_slots, self.device
        idx = torch.tensor(slots, dtype=torch.long, device=dev)
        mask = torch.zeros(n, dtype=torch.bool, device=dev)
        mask[idx] = True
        x = torch.zeros(n, 1, self.frame, device=dev)  # [N, 1, frame]: idle rows are masked, not computed for
        x[idx, 0] = torch.from_numpy(audio).to(dev)
        self.mimi.set_exec_mask(mask)
        codes = self.mimi.encode(x)  # [N, K, 1]
        self.gen.set_exec_mask(mask)
        out = self.gen.step(codes)  # [N, 1 + dep_q, 1]; ungenerated_token_id (-2) where not made yet
        assert out is not None and out.shape[:2] == (n, 1 + self.lm.dep_q), None if out is None else out.shape
        made = mask & (out[:, :, 0] >= 0).all(dim=1)  # [N]
        pcm = torch.zeros(n, 1, self.frame, device=dev)
        if bool(made.any()):
            self.mimi.set_exec_mask(made)
            pcm = torch.where(made[:, None, None], self.mimi.decode(out[:, 1:].clamp(min=0)), pcm)
        rows_pcm = pcm[idx, 0].float().cpu().numpy()  # [b, frame]
        rows_tok = out[idx, :, 0].tolist()
        rows_made = made[idx].tolist()
        return rows_pcm, [t if m else None for t, m in zip(rows_tok, rows_made, strict=True)]
