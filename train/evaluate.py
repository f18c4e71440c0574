"""Held-out evaluation of a native checkpoint: control confusion matrix and the voice's word error.

    python -m train.evaluate --checkpoint models/interaction/weights/native-tiny.safetensors \
        --heldout data/heldout --episodes 12 --json
    python -m train.evaluate --heldout /tmp/heldout38 --build 12 --data-seed 38 --no-voice  # builds it first

Both are teacher-forced on held-out synthetic episodes (the inputs the episode says, not what the
model did earlier), so they measure the heads, not the closed loop (bench.fdbench measures that):

* control: per micro-turn decision of the control head as served (greedy, except that an onset needs
  the checkpoint's calibrated p(speak), `--onset`: models/interaction/onset.py) against the label, a confusion matrix
  (rows = the episode's target action, columns = the model's decision, ACTIONS order: speak, silent,
  backchannel, yield, delegate) with per-class precision and recall (a text table without --json);
  and as events: speech onsets on the labelled micro-turn, speaking where it should be silent,
  mid-sentence pauses taken, delegations near their label and elsewhere, and the user's speech under a
  reply that the labels talk through (a backchannel) and the model did (`overlaps_talked_through`);
* voice: for every assistant utterance of the closed phrase set in those episodes, the flow head
  samples mel on the utterance's micro-turns, the streaming Griffin-Lim vocoder makes audio, and
  pocketsphinx transcribes it; word error rate against the phrase. The same pipeline on the target
  mel (Piper joe -> mel -> Griffin-Lim) is reported beside it: the floor the vocoder and ASR set;
* text: for every utterance the assistant says whole, its text head's bytes decoded within the phrase
  set as served (phrases.py: the answers it may quote are the background results read before it) on
  the utterance's micro-turns, and the phrase that commits it to (what the talker speaks). An answer
  ("Here is what I found. <the background result>") is right when it is that answer word for word;
  a reply is drawn at random from the set by the episodes, so its match with the label is chance
  (1 in the set's size, reported beside it); what matters there is that what it says is whole
  phrases (`replies_whole_phrase`: written on while the model keeps speaking, as served, where it
  chains up to three replies, and whole when its last phrase is settled; before, only the label's
  micro-turns were read, and a second phrase begun in them counted as a broken one).
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from models.interaction import vocoder
from models.interaction.checkpoint import build, checkpoint_metadata
from models.interaction.config import ACTIONS, NO_BYTE
from models.interaction.flow import tick_noise
from models.interaction.model import InteractionTransformer
from models.interaction.onset import choose_delegate, choose_onset, decide
from models.interaction.phrases import TRAINED_ANSWER_LEAD, TRAINED_REPLIES, PhraseSet, PhraseWriter
from models.speech.asr import transcribe_words
from train.data import EpisodeData


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(edit distance in words, reference words) after lower-casing and dropping punctuation."""
    r = re.sub(r"[^a-z' ]", " ", ref.lower()).split()
    h = re.sub(r"[^a-z' ]", " ", hyp.lower()).split()
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
            prev, d[j] = d[j], cur
    return d[len(h)], len(r)


def _vocode(gl: vocoder.GriffinLim, mel: torch.Tensor) -> np.ndarray:
    """mel [K, 20, mels] (normalised) -> audio [K * 4800] through the streaming vocoder."""
    mag, phase = gl.initial_state(torch.device("cpu"))
    out = []
    for k in range(mel.shape[0]):
        y, m3, p3 = gl(mel[k : k + 1], mag[None], phase[None], True)
        mag, phase = m3[0], p3[0]
        out.append(y[0])
    return torch.cat(out).numpy()


DELEGATE_SLACK = 2  # micro-turns either side of a labelled delegation in which taking it counts
DELEGATE_CURVE = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)  # p(delegate) thresholds the curve reports


def _hand_offs(pred: np.ndarray, lab: np.ndarray) -> tuple[int, int, int]:
    """(labelled delegations taken within DELEGATE_SLACK micro-turns, labelled, runs taken far from any).
    A delegation is one event (the server sends the first micro-turn of a run of them): taken near its
    label counts, however many micro-turns the run lasts; a run far from any label is spurious."""
    d = ACTIONS.index("delegate")
    near = np.zeros(len(lab), dtype=bool)
    caught = labelled = 0
    for t in np.flatnonzero(lab == d):
        window = slice(max(0, t - DELEGATE_SLACK), t + DELEGATE_SLACK + 1)
        near[window] = True
        caught += int(np.any(pred[window] == d))
        labelled += 1
    starts = (pred == d) & np.concatenate([[True], pred[:-1] != d])
    return caught, labelled, int(np.sum(starts & ~near))


def _said(writer: PhraseWriter, text: torch.Tensor, background: torch.Tensor, start: int, ticks: int,
          speaking: npt.NDArray[np.bool_] | None = None) -> bytes:
    """What the served decoding writes from micro-turn `start` (text logits [N, T, 257]), having read the
    background bytes [N, W] before it: over the label's `ticks` micro-turns, and on while the model keeps
    speaking (`speaking[t]`, its decisions) as it would served, chaining replies; without `speaking`, up
    to the first whole phrase in the label's span."""
    for row in background[: start + 1].tolist():
        writer.hear_background(bytes(b for b in row if b != NO_BYTE))
    t = start
    while t < text.shape[0] and (t < start + ticks or (speaking is not None and bool(speaking[t]))):
        writer.write(text[t])
        t += 1
        if speaking is None and writer.complete:
            break
    whole = writer.committed()  # the talker speaks the whole phrase once the written bytes settle it
    return whole.encode() if whole is not None else bytes(writer.prefix)


@torch.no_grad()
def evaluate(net: InteractionTransformer, data: EpisodeData, episodes: int, voice: bool = True,
             phrases: PhraseSet | None = None, onset_threshold: float = 0.0,
             delegate_threshold: float = 0.0) -> dict[str, Any]:
    """`onset_threshold`: the p(speak) an onset needs, as served (models/interaction/onset.py; 0 = greedy);
    `delegate_threshold`: the p(delegate) a hand-off needs (the same module; 0 = the argmax). Beside the
    decisions at those thresholds, `delegate_curve` gives the hand-offs at each of DELEGATE_CURVE: the
    calibration of `--native-delegate` (look-ups caught against hand-offs elsewhere, per minute).
    Teacher-forced, the model heard itself speaking on a row exactly when the label before it is speech."""
    net.eval()
    phrases = phrases or PhraseSet(TRAINED_REPLIES, TRAINED_ANSWER_LEAD)
    said = {"reply": [0, 0], "answer": [0, 0]}  # [the label's words exactly, utterances]
    whole = 0  # replies that are one whole phrase of the set
    delegations = [0, 0, 0]  # [labelled ones it took within DELEGATE_SLACK micro-turns, labelled, taken elsewhere]
    curve = np.zeros((len(DELEGATE_CURVE), 3), dtype=np.int64)  # the same, at each threshold of the curve
    na = len(ACTIONS)
    conf = np.zeros((na, na), dtype=np.int64)
    onsets = [0, 0]  # [taken on the labelled micro-turn, labelled onsets]
    starts = [0, 0]  # [spoke although the label stays silent (not continuing speech), such micro-turns]
    pauses = [0, 0]  # [mid-sentence pauses in which it took the floor, pauses] (caches that record them)
    overlaps = [0, 0]  # [user speech under its reply that it talked through, such stretches] (backchannels)
    gl = vocoder.GriffinLim(net.cfg.mel_bins, net.cfg.griffin_lim_iters, torch.device("cpu"))
    errs = {"model": [0, 0], "target": [0, 0]}
    samples: list[dict[str, str]] = []
    meta = json.loads(str(data.arrays["meta"]))
    t0 = time.monotonic()
    for e in range(min(episodes, data.episodes)):
        b = data.batch([e])
        out = net.forward_batched(b.feats, b.n_ticks)
        lab = b.control.numpy()
        speak, silent = ACTIONS.index("speak"), ACTIONS.index("silent")
        was_quiet = np.concatenate([[True], lab[:-1] != speak])  # the row before is not (labelled) speech
        probs = out.control[:, :na].float().softmax(-1)
        pred = decide(probs, torch.from_numpy(~was_quiet), onset_threshold, delegate_threshold)
        pr = pred.numpy()
        for i, tau in enumerate(DELEGATE_CURVE):
            curve[i] += _hand_offs(decide(probs, torch.from_numpy(~was_quiet), onset_threshold, tau).numpy(), lab)
        np.add.at(conf, (lab, pr), 1)
        onset = (lab == speak) & was_quiet
        onsets[0] += int(np.sum(onset & (pr == speak)))
        onsets[1] += int(np.sum(onset))
        quiet = (lab == silent) & was_quiet
        starts[0] += int(np.sum(quiet & (pr == speak)))
        starts[1] += int(np.sum(quiet))
        # Through a pause after an unfinished clause every row is a real decision (the labels keep the
        # assistant silent, so teacher forcing feeds it no speech of its own).
        for a, z in meta[e].get("pauses", []):
            pauses[0] += int(np.any(pr[a:z] == speak))
            pauses[1] += int(z > a)
        # The user speaking while the labels keep the assistant talking (a backchannel under its reply,
        # not a barge-in's first micro-turns, which the labels yield to next): talked through when the
        # model says speak on every micro-turn of it.
        under = np.flatnonzero((lab == speak) & (b.user_speaking.numpy() > 0.5))
        for run in np.split(under, np.flatnonzero(np.diff(under) > 1) + 1):  # runs of consecutive micro-turns
            if run.size and not (run[-1] + 1 < len(lab) and lab[run[-1] + 1] == ACTIONS.index("yield")):
                overlaps[0] += int(np.all(pr[run] == speak))
                overlaps[1] += 1
        delegations = [x + y for x, y in zip(delegations, _hand_offs(pr, lab), strict=True)]
        for seg in meta[e]["assistant"]:
            if seg["kind"] != ACTIONS.index("speak") or not bool(np.all(lab[seg["start"] : seg["start"] + seg["turns"]]
                                                                     == speak)):
                continue  # a backchannel, or cut short by a barge-in
            writer = PhraseWriter(phrases)
            got = _said(writer, out.text, b.feats.background, seg["start"], seg["turns"])
            want = max((u for u in writer.allowed() if seg["text"].encode().startswith(u)), key=len, default=b"")
            kind = "answer" if seg["text"].startswith(phrases.answer_lead) else "reply"
            said[kind][0] += int(bool(want) and got == want)
            said[kind][1] += 1
            if kind == "reply":
                # What it says served: written on while it keeps speaking, replies chained; whole when
                # its last phrase is settled (the talker speaks it to its end), the ones before it whole.
                served = PhraseWriter(phrases)
                _said(served, out.text, b.feats.background, seg["start"], seg["turns"], pr == speak)
                whole += int(served.committed() is not None)
        if voice:
            for seg in meta[e]["assistant"]:
                ticks = [t for t in range(seg["start"], seg["start"] + seg["turns"]) if bool(b.mel_mask[t])]
                if len(ticks) < max(seg["turns"], 2):
                    continue  # cut short by a barge-in or the episode's end: not a whole phrase
                idx = torch.tensor(ticks)
                noise = tick_noise([e] * len(ticks), ticks, (net.cfg.audio_out_tokens, net.flow.width),
                                   torch.device("cpu"))
                mel = net.flow.sample(out.audio_cond[idx], noise)  # [K, 20, mels]
                for name, m in (("model", mel), ("target", b.mel[idx])):
                    audio = _vocode(gl, m)
                    hyp = " ".join(w for w, _, _ in transcribe_words(audio, vocoder.RATE))
                    d, n = word_errors(seg["text"], hyp)
                    errs[name][0] += d
                    errs[name][1] += n
                    if name == "model" and len(samples) < 12:
                        samples.append({"phrase": seg["text"], "heard": hyp})
        # Progress on stderr: stdout is the result, which --json makes machine-readable.
        print(f"evaluate: episode {e + 1}/{min(episodes, data.episodes)} ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    recall = {a: round(float(conf[i, i] / max(conf[i].sum(), 1)), 3) for i, a in enumerate(ACTIONS)}
    precision = {a: round(float(conf[i, i] / max(conf[:, i].sum(), 1)), 3) for i, a in enumerate(ACTIONS)}
    result: dict[str, Any] = {
        "micro_turns": int(conf.sum()),
        "control_correct": int(np.trace(conf)),  # the accuracy's numerator: the matrix's diagonal
        "control_accuracy": round(float(np.trace(conf) / max(conf.sum(), 1)), 4),
        "confusion": {"rows_label_cols_predicted": list(ACTIONS), "counts": conf.tolist()},
        "recall": recall,
        "precision": precision,
        # Taking the floor on exactly the labelled micro-turn (teacher-forced, so only the onset row is a
        # real decision: on later rows the model hears itself speaking), and speaking where it should not.
        "onset_recall": round(onsets[0] / max(onsets[1], 1), 3),
        "onsets": onsets[1],
        "false_start_rate": round(starts[0] / max(starts[1], 1), 4),
    }
    result["delegations"] = f"{delegations[0]}/{delegations[1]} within {DELEGATE_SLACK} micro-turns"
    result["spurious_delegations"] = delegations[2]
    minutes = conf.sum() * 0.2 / 60  # micro-turns of 200 ms
    result["delegate_curve"] = [
        {"threshold": tau, "caught": f"{c}/{n}", "elsewhere_per_minute": round(float(x / max(minutes, 1e-9)), 2)}
        for tau, (c, n, x) in zip(DELEGATE_CURVE, curve.tolist(), strict=True)
    ]
    result["answers_exact"] = f"{said['answer'][0]}/{said['answer'][1]}"
    result["replies_whole_phrase"] = f"{whole}/{said['reply'][1]}"
    result["replies_label_phrase"] = f"{said['reply'][0]}/{said['reply'][1]} (chance {1 / len(phrases.replies):.3f})"
    if pauses[1]:
        result["pause_taken_rate"] = round(pauses[0] / pauses[1], 3)  # lower is better
        result["pauses"] = pauses[1]
    if overlaps[1]:
        result["overlaps_talked_through"] = f"{overlaps[0]}/{overlaps[1]}"
    if voice:
        result["voice_wer"] = round(errs["model"][0] / max(errs["model"][1], 1), 3)
        result["vocoder_floor_wer"] = round(errs["target"][0] / max(errs["target"][1], 1), 3)
        result["phrase_words"] = errs["model"][1]
        result["examples"] = samples
    return result


def confusion_table(result: dict[str, Any]) -> str:
    """The confusion matrix as text: one row per target action (its count of micro-turns, then how many
    the model decided as each action), recall at the row's end and precision under each column."""
    names = result["confusion"]["rows_label_cols_predicted"]
    counts = np.asarray(result["confusion"]["counts"])
    w = max(11, *(len(n) + 2 for n in names))
    head = "target \\ model".ljust(w) + "".join(n.rjust(w) for n in names) + "total".rjust(w) + "recall".rjust(w)
    lines = [head]
    for i, n in enumerate(names):
        lines.append(n.ljust(w) + "".join(str(int(c)).rjust(w) for c in counts[i])
                     + str(int(counts[i].sum())).rjust(w) + f"{result['recall'][n]:.3f}".rjust(w))
    lines.append("total".ljust(w) + "".join(str(int(c)).rjust(w) for c in counts.sum(0))
                 + str(int(counts.sum())).rjust(w))
    lines.append("precision".ljust(w) + "".join(f"{result['precision'][n]:.3f}".rjust(w) for n in names))
    lines.append(f"control accuracy {result['control_accuracy']:.4f} "
                 f"({result['control_correct']}/{result['micro_turns']} micro-turns, teacher-forced)")
    return "\n".join(lines)


def ensure_heldout(path: Path, episodes: int, seed: int, ticks: int) -> None:
    """Build `episodes` held-out episodes of `seed` into `path` unless a cache is there already (an
    interrupted build continues). Use a seed no training set used: the shipped checkpoint's metadata
    names its data seeds (1, 101; its held-out set: 2)."""
    if (path / "info.json").exists():
        info = json.loads((path / "info.json").read_text())
        if info.get("seed") != seed:
            raise SystemExit(f"{path} holds episodes of seed {info.get('seed')}, not --data-seed {seed}; "
                             "pass another --heldout folder or drop --build")
        return
    from models.interaction.config import preset
    from train.features import build_cache

    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")  # as duplex train builds its held-out set
    print(f"evaluate: building {episodes} held-out episodes of {ticks} micro-turns into {path} (seed {seed})",
          flush=True)
    build_cache(path, preset("tiny"), seed, episodes, ticks, shard=min(20, episodes), keep_audio=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="native checkpoint (default: the shipped one)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--heldout", default="data/heldout", help="feature cache of held-out episodes")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--no-voice", action="store_true", help="skip the vocoder + ASR part")
    ap.add_argument("--build", type=int, default=0, metavar="N",
                    help="first build N held-out episodes of --data-seed into --heldout (if it holds none)")
    ap.add_argument("--data-seed", type=int, default=38, help="episode seed for --build (training used 1 and 101)")
    ap.add_argument("--ticks", type=int, default=100, help="micro-turns per episode for --build (100 = 20 s)")
    ap.add_argument("--onset", type=float, default=None, metavar="P",
                    help="p(speak) an onset needs, as `duplex serve --native-onset` (default: the checkpoint's "
                    "calibrated threshold, else 0 = greedy)")
    ap.add_argument("--delegate", type=float, default=None, metavar="P",
                    help="p(delegate) a hand-off needs, as `duplex serve --native-delegate` (default: the "
                    "checkpoint's calibrated threshold, else 0 = the argmax); delegate_curve shows the others")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table and key: value lines")
    a = ap.parse_args(argv)
    if a.build:
        ensure_heldout(Path(a.heldout), a.build, a.data_seed, a.ticks)
    net = build(a.preset, a.checkpoint)
    data = EpisodeData(Path(a.heldout), net.cfg)
    meta = checkpoint_metadata(a.preset, a.checkpoint)
    threshold = choose_onset(a.onset, meta)[0]
    hand_off = choose_delegate(a.delegate, meta)[0]
    r = evaluate(net, data, a.episodes, voice=not a.no_voice, phrases=PhraseSet.from_metadata(meta),
                 onset_threshold=threshold, delegate_threshold=hand_off)
    r["onset_threshold"] = threshold
    r["delegate_threshold"] = hand_off
    if a.json:
        print(json.dumps(r))
        return 0
    print(confusion_table(r))
    for k, v in r.items():
        if k not in ("confusion", "recall", "precision", "control_accuracy", "control_correct", "micro_turns"):
            print(f"{k}: {json.dumps(v)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
