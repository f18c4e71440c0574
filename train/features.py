"""Episodes -> model features and labels, cached as .npz shards so training never re-synthesises.

Per episode of N micro-turns (arrays [N, ...]), exactly what the runtime would feed and what it
should produce (see models/interaction/serving.py for the feedback rules mirrored here):

    user_dmel   [N, 20, 80] uint8   dMel of the mic, with the previous micro-turn's tail as context
    self_dmel   [N, 20, 80] uint8   dMel of what the assistant emitted in micro-turn n-1: the target
                                    mel vocoded by the same streaming Griffin-Lim, gated by the label
    mel         [N, 20, 80] float16 target normalised log-mel of the assistant (Piper joe), frames
                                    centred where the vocoder places them
    control     [N] int8            action label; user_speaking [N] uint8
    text, own_text, transcript [N, 4] int16 bytes (256 = none); typed [N, 4]; background [N, 8]
    heard       [N, 4] int16        the newest word a streaming recogniser heard, as served (heard_stream)
"""

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from models.interaction import dmel, vocoder
from models.interaction.config import FRAMES_PER_TICK, NO_BYTE, InteractionConfig
from models.interaction.listener import hear_track
from streaming.types import TICK_SAMPLES
from train.episodes import BACKCHANNEL, SPEAK, Episode, Speaker, make_episode

LOG_FLOOR = math.log(1e-5)  # silence in the target mel (normalised: -3.75)
ARRAYS = (
    "user_dmel", "self_dmel", "mel", "mel_mask", "control", "user_speaking",
    "text", "own_text", "transcript", "typed", "background", "heard",
)


class TargetMel:
    """Assistant audio -> the flow head's target: frame k of the track is centred on sample 120 + 240 k,
    which is where the streaming Griffin-Lim puts the centre of the frame it makes from it."""

    def __init__(self, n_mels: int) -> None:
        self.window = torch.hann_window(vocoder.N_FFT, periodic=True)
        self.fb_t = dmel.mel_filterbank(n_mels, vocoder.N_FFT, vocoder.RATE, vocoder.RATE / 2).T.contiguous()

    def __call__(self, audio: npt.NDArray[np.float32]) -> torch.Tensor:
        """audio [N * 4800] -> normalised log-mel [N, 20, mels]."""
        n = len(audio) // TICK_SAMPLES
        lead = vocoder.N_FFT // 2 - vocoder.HOP // 2  # 360: frame 0 starts 360 samples before the track
        x = torch.from_numpy(np.pad(audio, (lead, vocoder.N_FFT)))
        frames = x.unfold(0, vocoder.N_FFT, vocoder.HOP)[: n * FRAMES_PER_TICK]  # [N*20, N_FFT]
        mag = torch.fft.rfft(frames * self.window, dim=-1).abs()
        logmel = torch.log((mag @ self.fb_t).clamp(min=1e-5))
        return ((logmel - vocoder.MEL_MEAN) / vocoder.MEL_STD).reshape(n, FRAMES_PER_TICK, -1)


def _spread(text: str, first: int, ticks: int, out: npt.NDArray[np.int16], width: int) -> None:
    """Write text's bytes over micro-turns first..first+ticks-1, ahead of time, <= width per tick."""
    data = text.encode()
    if ticks <= 0:
        return
    per = min(width, max(1, -(-len(data) // ticks)))
    for k in range(ticks):
        chunk = data[k * per : (k + 1) * per]
        if first + k >= len(out) or not chunk:
            break
        out[first + k, : len(chunk)] = list(chunk)


def _queue(events: Sequence[tuple[int, str]], n: int, width: int) -> npt.NDArray[np.int16]:
    """What the runtime's typed/background queue hands the model per micro-turn (width bytes each)."""
    out = np.full((n, width), NO_BYTE, dtype=np.int16)
    pending = bytearray()
    arrivals = sorted(events)
    for t in range(n):
        while arrivals and arrivals[0][0] == t:
            pending += arrivals.pop(0)[1].encode() + b"\n"
        take, pending = pending[:width], pending[width:]
        out[t, : len(take)] = list(take)
    return out


def heard_stream(ep: Episode, width: int) -> npt.NDArray[np.int16]:
    """The heard-words channel's bytes per micro-turn: pocketsphinx run over the user's track exactly as
    serving runs it (models/interaction/listener.py), so the words and their timing are the real ones."""
    return np.array(hear_track(ep.user, width), dtype=np.int16).reshape(ep.ticks, width)


class Featurizer:
    def __init__(self, cfg: InteractionConfig) -> None:
        self.cfg = cfg
        self.front = dmel.DMelFrontend(cfg.dmel_bins, cfg.dmel_levels, torch.device("cpu"))
        self.gl = vocoder.GriffinLim(cfg.mel_bins, cfg.griffin_lim_iters, torch.device("cpu"))
        self.mel = TargetMel(cfg.mel_bins)

    def _dmel(self, track: torch.Tensor) -> torch.Tensor:
        """track [N * 4800] -> [N, 20, bins]: micro-turn n with the CONTEXT samples before it."""
        padded = torch.cat([torch.zeros(dmel.CONTEXT), track])
        win = padded.unfold(0, dmel.CONTEXT + TICK_SAMPLES, TICK_SAMPLES)  # [N, CONTEXT + 4800]
        return self.front(win.contiguous(), False)

    def __call__(self, ep: Episode) -> dict[str, npt.NDArray[Any]]:
        n, c = ep.ticks, self.cfg
        track = np.zeros(n * TICK_SAMPLES, dtype=np.float32)
        text = np.full((n, c.text_tokens), NO_BYTE, dtype=np.int16)
        for seg in ep.assistant:
            s = seg.start * TICK_SAMPLES
            track[s : s + len(seg.audio)] += seg.audio[: len(track) - s]
            if seg.kind == SPEAK:
                full = -(-len(seg.audio) // TICK_SAMPLES)
                spoken = int(np.sum(ep.control[seg.start : seg.start + full] == SPEAK))
                _spread(seg.text, seg.start, max(spoken, 1) if spoken else 0, text, c.text_tokens)
        mel = self.mel(track)  # [N, 20, mels]
        emits = np.isin(ep.control, (SPEAK, BACKCHANNEL))
        text[~(ep.control == SPEAK)] = NO_BYTE
        # 1. what it emitted: the target vocoded, gated exactly as the runtime gates (teacher forcing)
        mag, phase = self.gl.initial_state(torch.device("cpu"))
        spoken_audio = torch.zeros(n * TICK_SAMPLES)
        with torch.no_grad():
            for t in range(n):
                y, mag3, phase3 = self.gl(mel[t : t + 1], mag[None], phase[None], False)
                mag, phase = mag3[0], phase3[0]
                if emits[t]:
                    spoken_audio[t * TICK_SAMPLES : (t + 1) * TICK_SAMPLES] = y[0]
        self_dmel = torch.zeros(n, FRAMES_PER_TICK, c.dmel_bins, dtype=torch.long)
        self_dmel[1:] = self._dmel(spoken_audio)[:-1]  # heard one micro-turn later
        own = np.full_like(text, NO_BYTE)
        own[1:] = text[:-1]
        transcript = np.full((n, c.transcript_tokens), NO_BYTE, dtype=np.int16)
        for first, last, said in ep.user_text:
            _spread(said, first, last - first + 1, transcript, c.transcript_tokens)
        mel_mask = emits & (np.abs(track.reshape(n, TICK_SAMPLES)).max(axis=1) > 1e-4)
        return {
            "user_dmel": self._dmel(torch.from_numpy(ep.user)).numpy().astype(np.uint8),
            "self_dmel": self_dmel.numpy().astype(np.uint8),
            "mel": mel.numpy().astype(np.float16),
            "mel_mask": mel_mask.astype(np.uint8),
            "control": ep.control.copy(),
            "user_speaking": ep.user_speaking.copy(),
            "text": text,
            "own_text": own,
            "transcript": transcript,
            "typed": _queue(ep.typed, n, c.typed_tokens),
            "heard": heard_stream(ep, c.audio_tokens),  # built for every cache; read by heard_tokens > 0
            "background": _queue(ep.background, n, c.background_tokens),
        }


def build_cache(
    out: Path, cfg: InteractionConfig, seed: int, episodes: int, ticks: int, shard: int = 20,
    keep_audio: bool = False, log: Any = print,
) -> None:
    """Generate `episodes` episodes (seeds seed*1_000_003 + i) into out/shard-XXX.npz, with progress.

    Existing complete shards are kept, so an interrupted build continues where it stopped.
    """
    out.mkdir(parents=True, exist_ok=True)
    spk, feat = Speaker(), Featurizer(cfg)
    t0 = time.monotonic()
    for s0 in range(0, episodes, shard):
        path = out / f"shard-{s0 // shard:03d}.npz"
        if path.exists():
            continue
        rows: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in ARRAYS}
        audio, meta = [], []
        for i in range(s0, min(s0 + shard, episodes)):
            ep = make_episode(seed * 1_000_003 + i, ticks, spk)
            for k, v in feat(ep).items():
                rows[k].append(v)
            # The on-disk key stays "turns" (here and in info.json), so caches built before still load.
            meta.append({"seed": ep.seed, "scenes": ep.scenes, "pauses": ep.pauses, "assistant": [
                {"start": g.start, "turns": g.ticks, "text": g.text, "kind": int(g.kind)} for g in ep.assistant]})
            if keep_audio:
                audio.append(ep.user.astype(np.float16))
        arrays = {k: np.stack(v) for k, v in rows.items()}
        if keep_audio:
            arrays["user_audio"] = np.stack(audio)
        tmp = out / f".tmp-{path.name}"  # not matched by shard-*.npz until complete
        np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
        tmp.rename(path)
        done = min(s0 + shard, episodes)
        rate = done / max(time.monotonic() - t0, 1e-9)
        log(f"data {out.name}: {done}/{episodes} episodes, {rate:.2f} episodes/s, "
            f"ETA {(episodes - done) / rate:.0f} s")
    (out / "info.json").write_text(json.dumps(
        {"seed": seed, "episodes": episodes, "turns": ticks, "config": cfg.to_dict()}, indent=1))


def load_cache(path: Path) -> dict[str, npt.NDArray[Any]]:
    """All shards of a cache directory, concatenated along episodes."""
    shards = sorted(path.glob("shard-*.npz"))
    if not shards:
        raise FileNotFoundError(f"no feature shards in {path}; build them with `duplex train --data {path}` first")
    parts = [dict(np.load(s)) for s in shards]
    keys = [k for k in parts[0] if k != "meta"]
    out = {k: np.concatenate([p[k] for p in parts]) for k in keys}
    out["meta"] = np.array(json.dumps([m for p in parts for m in json.loads(str(p["meta"]))]))
    return out
