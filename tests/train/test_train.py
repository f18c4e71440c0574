"""Training end to end on a tiny episode set: data, loss, resume, LoRA, sample == server."""

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.fdbench import _texts as bench_texts
from models.base import TickInput
from models.interaction.config import ACTIONS
from streaming.pcm import float32_to_pcm16
from tests.models.test_interaction_core import small_cfg
from tests.wsclient import b64, collect_audio, send, start_session
from train import _texts as train_texts
from train.cli import evaluate
from train.client import AdamParams, TrainingClient
from train.data import EpisodeData
from train.episodes import Speaker, _Builder, make_episode, scene_qa
from train.features import build_cache
from train.lora import LoRALin, apply_lora, merge_lora
from train.losses import Batch, LossWeights, sft_loss

TURNS = 24


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The module's models are tiny (dim 32): a second intra-op thread buys nothing, and on the shared 2-core
    box, beside the other xdist worker, its spinning cost each training step 2-15 s instead of 0.2 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    old = os.environ.get("DUPLEX_TTS_DETERMINISTIC")
    os.environ["DUPLEX_TTS_DETERMINISTIC"] = "1"
    path = tmp_path_factory.mktemp("episodes")
    build_cache(path, small_cfg(), seed=7, episodes=4, ticks=TURNS, shard=2, log=lambda m: None)
    yield path
    if old is None:
        os.environ.pop("DUPLEX_TTS_DETERMINISTIC", None)
    else:
        os.environ["DUPLEX_TTS_DETERMINISTIC"] = old


@pytest.fixture(scope="module")
def spk() -> Speaker:
    """One TTS cache for the module: its tests build episodes of the same seeds (0, 1, ...), whose phrases
    would otherwise be synthesised again in each."""
    return Speaker()


def client(**kw: object) -> TrainingClient:
    return TrainingClient("tiny", config=small_cfg(), precision="fp32", seed=3, **kw)  # type: ignore[arg-type]


def test_texts_disjoint_from_benchmark() -> None:
    """No sentence is shared; one- and two-word backchannels ("Yeah.", "Okay.") are common words both
    sides must use, so they are left out of the comparison."""

    def sentences(module: object) -> set[str]:
        lists = [v for k, v in vars(module).items() if k.isupper() and isinstance(v, list)]
        return {s for v in lists for s in v if isinstance(s, str) and len(s.split()) >= 3}

    bench, ours = sentences(bench_texts), sentences(train_texts)
    assert len(ours) > 90
    assert not bench & ours, f"training texts overlap the benchmark's: {sorted(bench & ours)[:5]}"
    assert len(train_texts.phrase_set()) >= 20


def test_only_the_last_word_tells_a_pause_from_a_statement() -> None:
    """A mid-sentence pause's head ends on a word that promises more; a finished statement never ends
    on one of those words, while it does share their beginnings ("... and I could" / "... and I could
    not sleep."), so the model has to read where the clause ends, not how it starts."""

    def last(text: str) -> str:
        return text.rstrip(".?!").split()[-1].lower()

    open_words = {last(h) for h in train_texts.HEADS}
    assert {"could", "whether", "the", "was", "because", "to"} <= open_words
    finished = [s for s in train_texts.STATEMENTS if last(s) in open_words]
    assert not finished, f"statements end on a word that leaves a clause open: {finished[:3]}"
    heads = set(train_texts.HEADS)
    continued = [s for s in train_texts.STATEMENTS
                 if any(" ".join(s.split()[:n]) in heads for n in range(3, len(s.split())))]
    assert len(continued) >= 24, "finished statements should go on from the heads' own words"


def test_episodes_are_seeded_and_labelled(cache: Path, spk: Speaker) -> None:
    a, b = make_episode(11, 60, spk), make_episode(11, 60, spk)
    assert np.array_equal(a.user, b.user) and a.scenes == b.scenes
    assert not np.array_equal(a.user, make_episode(12, 60, spk).user)
    data = EpisodeData(cache, small_cfg())
    assert data.arrays["user_dmel"].shape == (4, TURNS, 20, 80)
    control = data.arrays["control"]
    assert {ACTIONS.index("speak"), ACTIONS.index("silent")} <= set(np.unique(control).tolist())
    # the mel target is judged only where the assistant emits audio, and there it is not silence
    mask = data.arrays["mel_mask"].astype(bool)
    assert mask.any() and data.arrays["mel"][mask].mean() > data.arrays["mel"][~mask].mean() + 1.0


def test_mid_sentence_pauses_are_recorded_silent_and_scored(tmp_path: Path, spk: Speaker) -> None:
    """A pause scene records its pause: every micro-turn of it is labelled silent with the user quiet, and
    train.evaluate counts a model that speaks in it as taking the floor there."""
    from train.evaluate import evaluate as heldout_eval

    # The first seeds with a pause scene, found once by searching range(40) (episodes are seeded:
    # test_episodes_are_seeded_and_labelled): the search synthesised the speech of 10 episodes without
    # one, ~4 s a run. If the episodes change, search again: next(s for s in range(40) if make_episode(...).pauses).
    ep = make_episode(0, 100, spk)
    assert ep.pauses, "episode 0 (100 micro-turns) has no pause scene any more: search range(40) for a seed that has"
    for a, z in ep.pauses:
        assert z - a >= 4, ep.pauses  # 1.2-3 s of pause, less the micro-turns the words' ends cover
        assert (ep.control[a:z] == ACTIONS.index("silent")).all()
        assert not ep.user_speaking[a + 1 : z - 1].any()
    open_words = {h.split()[-1] for h in train_texts.HEADS}  # the words a pause's clause stops short on
    assert any(text.split()[-1] in open_words for _, _, text in ep.user_text)
    seed = 10  # build_cache's first episode is make_episode(seed * 1_000_003, ...)
    held_out = make_episode(seed * 1_000_003, 40, spk)
    assert held_out.pauses, f"episode {seed * 1_000_003} (40 micro-turns) has no pause scene any more: search again"
    build_cache(tmp_path, small_cfg(), seed=seed, episodes=1, ticks=40, log=lambda m: None)
    r = heldout_eval(client().net, EpisodeData(tmp_path, small_cfg()), 1, voice=False)
    assert r["pauses"] == len(held_out.pauses)
    assert 0.0 <= r["pause_taken_rate"] <= 1.0


def test_a_redirect_into_silence_is_answered_and_a_hand_off_says_it_is_looking(spk: Speaker) -> None:
    """A third of the barge-in scenes bring the "wait, ..." after a short reply has ended: nothing to stop,
    a reply after it. Most delegations say a holding phrase, and the found answer comes after it ends.
    Seeds 0 and 1 hold one of each (found by searching range(40), as the pause test's seed was)."""
    speak, delegate = ACTIONS.index("speak"), ACTIONS.index("delegate")
    ep = make_episode(0, 100, spk)
    (d,) = np.flatnonzero(ep.control == delegate).tolist()
    hold = next(seg for seg in ep.assistant if seg.start == d + 1)
    assert hold.text in train_texts.HOLDS and (ep.control[d + 1 : d + 1 + hold.ticks] == speak).all()
    found = next(seg for seg in ep.assistant if seg.start > d + 1)
    assert found.text.startswith(train_texts.FOUND) and found.start >= hold.start + hold.ticks + 2
    ep = make_episode(1, 100, spk)
    assert ep.scenes[0] == "barge_in", ep.scenes
    first, last, text = next(u for u in ep.user_text if u[2] in train_texts.BARGE_INS)
    assert not (ep.control[first : last + 1] == speak).any(), "the redirect came while the assistant talked"
    assert any(seg.start + seg.ticks <= first for seg in ep.assistant), "no reply had ended before the redirect"
    assert speak in ep.control[last + 2 : last + 4], f"no reply 0.2-0.6 s after {text!r}"


def test_most_questions_get_an_answer_of_several_phrases(spk: Speaker) -> None:
    """A question's answer is mostly two or three phrases, so the model is still talking when a listener's
    "mm-hm" or a "wait" comes (FD-bench v1.5's overlaps come 2-3 s after the question); a statement's
    is one. Scene by scene from seeded builders; every phrase is one of the set the talker can speak."""
    lengths = []
    for seed in range(6):
        b = _Builder(seed, 100, spk)
        scene_qa(b)
        (asked,), (reply,) = b.ep.user_text, b.ep.assistant
        said = [p for p in train_texts.REPLIES if p in reply.text]
        assert sum(map(len, said)) + len(said) - 1 == len(reply.text), f"not phrases of the set: {reply.text!r}"
        lengths.append((asked[2] in train_texts.STATEMENTS, len(said)))
    assert all(n == 1 for statement, n in lengths if statement), lengths
    assert any(n >= 2 for _, n in lengths) and any(n == 1 for statement, n in lengths if not statement), lengths


def test_hold_weight_counts_the_quiet_after_the_user_stops(cache: Path) -> None:
    """LossWeights.hold multiplies exactly the control rows labelled silent in the hold_ticks after user
    speech: with a uniform model (every logit zero) the weighted control loss stays log(actions) whatever
    the weights, and the rows it picks are the quiet ones right after the user spoke."""
    data = EpisodeData(cache, small_cfg())
    b = data.batch(list(range(data.episodes)))
    us = b.user_speaking.view(-1, b.n_ticks)
    c = b.control.view(-1, b.n_ticks)
    tc = client()
    out = tc.net.forward_batched(b.feats, b.n_ticks)
    zero = type(out)(**{**vars(out), "control": torch.zeros_like(out.control)})
    for hold in (1.0, 5.0):
        _, m = sft_loss(zero, b, tc.net.flow, LossWeights(hold=hold))
        assert abs(m["control"] - float(np.log(len(ACTIONS)))) < 1e-4
    # the rows: silent, user quiet, user speech within the 10 before
    picked = [(i, t) for i in range(c.shape[0]) for t in range(b.n_ticks)
              if c[i, t] == ACTIONS.index("silent") and us[i, t] == 0 and bool(us[i, max(0, t - 10) : t].any())]
    assert picked, "the tiny episodes have user speech followed by quiet"
    one_hot_wrong = torch.zeros_like(out.control)
    one_hot_wrong[:, ACTIONS.index("speak")] = 20.0  # confidently wrong wherever the label is silent
    wrong = type(out)(**{**vars(out), "control": one_hot_wrong})
    base = sft_loss(wrong, b, tc.net.flow, LossWeights(hold=1.0))[1]["control"]
    more = sft_loss(wrong, b, tc.net.flow, LossWeights(hold=5.0))[1]["control"]
    assert more > base  # silent rows (now wrong) weigh more


def test_loss_falls_on_tiny_episode_set(cache: Path) -> None:
    tc = client()
    data = EpisodeData(cache, small_cfg())
    before = evaluate(tc, data, 2)
    for _ in range(10):
        tc.forward_backward(data.next_batch(2))
        tc.optim_step(AdamParams(lr=3e-3))
    after = evaluate(tc, data, 2)
    assert after["loss"] < 0.8 * before["loss"], (before, after)
    assert after["control"] < before["control"], (before, after)


def test_save_load_resumes_bit_exactly(cache: Path, tmp_path: Path) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        a, data = client(), EpisodeData(cache, small_cfg(), seed=5)
        for _ in range(2):
            a.forward_backward(data.next_batch(1))
            a.optim_step(AdamParams())
        a.save_state(tmp_path / "s.pt", {"data_position": data.pos.as_dict()})
        for _ in range(2):
            a.forward_backward(data.next_batch(1))
            a.optim_step(AdamParams())
        b, data_b = client(), EpisodeData(cache, small_cfg(), seed=5)
        extra = b.load_state(tmp_path / "s.pt")
        data_b.pos = type(data_b.pos)(**extra["data_position"])
        for _ in range(2):
            b.forward_backward(data_b.next_batch(1))
            b.optim_step(AdamParams())
    finally:
        torch.use_deterministic_algorithms(False)
    assert b.step == a.step == 4
    for (name, pa), pb in zip(a.net.state_dict().items(), b.net.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), f"{name} differs after resume"


def test_lora_on_every_linear_layer(cache: Path) -> None:
    tc = client(lora_rank=4)
    wrapped = [m for m in tc.net.modules() if isinstance(m, LoRALin)]
    names = {n.rsplit(".", 1)[-1] for n, m in tc.net.named_modules() if isinstance(m, LoRALin)}
    assert {"wq", "wk", "wv", "wo", "w1", "w2", "w3", "control_head"} <= names  # attention, MLP, heads
    base = {n: p.detach().clone() for n, p in tc.net.named_parameters() if "lora_" not in n}
    data = EpisodeData(cache, small_cfg())
    for _ in range(2):
        tc.forward_backward(data.next_batch(1))
        tc.optim_step(AdamParams(lr=1e-2))
    for n, p in tc.net.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), f"{n} is frozen under LoRA but changed"
    assert any(float(m.lora_b.detach().abs().sum()) > 0 for m in wrapped)
    # merged weights serve the same function as the adapters
    b = data.batch([0])
    with torch.no_grad():
        tc.net.eval()
        wrapped_out = tc.forward(b).control
        merged = tc.serving_net()
        assert not any(isinstance(m, LoRALin) for m in merged.modules())
        torch.testing.assert_close(merged.forward_batched(b.feats, b.n_ticks).control, wrapped_out,
                                   rtol=1e-4, atol=1e-4)
    assert merge_lora(torch.nn.Sequential()) == 0
    with pytest.raises(ValueError, match="rank"):
        apply_lora(torch.nn.Linear(2, 2), 0)


async def test_sample_equals_server(duplex_server, tmp_path: Path) -> None:
    """What `sample` streams equals what the real server streams for the same inputs and weights."""
    tc = client()
    bias = tc.net.control_head.bias
    with torch.no_grad():
        bias.zero_()  # type: ignore[union-attr]
        bias[ACTIONS.index("speak")] = 5.0  # type: ignore[index]  # speak: the audio must be compared
    ckpt = tmp_path / "small.safetensors"
    tc.export(ckpt, {"command": "test"})
    server = duplex_server("--model", "native:tiny", "--checkpoint", str(ckpt), "--max-sessions", "2",
                           "--background", "none", env={"DUPLEX_TORCH_THREADS": "1", "DUPLEX_KV_BUDGET_MB": "64"})
    rng = np.random.default_rng(0)
    n = 5
    audio = (rng.standard_normal(n * 4800) * 0.1).astype(np.float32)
    ws, resume = await start_session(server.ws_url, pace="media")
    for k in range(n):
        chunk = float32_to_pcm16(audio[k * 4800 : (k + 1) * 4800])
        await send(ws, {"type": "input_audio_buffer.append", "audio": b64(chunk)})
    served = await collect_audio(ws, n, timeout=90)
    await ws.close()
    # The server hears PCM16: feed sample the same quantised samples.
    from streaming.pcm import pcm16_to_float32

    ticks = [TickInput(pcm16_to_float32(float32_to_pcm16(audio[k * 4800 : (k + 1) * 4800])), 4800) for k in range(n)]
    torch.set_num_threads(1)
    sampler = TrainingClient("tiny", checkpoint=str(ckpt), precision="fp32")
    outs = sampler.sample(ticks, session_id=resume["session_id"])
    assert any(o.audio.any() for o in outs), "the speaking model must produce audio"
    for k in range(n):
        assert float32_to_pcm16(outs[k].audio) == served[k], f"micro-turn {k} differs from the server's"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU-only machine gives")
def test_cuda_requested_without_gpu_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="use --device cpu"):
        TrainingClient("tiny", config=small_cfg(), device="cuda")


def test_policy_gradient_raises_rewarded_actions(cache: Path) -> None:
    """One REINFORCE step: a rewarded action becomes more likely, a punished one less."""
    from train.losses import policy_gradient_loss

    data = EpisodeData(cache, small_cfg())
    for sign in (1.0, -1.0):
        tc = client()
        b = data.batch([0])
        b.control = torch.full((b.rows,), ACTIONS.index("backchannel"))
        b.advantage = torch.full((b.rows,), sign)

        def logp(tc: TrainingClient = tc, b: Batch = b) -> float:
            with torch.no_grad():
                lp = torch.log_softmax(tc.forward(b).control[:, : len(ACTIONS)].float(), -1)
            return float(lp.gather(1, b.control[:, None]).mean())

        before = logp()
        tc.forward_backward(b, policy_gradient_loss)
        tc.optim_step(AdamParams(lr=1e-3))
        assert (logp() - before) * sign > 0


def test_rl_step_rolls_out_through_the_server_step(tmp_path: Path) -> None:
    """rl_step: a rollout through NativeModel.step, its features replayed by the batched path."""
    from train.rl import rl_step, timing_reward

    os.environ["DUPLEX_TTS_DETERMINISTIC"] = "1"
    build_cache(tmp_path, small_cfg(), seed=9, episodes=1, ticks=12, shard=1, keep_audio=True, log=lambda m: None)
    tc = client()
    data = EpisodeData(tmp_path, small_cfg())
    m = rl_step(tc, data, 0, AdamParams(lr=1e-3))
    assert -1.0 <= m["reward"] <= 2.0 and tc.step == 1
    assert timing_reward(torch.tensor([0, 1, 3]), torch.tensor([0, 0, 3])).tolist() == [1.0, -1.0, 2.0]


def test_some_episodes_have_digital_silence_on_the_mic(spk: Speaker) -> None:
    """Exact zeros (a muted or file-fed mic) must be in the data: the first shipped checkpoint never saw
    them and spoke into them. Seeds 0-7 draw the noise level from a fixed set that includes 0.0: they are
    built in turn until both kinds have been seen (each is ~1 s of TTS)."""
    zero_ticks: list[int] = []
    for seed in range(8):
        user = make_episode(seed, 30, spk).user.reshape(30, -1)
        zero_ticks.append(int((np.abs(user).max(axis=1) == 0).sum()))
        if any(zero_ticks) and not all(zero_ticks):
            break
    assert any(zero_ticks), f"no episode has a digitally silent micro-turn: {zero_ticks}"
    assert not all(zero_ticks), f"every episode is noiseless: {zero_ticks}"
