"""NativeModel: the native model's serving adapter (an InteractionModel) around the transformer, its KV
pool and its vocoder.

Per micro-turn and batch: featurise (dMel, patches, bytes: inputs.py) -> one batched forward_step ->
control, text and transcript heads -> the floor's ruling on the model's action (floor.py) -> flow head
-> Griffin-Lim -> gate by the action, events and text (outputs.py) -> feed the model's own audio and
text back as next micro-turn's input. All of it runs on the one inference thread that calls `step`.

With a Piper talker (`--voice piper`, talker.py) the flow head and vocoder are skipped: the text the
model writes (decoded within its phrase set, phrases.py, when the checkpoint has one) is spoken by
Piper, and the audio the talker plays is what the model hears back as its own.
"""

import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from models.base import TickInput, TickOutput, check_slot_batch
from models.interaction import dmel, onset, vocoder
from models.interaction.config import ACTIONS, FRAMES_PER_TICK, NO_BYTE
from models.interaction.cuda_graphs import BucketedStep
from models.interaction.floor import BACKCHANNEL, SPEAK, YIELD, Floor
from models.interaction.flow import tick_noise
from models.interaction.inputs import features
from models.interaction.kv import KVPool
from models.interaction.layers import Lin
from models.interaction.model import HeadOutputs, InteractionTransformer
from models.interaction.options import GRAPH_MODES
from models.interaction.outputs import emit
from models.interaction.overlap_check import OverlapChecker
from models.interaction.phrases import PhraseSet, PhraseWriter, written_text
from models.interaction.query import QueryTranscriber
from models.interaction.replay import TickLog, replay
from models.interaction.session import NativeSession, StepObserver
from models.interaction.turn_check import TurnChecker

if TYPE_CHECKING:  # the talker imports the speech parts' speaker (~0.7 s): loaded only for --voice piper
    from models.interaction.listener import Listener
    from models.interaction.talker import PiperTalker

log = logging.getLogger(__name__)
# --native-matmul: what the transformer blocks' products run in (bench/native/precision.py measures the cost in quality)
MATMUL_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


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
        """`matmul`, `graphs`, `graph_max_batch`: see `NativeOptions` (options.py). `phrases`: what
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
        self.phrases, self.talker, self.listener = phrases, talker, listener
        self.floor = Floor(query, checker, overlaps, flow_voice=talker is None)
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
        return max(g.ticks for g in self.pool.geoms)

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
            self_dmel=torch.zeros(FRAMES_PER_TICK, self.cfg.dmel_bins, dtype=torch.long, device=self.device),
            own_text=[NO_BYTE] * self.cfg.text_tokens,
            writer=PhraseWriter(self.phrases) if self.phrases is not None else None,
            talk=self.talker.open() if self.talker is not None else None,
            hear=self.listener.open() if self.listener is not None else None,
            floor=self.floor.open(),
        )

    def close(self, state: NativeSession) -> None:
        if not state.closed:
            self.pool.release(state.slot)
            if self.talker is not None and state.talk is not None:
                self.talker.close(state.talk)
            if self.listener is not None and state.hear is not None:
                self.listener.close(state.hear)
            self.floor.close(state.floor)
            state.closed = True

    def pending_work(self, state: NativeSession) -> list[Future[Any]]:
        """The talker's synthesis the session's next micro-turn plays, a hand-off's transcription and the
        turn check due (`OffThreadWork`, models/base.py)."""
        work: list[Future[Any]] = []
        if self.talker is not None and state.talk is not None:
            work += self.talker.pending_work(state.talk)
        return work + self.floor.pending_work(state.floor)

    def shutdown(self) -> None:
        """The talker's synthesis thread, the listener's ASR processes and the hand-off transcriber
        (`Shutdown`, models/base.py)."""
        if self.talker is not None:
            self.talker.shutdown()
        self.floor.shutdown()
        if self.listener is not None:
            self.listener.shutdown()

    # -- the micro-turn -----------------------------------------------------------------------

    def _synthesize(self, cond: Tensor, states: list[NativeSession]) -> tuple[Tensor, Tensor, Tensor]:
        """Flow head + vocoder for every row (fixed shape; gated later).

        cond [B, M, D] -> audio [B, 4800] float32 and the vocoder's next context (mag, phase).
        """
        flow = self.net.flow
        noise = tick_noise(
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
        feats = features(batch, self.cfg, self.device, self.frontend, self.deterministic, self.listener, self.floor)
        ticks = torch.tensor([s.tick for s in states], device=self.device)
        slots = [s.slot for s in states]
        if self.graphs is not None:
            heads = self.graphs(feats, slots, ticks)
        else:
            heads = self.net.forward_step(feats, self.pool, slots, ticks)
        # 2. decisions (the model proposes, its floor disposes: floor.py) and audio for every row
        control = heads.control.float()
        probs = control[:, : len(ACTIONS)].softmax(-1)
        voice = (control[:, len(ACTIONS)] > 0).tolist()
        actions = self.floor.decide(batch, probs, voice, self.onset, self.delegate)
        text_ids = heads.text.argmax(-1).tolist()
        transcript_ids = heads.transcript.argmax(-1).tolist()
        if self.talker is None:
            audio, mag, phase = self._synthesize(heads.audio_cond, states)  # [B, 4800]
        # 3. per session: gate, events, feedback
        outs, spoken = [], []
        for i, (st, tick) in enumerate(batch):
            if st.writer is not None:
                text_ids[i] = self._write(st.writer, tick, actions[i], heads.text[i])
            gate, text, user_text, events = emit(st, tick, actions[i], voice[i], text_ids[i], transcript_ids[i],
                                                 self.floor)
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
            self.floor.listen(st)
        # 4. the model hears itself: dMel of what it actually said becomes next micro-turn's self audio
        own = torch.stack([torch.cat([st.self_tail, a]) for st, a in zip(states, spoken, strict=True)])
        self_dmel = self.frontend(own, self.deterministic)
        for i, st in enumerate(states):
            st.self_tail = own[i, -dmel.CONTEXT :]
            st.self_dmel = self_dmel[i]
            st.tick += 1
        return outs

    @staticmethod
    def _write(writer: PhraseWriter, tick: TickInput, action: int, logits: Tensor) -> list[int]:
        """The micro-turn's text bytes, decoded within the phrase set; an utterance ends when the model
        stops speaking (or is cancelled)."""
        if action != SPEAK or tick.cancel:
            writer.reset()
            return [NO_BYTE] * logits.shape[0]
        return writer.write(logits)

    def _talk(self, st: NativeSession, tick: TickInput, text: list[int]) -> Tensor:
        """What the talker plays this micro-turn for `st` (after `emit` set its floor state) [4800]."""
        assert self.talker is not None and st.talk is not None
        speak = st.last_action == SPEAK
        out = self.talker.step(
            st.talk,
            speak=speak,
            stop=st.last_action == YIELD or tick.cancel,
            backchannel=st.last_action == BACKCHANNEL,
            new=written_text(text) if speak else b"",
            committed=st.writer.committed() if st.writer is not None and speak else None,
        )
        return torch.from_numpy(out).to(self.device)

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
            held = (geom.held_ticks(last)[0] >= 0).to(self.device)  # [S] store indices in use
            for store in (self.pool.k[layer], self.pool.v[layer]):
                x = torch.randn(store.shape[1:], generator=g).to(self.device, self.dtype)
                store[state.slot] = x * held[:, None, None, None]
        self.pool.conv[state.slot] = torch.randn(self.pool.conv.shape[1:], generator=g).to(self.device, self.dtype)
        state.tick = ticks
