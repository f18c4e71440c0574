"""`load_native`: the native model built from a preset or checkpoint and served with `NativeOptions`."""

import logging

import torch

from models.interaction.checkpoint import build, checkpoint_metadata, parameter_count
from models.interaction.config import InteractionConfig
from models.interaction.kv import KVPool
from models.interaction.listener import Listener
from models.interaction.onset import choose_delegate, choose_onset
from models.interaction.options import NativeOptions
from models.interaction.overlap_check import OverlapChecker
from models.interaction.phrases import PhraseSet
from models.interaction.query import QueryTranscriber
from models.interaction.serving import NativeModel
from models.interaction.turn_check import TurnChecker
from models.interaction.voice import choose_voice
from models.threads import set_cpu_threads

log = logging.getLogger(__name__)


def slots_for_budget(cfg: InteractionConfig, dtype: torch.dtype, budget_bytes: int, what: str) -> int:
    per = KVPool.session_bytes(cfg, dtype)
    n = budget_bytes // per
    if n < 1:
        raise ValueError(
            f"KV budget of {budget_bytes / 2**20:.1f} MiB cannot hold even one {what} session "
            f"({per / 2**20:.1f} MiB each); raise --kv-budget-mb (DUPLEX_KV_BUDGET_MB) or use a smaller preset"
        )
    return int(n)


def load_native(
    preset_name: str = "tiny",
    checkpoint: str | None = None,
    device: str | None = None,
    kv_budget_mb: float | None = None,
    deterministic: bool | None = None,
    options: NativeOptions | None = None,
) -> NativeModel:
    """`options`: how to serve it (None: the defaults, environment overrides included); `kv_budget_mb`
    and `deterministic`, when given, override those two of them."""
    opts = options or NativeOptions.from_env()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    if dev.type == "cpu":
        set_cpu_threads(opts.threads)
    net = build(preset_name, checkpoint)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    net = net.to(device=dev, dtype=dtype)
    if kv_budget_mb is None:
        kv_budget_mb = opts.kv_budget_mb
    if kv_budget_mb is None:
        budget = int(torch.cuda.mem_get_info(dev)[0] * 0.85) if dev.type == "cuda" else 512 * 2**20
    else:
        budget = int(kv_budget_mb * 2**20)
    n_slots = slots_for_budget(net.cfg, dtype, budget, f"native:{preset_name}")
    if deterministic is None:
        deterministic = opts.deterministic
    meta = checkpoint_metadata(preset_name, checkpoint)
    phrases = PhraseSet.from_metadata(meta)
    voice, why = choose_voice(opts.voice, meta)
    threshold, why_onset = choose_onset(opts.onset, meta)
    hand_off, why_delegate = choose_delegate(opts.delegate, meta)
    log.info("native:%s speaks with %s (%s); its text is %s", preset_name,
             "its flow head" if voice == "flow" else "Piper (the talker)", why,
             f"decoded within its {len(phrases.replies)} trained phrases" if phrases else "decoded freely")
    talker = None
    if voice == "piper":
        from models.interaction.talker import PiperTalker  # imports the speech parts' speaker: only when used

        talker = PiperTalker(phrases)
    listener = Listener.for_config(net.cfg)  # an ASR worker process, for a checkpoint that reads heard words
    if listener is not None:
        log.info("native:%s reads the words pocketsphinx hears (heard_tokens=%d, models/interaction/heard.py)",
                 preset_name, net.cfg.heard_tokens)
    query = QueryTranscriber.for_mode(opts.query)
    log.info("native:%s hands off with %s", preset_name,
             "Whisper's words for the user's last utterance (models/interaction/query.py)" if query is not None
             else "the words the recogniser streamed (--native-query heard, or Whisper is not installed)")
    checker = TurnChecker.for_mode(opts.turn_check)
    log.info("native:%s takes the turn %s", preset_name,
             "with the verdict of Whisper and the text model on the user's words (models/interaction/turn_check.py)"
             if checker is not None else "on its own decision (--native-turn-check off, or Whisper is not installed)")
    overlaps = OverlapChecker.for_mode(opts.overlap_check)
    log.info("native:%s %s", preset_name,
             "goes on speaking through what the overlap probe and Whisper's words say is a backchannel "
             "(models/interaction/overlap_check.py)" if overlaps is not None
             else "stops for overlaps on its own decision (--native-overlap-check off, or Whisper is not installed)")
    model = NativeModel(net, f"native:{preset_name}", n_slots, dev, deterministic, matmul=opts.matmul,
                        graphs=opts.graphs, graph_max_batch=opts.graph_max_batch, phrases=phrases, talker=talker,
                        listener=listener, onset_threshold=threshold, delegate_threshold=hand_off, query=query,
                        checker=checker, overlaps=overlaps)
    log.info("native:%s takes the floor at p(speak) >= %.2f (%s)", preset_name, threshold, why_onset)
    if hand_off > 0:
        log.info("native:%s hands off at p(delegate) >= %.2f (%s)", preset_name, hand_off, why_delegate)
    log.info(
        "native:%s: %.1f M parameters on %s, %d KV slots of %.1f MiB, deterministic=%s",
        preset_name,
        parameter_count(net) / 1e6,
        dev,
        n_slots,
        model.session_bytes / 2**20,
        deterministic,
    )
    return model
