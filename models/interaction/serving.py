"""NativeModel: the native model's serving adapter (an InteractionModel) around the transformer, its KV
pool and its vocoder.

Per micro-turn and batch: featurise (dMel, patches, bytes) -> one batched forward_step -> control,
text and transcript heads -> flow head -> Griffin-Lim -> gate by the control decision -> feed the
model's own audio and text back as next micro-turn's input. All of it runs on the one inference
thread that calls `step`.

With a Piper talker (`--voice piper`, talker.py) the flow head and vocoder are skipped: the text the
model writes (decoded within its phrase set, phrases.py, when the checkpoint has one) is spoken by
Piper, and the audio the talker plays is what the model hears back as its own.
"""

import codecs
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from models.base import BackgroundChunk, Event, TickInput, TickOutput, check_slot_batch
from models.cascade.level import UserLevel
from models.cascade.work import LATE
from models.interaction import dmel, onset, vocoder
from models.interaction.config import ACTIONS, FRAMES_PER_TURN, NO_BYTE
from models.interaction.cuda_graphs import BucketedStep
from models.interaction.flow import turn_noise
from models.interaction.kv import KVPool
from models.interaction.layers import Lin
from models.interaction.model import HeadOutputs, InteractionTransformer, TurnFeatures
from models.interaction.overlap_check import (
    HOLD,
    LEAD_TICKS,
    LONGEST_TICKS,
    PROBE_TICKS,
    STOP,
    Overlap,
    OverlapChecker,
    ruling,
)
from models.interaction.phrases import PhraseSet, PhraseWriter, written_text
from models.interaction.query import DUE_TICKS, QUERY_CHARS, PendingQuery, QueryTranscriber, UserAudio
from models.interaction.replay import TickLog, replay
from models.interaction.turn_check import DUE_TICKS as CHECK_DUE_TICKS
from models.interaction.turn_check import (
    FINISHED,
    HOLD_TICKS,
    PendingCheck,
    TurnChecker,
    Words,
    after_the_wait,
    asks_to_look_up,
    whose,
)
from models.interaction.turn_check import LATE_TICKS as CHECK_LATE_TICKS
from models.interaction.turn_check import WAIT_S as CHECK_WAIT_S

if TYPE_CHECKING:  # the talker imports the cascade's speaker (~0.7 s): loaded only for --voice piper
    from models.interaction.listener import HeardSession, Listener
    from models.interaction.talker import PiperTalker, TalkerSession
from models.interaction.video import PATCH, frame_patches
from models.registry import GRAPH_MODES

log = logging.getLogger(__name__)
QUEUE_LIMIT = 16_384  # bytes of typed/background text waiting for slots; beyond it new text is dropped
# --native-matmul: what the transformer blocks' products run in (bench/precision.py measures the cost in quality)
MATMUL_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
SPEAK, SILENT, BACKCHANNEL, YIELD, DELEGATE = range(len(ACTIONS))
WAITING = Words(onset.PENDING)  # the verdict due is late: no onset until it is in (turn_check.LATE_TICKS)


def _utf8() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


@dataclass
class NativeSession:
    session_id: str
    slot: int  # the KV-pool row this session owns until close
    seed: int  # flow-noise seed derived from session_id: the same id replays the same audio
    user_tail: Tensor  # [CONTEXT] last input samples: left context of the next dMel frames
    self_tail: Tensor  # [CONTEXT] same for the model's own audio
    self_dmel: Tensor  # [20, bins] dMel of what the model said last micro-turn (fed back)
    voc_mag: Tensor  # [3, BINS] Griffin-Lim context magnitudes
    voc_phase: Tensor  # [3, BINS, 2] Griffin-Lim context phases as unit phasors (re, im)
    tick: int = 0  # index of the next micro-turn (= micro-turns stepped so far)
    own_text: list[int] = field(default_factory=list)  # bytes written last micro-turn (fed back)
    typed: bytearray = field(default_factory=bytearray)  # typed text waiting for slots
    background: bytearray = field(default_factory=bytearray)  # background results waiting for slots
    speaking: bool = False  # the model holds the floor (last action was speak)
    user_speaking: bool = False  # the model's VAD logit said the user is speaking
    last_action: int = SILENT
    transcript: str = ""  # the last 500 characters of the user transcript: the delegate query
    last_typed: str = ""  # the last typed text: the delegate query when there is no transcript
    text_dec: codecs.IncrementalDecoder = field(default_factory=_utf8)
    transcript_dec: codecs.IncrementalDecoder = field(default_factory=_utf8)
    closed: bool = False
    writer: PhraseWriter | None = None  # text decoded within the checkpoint's phrase set (None: free)
    talk: "TalkerSession | None" = None  # the Piper talker's queue (None: the flow head speaks)
    log: TickLog | None = None  # its micro-turns, when it may be rebuilt elsewhere (replay.py); None: not kept
    hear: "HeardSession | None" = None  # its recogniser, for a checkpoint with the heard-words channel
    user_audio: UserAudio | None = None  # its recent microphone audio, where hand-offs are transcribed (query.py)
    handing_off: PendingQuery | None = None  # a hand-off decided, its query being transcribed
    checking: PendingCheck | None = None  # the words of the user's turn being judged (turn_check.py)
    verdict: Words | None = None  # what they said, until the user speaks again or the model takes the turn
    verdict_until: int = 0  # the micro-turn a verdict stops counting (turn_check.HOLD_TICKS)
    proposal: Tensor | None = None  # its keenest action probabilities while a late verdict is awaited
    user_level: UserLevel = field(default_factory=UserLevel)  # of the user's turns it answered (after_the_wait)
    overlap: Overlap | None = None  # the user's speech over the model's, and what it says (overlap_check.py)


# Told, for each session of a step, what the model saw and what its heads said: (state, features row,
# head outputs row [1, ...]). Passed to `step` by callers that replay a session whole (teacher forcing
# in tests and training); the server never passes one.
StepObserver = Callable[[NativeSession, TurnFeatures, HeadOutputs], None]


def _take(queue: bytearray, n: int) -> list[int]:
    got = list(queue[:n])
    del queue[:n]
    return got + [NO_BYTE] * (n - len(got))


def _enqueue(queue: bytearray, data: bytes, what: str, sid: str) -> None:
    room = QUEUE_LIMIT - len(queue)
    if len(data) > room:
        log.warning("session %s: %s queue full, dropping %d bytes", sid, what, len(data) - max(room, 0))
    queue += data[: max(room, 0)]


def _background_bytes(chunk: BackgroundChunk) -> bytes:
    if chunk.error:
        return f"[background error: {chunk.error}]\n".encode()
    return chunk.text.encode() + (b"\n" if chunk.done else b"")


class NativeModel:
    def __init__(
        self,
        net: InteractionTransformer,
        name: str,
        n_slots: int,
        device: torch.device,
        deterministic: bool,
        matmul: str = "fp32",
        graphs: str | None = None,
        graph_max_batch: int = 64,
        phrases: PhraseSet | None = None,
        talker: "PiperTalker | None" = None,
        listener: "Listener | None" = None,
        onset_threshold: float = 0.0,
        delegate_threshold: float = 0.0,
        query: QueryTranscriber | None = None,
        checker: TurnChecker | None = None,
        overlaps: OverlapChecker | None = None,
    ) -> None:
        """`matmul`, `graphs`, `graph_max_batch`: see `NativeOptions` (models/registry.py). `phrases`: what
        the checkpoint was trained to say (its text is decoded within it); `talker`: Piper speaks instead
        of the flow head (`--voice`); `listener`: the recognisers of a checkpoint with the heard-words channel
        (listener.py), which it must have exactly when the checkpoint reads heard words; `onset_threshold`:
        the p(speak) a speech onset needs (onset.py; 0 = greedy); `delegate_threshold`: the p(delegate) at
        which it hands off while not speaking (onset.py; 0 = the argmax); `query`: Whisper for a hand-off's
        words (query.py; None: the recogniser's words); `checker`: the words' verdict when the user stops, which
        an onset then follows (turn_check.py; None: the model decides alone); `overlaps`: the cues that hold a
        stop under a backchannel (overlap_check.py; None: the model decides alone)."""
        if bool(net.cfg.heard_tokens) != (listener is not None):
            raise ValueError("a listener goes with a checkpoint that reads heard words (heard_tokens > 0), only then")
        self.phrases, self.talker, self.listener, self.query = phrases, talker, listener, query
        self.checker, self.overlaps = checker, overlaps
        self.onset = onset.check_onset(onset_threshold)
        self.delegate = onset.check_delegate(delegate_threshold)
        self.voice = "flow" if talker is None else "piper"
        self.net = net.eval()
        self.cfg = net.cfg
        self.name = name
        self.device = device
        self.dtype = next(net.parameters()).dtype
        self.pool = KVPool(self.cfg, n_slots, device, self.dtype)
        # --native-graphs: "cuda" (default on a GPU) replays the transformer step from CUDA graphs per
        # batch-size bucket; "eager" runs the same bucketed step without graphs (checks it on a CPU);
        # "off" (default on a CPU) steps exactly the sessions given.
        mode = graphs or ("cuda" if device.type == "cuda" else "off")
        if mode not in GRAPH_MODES or (mode == "cuda" and device.type != "cuda"):
            raise ValueError(f"native graphs {mode!r} (--native-graphs, DUPLEX_NATIVE_GRAPHS): use one of "
                             f"{', '.join(GRAPH_MODES)} ('cuda' needs a GPU)")
        self.graphs: BucketedStep | None = None
        if mode != "off":
            if n_slots < 2:
                raise ValueError("bucketed steps need a KV pool of at least 2 slots (one is scratch)")
            top = min(n_slots - 1, graph_max_batch)
            self.graphs = BucketedStep(net, self.pool, top, capture=mode == "cuda")
        self.max_sessions: int | None = n_slots - self.pool.n_reserved
        self.frontend = dmel.DMelFrontend(self.cfg.dmel_bins, self.cfg.dmel_levels, device)
        self.vocoder = vocoder.GriffinLim(self.cfg.mel_bins, self.cfg.griffin_lim_iters, device)
        self.deterministic = deterministic
        self.set_deterministic(deterministic)
        self.matmul = matmul
        self.set_matmul(matmul)

    def set_matmul(self, name: str) -> None:
        """Run the transformer blocks' products in fp32 or bf16 (from serving copies of their weights;
        the parameters, checkpoints and everything outside the blocks stay as they are)."""
        if name not in MATMUL_DTYPES:
            raise ValueError(f"native matmul {name!r} (--native-matmul, DUPLEX_NATIVE_MATMUL) is not one of "
                             f"{', '.join(MATMUL_DTYPES)}")
        dtype = MATMUL_DTYPES[name]
        for blk in self.net.blocks:
            for m in blk.modules():
                if isinstance(m, Lin):
                    same = dtype is None or dtype == m.weight.dtype
                    m.serve_weight = None if same else m.weight.detach().to(dtype)
        if getattr(self, "graphs", None) is not None:
            self.graphs.reset()  # type: ignore[union-attr]  # captured graphs read the old weights
        self.matmul = name

    def set_deterministic(self, on: bool) -> None:
        """Batch-invariant mode on/off; between steps only (both modes use the same KV layout)."""
        self.net.set_deterministic(on)
        # On a GPU attention runs stacked over whole stores (fixed shapes, one call, graph-capturable;
        # batch-invariant through the kernel it is given in deterministic mode: layers.py). On a CPU
        # it runs per session over written keys only, unless the bucketed step is on.
        self.net.set_batched_attention(self.device.type == "cuda" or self.graphs is not None)
        if self.device.type == "cuda" and on:
            # Split-K reductions in reduced precision are chosen by problem size: not batch-invariant.
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        if self.graphs is not None:
            self.graphs.reset()  # captured kernels belong to the old mode
        self.deterministic = on

    @property
    def steady_age(self) -> int:
        """Micro-turns after which a session's step cost stops growing: every layer's store is full
        (attention reads only written keys). Admission calibrates at this age (`Ageing`, models/base.py)."""
        return max(g.turns for g in self.pool.geoms)

    @property
    def session_bytes(self) -> int:
        return KVPool.session_bytes(self.cfg, self.dtype)

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self, session_id: str) -> NativeSession:
        slot = self.pool.alloc()
        digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
        z = torch.zeros(dmel.CONTEXT, device=self.device)
        mag, phase = self.vocoder.initial_state(self.device)
        return NativeSession(
            session_id=session_id,
            slot=slot,
            seed=int.from_bytes(digest, "little") >> 1,
            user_tail=z,
            self_tail=z.clone(),
            voc_mag=mag,
            voc_phase=phase,
            self_dmel=torch.zeros(FRAMES_PER_TURN, self.cfg.dmel_bins, dtype=torch.long, device=self.device),
            own_text=[NO_BYTE] * self.cfg.text_tokens,
            writer=PhraseWriter(self.phrases) if self.phrases is not None else None,
            talk=self.talker.open() if self.talker is not None else None,
            hear=self.listener.open() if self.listener is not None else None,
            user_audio=UserAudio() if self.query or self.checker or self.overlaps else None,
        )

    def close(self, state: NativeSession) -> None:
        if not state.closed:
            self.pool.release(state.slot)
            if self.talker is not None and state.talk is not None:
                self.talker.close(state.talk)
            if self.listener is not None and state.hear is not None:
                self.listener.close(state.hear)
            if state.handing_off is not None:
                state.handing_off.words.cancel()
            if state.checking is not None:
                state.checking.verdict.cancel()
            if state.overlap is not None:
                state.overlap.cancel()
            state.closed = True

    def pending_work(self, state: NativeSession) -> list[Future[Any]]:
        """The talker's synthesis the session's next micro-turn plays, a hand-off's transcription and the
        turn check due (`OffThreadWork`, models/base.py)."""
        work: list[Future[Any]] = []
        if self.talker is not None and state.talk is not None:
            work += self.talker.pending_work(state.talk)
        if state.handing_off is not None:
            work.append(state.handing_off.words)
        if state.checking is not None:
            work.append(state.checking.verdict)
        if state.overlap is not None and state.overlap.job is not None:
            work.append(state.overlap.job)
        return work

    def shutdown(self) -> None:
        """The talker's synthesis thread, the listener's ASR processes and the hand-off transcriber
        (`Shutdown`, models/base.py)."""
        if self.talker is not None:
            self.talker.shutdown()
        if self.query is not None:
            self.query.shutdown()
        if self.checker is not None:
            self.checker.shutdown()
        if self.overlaps is not None:
            self.overlaps.shutdown()
        if self.listener is not None:
            self.listener.shutdown()

    # -- the micro-turn -----------------------------------------------------------------------

    def _features(self, batch: Sequence[tuple[NativeSession, TickInput]]) -> TurnFeatures:
        cfg, dev = self.cfg, self.device
        audio = []
        for st, tick in batch:
            a = torch.cat([st.user_tail, torch.from_numpy(tick.audio).to(dev)])  # [CONTEXT + 4800]
            st.user_tail = a[-dmel.CONTEXT :]
            audio.append(a)
            for text in tick.text:
                st.last_typed = text
                _enqueue(st.typed, text.encode() + b"\n", "typed", st.session_id)
                if self.checker is not None:
                    self._typed_words(st, text.strip())
            for chunk in tick.background:
                _enqueue(st.background, _background_bytes(chunk), "background", st.session_id)
                if st.writer is not None:
                    st.writer.hear_background(_background_bytes(chunk))  # what an answer may quote
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
        if self.listener is not None:
            # The words of last micro-turn's audio, then this one's audio to the recogniser, which decodes
            # it in its own process while the model steps (listener.py).
            hears = [st.hear for st, _ in batch if st.hear is not None]
            heard = ids(self.listener.step(hears, [tick.audio for _, tick in batch]))

        return TurnFeatures(
            user_dmel=self.frontend(torch.stack(audio), self.deterministic),
            self_dmel=torch.stack([st.self_dmel for st, _ in batch]),
            video=torch.stack(video),
            video_present=torch.tensor([t.video is not None for _, t in batch], device=dev),
            typed=ids([_take(st.typed, cfg.typed_tokens) for st, _ in batch]),
            background=ids([_take(st.background, cfg.background_tokens) for st, _ in batch]),
            own_text=ids([st.own_text for st, _ in batch]),
            heard=heard,
        )

    def _synthesize(self, cond: Tensor, states: list[NativeSession]) -> tuple[Tensor, Tensor, Tensor]:
        """Flow head + vocoder for every row (fixed shape; gated later).

        cond [B, M, D] -> audio [B, 4800] float32 and the vocoder's next context (mag, phase).
        """
        flow = self.net.flow
        noise = turn_noise(
            [s.seed for s in states],
            [s.tick for s in states],
            (self.cfg.audio_out_tokens, flow.width),
            self.device,
        )
        logmel = flow.sample(cond, noise)  # [B, 20, mels]
        return self.vocoder(
            logmel,
            torch.stack([s.voc_mag for s in states]),
            torch.stack([s.voc_phase for s in states]),
            self.deterministic,
        )

    @torch.inference_mode()
    def step(
        self, batch: Sequence[tuple[NativeSession, TickInput]], observe: StepObserver | None = None
    ) -> list[TickOutput]:
        """One micro-turn for every session of `batch`; `observe` (not the server's) sees each row's
        features and head outputs."""
        if not batch:
            return []
        states = [s for s, _ in batch]
        check_slot_batch(states)
        # 1. inputs -> one batched transformer pass over the sessions' persistent KV
        feats = self._features(batch)
        turns = torch.tensor([s.tick for s in states], device=self.device)
        slots = [s.slot for s in states]
        if self.graphs is not None:
            heads = self.graphs(feats, slots, turns)
        else:
            heads = self.net.forward_step(feats, self.pool, slots, turns)
        # 2. decisions (greedy) and audio for every row
        control = heads.control.float()
        probs = control[:, : len(ACTIONS)].softmax(-1)
        voice = (control[:, len(ACTIONS)] > 0).tolist()
        deadline = time.monotonic() + CHECK_WAIT_S  # one wait for all the checks due this step
        verdicts: list[Words | None] | None = None
        if self.checker is not None:
            verdicts = [self._verdict(s, deadline) for s in states]
            probs = self._proposals(states, probs, verdicts)
        actions = onset.decide(probs, [s.speaking for s in states], self.onset, self.delegate, verdicts).tolist()
        for i, (st, tick) in enumerate(batch):
            if st.user_audio is not None:
                st.user_audio.add(st.tick, tick.audio)
                if self.overlaps is not None and voice[i] and not st.speaking:
                    st.user_audio.level.add(tick.audio, skip_silent=True)  # their own voice, to tell a bystander's
            if self.overlaps is not None and not tick.cancel:
                actions[i] = self._overlap(st, voice[i], deadline, actions[i])
        text_ids = heads.text.argmax(-1).tolist()
        transcript_ids = heads.transcript.argmax(-1).tolist()
        if self.talker is None:
            audio, mag, phase = self._synthesize(heads.audio_cond, states)  # [B, 4800]
        # 3. per session: gate, events, feedback
        outs, spoken = [], []
        for i, (st, tick) in enumerate(batch):
            if st.writer is not None:
                text_ids[i] = self._write(st.writer, tick, actions[i], heads.text[i])
            gate, text, user_text, events = self._decide(st, tick, actions[i], voice[i], text_ids[i], transcript_ids[i])
            if st.writer is not None and st.writer.began_another and actions[i] == SPEAK:
                text = " " + text  # utterances stay apart in the transcript (the model's own bytes are fed back)
            if st.talk is not None:
                spoken.append(self._talk(st, tick, text_ids[i]))
            else:
                st.voc_mag, st.voc_phase = mag[i], phase[i]
                spoken.append(audio[i] * gate)
            outs.append(TickOutput(spoken[-1].float().cpu().numpy(), text=text, user_text=user_text, events=events))
            if st.log is not None:
                st.log.add(tick, outs[-1])
            if observe is not None:
                observe(st, feats.row(i), HeadOutputs(*(x[i : i + 1] for x in vars(heads).values())))
            if st.overlap is not None and st.user_speaking and st.speaking and st.user_audio and self.overlaps:
                self.overlaps.ask(st.overlap, st.tick, st.user_audio.since(st.overlap.opened - LEAD_TICKS))
        # 4. the model hears itself: dMel of what it actually said becomes next micro-turn's self audio
        own = torch.stack([torch.cat([st.self_tail, a]) for st, a in zip(states, spoken, strict=True)])
        self_dmel = self.frontend(own, self.deterministic)
        for i, st in enumerate(states):
            st.self_tail = own[i, -dmel.CONTEXT :]
            st.self_dmel = self_dmel[i]
            st.tick += 1
        return outs

    def _typed_words(self, st: NativeSession, text: str) -> None:
        """A typed message is a finished turn whose words are known as it arrives (the model reads it a few
        bytes a micro-turn, and often answers before its end): they settle a hand-off as a spoken turn's do
        (turn_check.py), held until `HOLD_TICKS` after its last byte is read."""
        if text:
            st.verdict = Words(FINISHED, asks_to_look_up(text), text)
            st.verdict_until = st.tick + -(-len(st.typed) // self.cfg.typed_tokens) + HOLD_TICKS

    @staticmethod
    def _verdict(st: NativeSession, deadline: float) -> Words | None:
        """The verdict on the user's turn this micro-turn decides with: one that comes due now (waited for
        until `deadline` at most; a later one holds the onset back, up to `CHECK_LATE_TICKS`), or the one held
        since (turn_check.py)."""
        if st.checking is not None and st.tick >= st.checking.due:
            late = st.tick - st.checking.due
            if late < CHECK_LATE_TICKS and not st.checking.ready(deadline - time.monotonic()):
                if late == 0:
                    LATE.note("turn check")
                return WAITING  # not held: the verdict, once in, is the one this turn is decided with
            verdict = whose(st.checking.take(deadline - time.monotonic()), st.user_level)
            st.verdict, st.verdict_until, st.checking = verdict, st.tick + HOLD_TICKS, None
        if st.verdict is not None and st.tick >= st.verdict_until:
            # The user silent since (a spoken verdict ends when they speak again, either when the turn is
            # taken): the longest wait is over, the floor taken for one micro-turn where `after_the_wait` says.
            held = st.verdict
            st.verdict = after_the_wait(held, st.user_level)
            if st.verdict is not None:
                log.debug("session %s: the turn taken after the longest wait (%s: %r)", st.session_id, held.turn,
                          held.text[-80:])
        return st.verdict

    @staticmethod
    def _proposals(states: list[NativeSession], probs: Tensor, verdicts: list[Words | None]) -> Tensor:
        """A late verdict disposes of what the model proposed while it was awaited: its keenest probabilities
        then (onset.keener) are kept, and the micro-turn the verdict comes in decides with them where they
        are keener than its own. Without that a verdict two micro-turns late found the shipped model's urge
        to answer gone (it rises for two or three micro-turns after the user stops) and the question waited
        3 s, for the longest wait."""
        for i, (st, v) in enumerate(zip(states, verdicts, strict=True)):
            if v is WAITING:
                st.proposal = probs[i] if st.proposal is None else onset.keener(st.proposal, probs[i])
            elif st.proposal is not None:
                probs[i] = onset.keener(st.proposal, probs[i])
                st.proposal = None
        return probs

    def _overlap(self, st: NativeSession, voice: bool, deadline: float, action: int) -> int:
        """Open, follow and close `st`'s overlap with this micro-turn's voice flag, and the action once its cues
        ruled on the model's (overlap_check.py). Only while it speaks: once it stopped, the floor is the user's."""
        assert self.overlaps is not None and st.user_audio is not None
        ov = st.overlap
        if ov is None:
            if not (voice and not st.user_speaking and st.speaking):
                return action
            ov = st.overlap = self.overlaps.open(st.tick, st.user_audio.since(st.tick - PROBE_TICKS + 1),
                                                 st.user_audio.level.db)
        elif not st.speaking:
            ov.cancel()
            st.overlap = None
            return action
        elif voice:  # its level so far (`open` measured it up to its own micro-turn): whose voice it is
            ov.hear(st.user_audio.since(st.tick).astype(np.float32) / 32767.0)
        ov.collect(st.tick, deadline - time.monotonic())
        ov.ended = None if voice else (st.tick if ov.ended is None else ov.ended)
        said = ruling(ov, st.tick)
        log.debug("session %s micro-turn %d: overlap since %d, P(interruption) %s, words %r: %s",
                  st.session_id, st.tick, ov.opened, ov.p_interrupt, ov.words, said)
        # What cuts the model's voice: a yield; with the flow head, any action but speak (gated to silence).
        # With the talker, silent or a backchannel only stop the writing: the phrase under way plays out.
        cut = action == YIELD or (self.talker is None and action != SPEAK)
        if said == HOLD and cut:
            ov.held_stop = True
            return SPEAK  # a stop under a backchannel is held: it goes on speaking
        if said == STOP:
            st.overlap = None
            ov.cancel()
            return YIELD  # the stop it was held from
        if said != HOLD and (ov.ended is not None or st.tick - ov.opened >= 2 * LONGEST_TICKS):
            ov.cancel()
            st.overlap = None  # over, or past telling: the model decides
        return action

    @staticmethod
    def _write(writer: PhraseWriter, tick: TickInput, action: int, logits: Tensor) -> list[int]:
        """The micro-turn's text bytes, decoded within the phrase set; an utterance ends when the model
        stops speaking (or is cancelled)."""
        if action != SPEAK or tick.cancel:
            writer.reset()
            return [NO_BYTE] * logits.shape[0]
        return writer.write(logits)

    def _talk(self, st: NativeSession, tick: TickInput, text: list[int]) -> Tensor:
        """What the talker plays this micro-turn for `st` (after `_decide` set its floor state) [4800]."""
        assert self.talker is not None and st.talk is not None
        speak = st.last_action == SPEAK
        out = self.talker.turn(
            st.talk,
            speak=speak,
            stop=st.last_action == YIELD or tick.cancel,
            backchannel=st.last_action == BACKCHANNEL,
            new=written_text(text) if speak else b"",
            committed=st.writer.committed() if st.writer is not None and speak else None,
        )
        return torch.from_numpy(out).to(self.device)

    def _decide(
        self,
        st: NativeSession,
        tick: TickInput,
        action: int,
        voice: bool,
        text: list[int],
        transcript: list[int],
    ) -> tuple[float, str, str, list[Event]]:
        """Map head decisions to events and what is emitted; update the session's floor state."""
        events: list[Event] = []
        if tick.cancel:
            action = YIELD if st.speaking else SILENT  # the client asked us to stop: drop this utterance
        if voice != st.user_speaking:
            events.append(Event("speech_started" if voice else "speech_stopped"))
            st.user_speaking = voice
            if not voice and st.hear is not None:
                st.hear.flush()  # the turn's words go out with it, not after
            self._check_turn(st, voice)
        if action == BACKCHANNEL:
            events.append(Event("backchannel"))
        if action == YIELD and st.speaking:
            events.append(Event("yielded"))
        if st.handing_off is not None and st.tick >= st.handing_off.due:
            events.append(Event("delegate", {"query": st.handing_off.query()}))
            st.handing_off = None
        if action == DELEGATE and st.last_action != DELEGATE and st.handing_off is None:
            # What the recogniser heard, where the checkpoint has one (its words are real words; the tiny
            # model's transcript head is not yet), else its transcript, else the last typed text; where
            # Whisper is at hand, what it makes of the user's last words: the turn check's, which heard the same
            # clip (the user's words since the model last spoke) and settled this hand-off, at once; else its
            # own transcription, a few micro-turns later (query.py).
            words = " ".join(st.hear.words) if st.hear is not None else ""
            query = words[-QUERY_CHARS:] or st.transcript[-QUERY_CHARS:] or st.last_typed
            checked = st.verdict.text if st.verdict is not None and self.query is not None else ""
            if checked:
                events.append(Event("delegate", {"query": checked[-QUERY_CHARS:]}))
            elif self.query is not None and st.user_audio is not None:
                st.handing_off = PendingQuery(self.query.submit(st.user_audio.question(st.tick)), query,
                                              st.tick + DUE_TICKS)
            else:
                events.append(Event("delegate", {"query": query}))
        if action == SPEAK and st.user_audio is not None:
            st.user_audio.spoke_at = st.tick
        if action in (SPEAK, DELEGATE) and st.verdict is not None:
            if st.verdict.level is not None and st.verdict.turn not in (onset.WAITED, onset.BYSTANDER):
                st.user_level.learn(st.verdict.level)  # a turn it answered on its own: the user's voice
            st.verdict = None  # the turn is taken: the next one is judged afresh
        st.speaking, st.last_action = action == SPEAK, action
        written = [b for b in text if b != NO_BYTE] if action == SPEAK else []
        st.own_text = written + [NO_BYTE] * (len(text) - len(written))
        if st.hear is not None:
            # The recogniser's committed words are the user's transcript (real words; the tiny model's
            # transcript head is not yet), streamed as they become final.
            user_text = st.hear.take_fresh()
        else:
            heard = bytes(b for b in transcript if b != NO_BYTE)
            user_text = st.transcript_dec.decode(heard)
            st.transcript = (st.transcript + user_text)[-500:]
        gate = 1.0 if action in (SPEAK, BACKCHANNEL) else 0.0
        return gate, st.text_dec.decode(bytes(written)), user_text, events

    def _check_turn(self, st: NativeSession, user_speaking: bool) -> None:
        """The user stopped: ask whether their words are finished (due `CHECK_DUE_TICKS` later); they spoke
        again: whatever was asked or said of the last stretch no longer counts."""
        if st.checking is not None:
            st.checking.verdict.cancel()
            st.checking = None
        st.verdict, st.proposal = None, None
        # Not under its own speech: a verdict counts only from silence, and one on a listener's "mm-hm" would
        # still hold when the reply ends and push it to take the floor again.
        if not user_speaking and not st.speaking and self.checker is not None and st.user_audio is not None:
            st.checking = PendingCheck(self.checker.submit(st.user_audio.question(st.tick)),
                                      st.tick + CHECK_DUE_TICKS)

    # -- moving to another replica (`Rebuilding`, models/base.py; the log and replay: replay.py) -------

    def keep_log(self, state: NativeSession) -> None:
        state.log = TickLog()

    def take_log(self, state: NativeSession) -> list[bytes]:
        return state.log.take() if state.log is not None else []

    def rebuild(self, state: NativeSession, records: list[bytes]) -> None:
        kept, state.log = state.log, None  # the store has these micro-turns already: not logged again
        try:
            replay(self, state, TickLog.from_bytes(b"".join(records), base=state.tick))
        finally:
            state.log = kept
            if kept is not None:
                kept.base = state.tick

    # -- ageing (`Ageing`, models/base.py: admission calibrates at `steady_age`) -------------------

    @torch.inference_mode()
    def fast_forward(self, state: NativeSession, ticks: int) -> None:
        """Age a fresh session to `ticks` micro-turns without stepping them: what a step costs at an
        age, measured without talking that long (admission at start-up, bench/engine_scaling.py).

        Every store index the pool would hold at that age is filled with seeded random keys and
        values, the conv state likewise, and the micro-turn counter is set. Attention reads exactly
        the store indices a session of that age has written, so the cost of the next micro-turn is
        that of a session that really talked for `ticks` micro-turns; its outputs are of course not.
        """
        if state.tick != 0:
            raise ValueError("fast_forward ages fresh sessions only; open a new session")
        g = torch.Generator().manual_seed(state.seed)
        last = torch.tensor([ticks - 1])
        for layer, geom in enumerate(self.pool.geoms):
            held = (geom.held_turns(last)[0] >= 0).to(self.device)  # [S] store indices in use
            for store in (self.pool.k[layer], self.pool.v[layer]):
                x = torch.randn(store.shape[1:], generator=g).to(self.device, self.dtype)
                store[state.slot] = x * held[:, None, None, None]
        self.pool.conv[state.slot] = torch.randn(self.pool.conv.shape[1:], generator=g).to(self.device, self.dtype)
        state.tick = ticks

    # -- the re-prefill baseline (bench/engine_scaling.py) ---------------------------------------------

    def silent_features(self, n: int) -> TurnFeatures:
        """n micro-turns of silence and no input: a stand-in history for the re-prefill baseline."""
        cfg, dev = self.cfg, self.device
        zeros = torch.zeros(n, FRAMES_PER_TURN, cfg.dmel_bins, dtype=torch.long, device=dev)
        nb = torch.full((n, 1), NO_BYTE, dtype=torch.long, device=dev)
        return TurnFeatures(
            user_dmel=zeros,
            self_dmel=zeros.clone(),
            video=torch.zeros(n, cfg.video_grid**2, PATCH, PATCH, 3, device=dev),
            video_present=torch.zeros(n, dtype=torch.bool, device=dev),
            typed=nb.expand(n, cfg.typed_tokens),
            background=nb.expand(n, cfg.background_tokens),
            own_text=nb.expand(n, cfg.text_tokens),
            heard=nb.expand(n, cfg.heard_tokens) if cfg.heard_tokens else None,
        )

    @torch.inference_mode()
    def baseline_step(self, batch: Sequence[tuple[NativeSession, TickInput]]) -> list[TickOutput]:
        """What a server without persistent sessions pays per micro-turn (for benchmarks only).

        Each session's whole history (turn + 1 micro-turns, silence standing in for the real
        inputs: the cost does not depend on them) is re-run through `forward_sequence`, then the
        last micro-turn's audio is synthesised. Session state is not advanced.
        """
        outs = []
        for st, _ in batch:
            heads = self.net.forward_sequence(self.silent_features(st.tick + 1))
            audio, _, _ = self._synthesize(heads.audio_cond[-1:], [st])
            outs.append(TickOutput(audio[0].float().cpu().numpy()))
        return outs
