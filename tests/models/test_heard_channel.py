"""The heard-words channel (models/interaction/heard.py): its rules, and the model reading it.

The rules are shared by training (train/features.py: heard_stream) and serving (listener.py), so they
are tested once here; the model's side is tested like the rest of the core (test_interaction_core.py):
the streaming step equals the teacher-forced sequence, and a checkpoint given the channel does exactly
what it did without it until it is trained.
"""

import pytest
import torch

from models.interaction.checkpoint import add_heard_channel
from models.interaction.config import BYTE_VOCAB, NO_BYTE
from models.interaction.heard import LastWord, WordCommitter, words_of
from models.interaction.model import TickFeatures
from tests.models.test_interaction_core import N_TICKS, as_tuple, random_features, small_cfg, small_net, stream


def test_words_are_what_pocketsphinx_writes() -> None:
    want = ["well", "i'm", "going", "to", "the", "store", "because"]
    assert words_of("Well, I'm going to the store, because-") == want
    assert words_of("  2 plus 2? ''") == ["plus"]


def test_a_word_is_committed_once_followed_or_held() -> None:
    c = WordCommitter()
    assert c.update("i went") == ["i"]  # "went" may still change
    assert c.update("i want to") == ["want"]  # revised, but now followed: final; "to" is last
    assert c.update("i want to") == ["to"]  # held for two collections: final
    assert c.update("i want to go") == []
    assert c.update("i want to go because") == ["go"]
    assert c.finish("i want to go because") == ["because"]  # the utterance ended: the rest
    assert c.update("hello") == []  # a new utterance starts from its first word


def test_a_committed_word_is_never_taken_back() -> None:
    c = WordCommitter()
    assert c.update("the cat sat") == ["the", "cat"]
    assert c.update("a cat sat down") == ["sat"]  # "the" -> "a" after the model read it: ignored


def test_a_flush_commits_the_partial_once_and_the_utterance_goes_on() -> None:
    c = WordCommitter()
    assert c.update("so i went") == ["so", "i"]
    assert c.flush("so i went") == ["went"]  # the user stopped: the rest of the partial, now
    assert c.update("so i went") == []  # not again
    assert c.update("so i went home") == []  # the utterance goes on: "home" is the last word
    assert c.finish("so i went home") == ["home"]


def test_the_channel_holds_the_last_word_first_bytes() -> None:
    w = LastWord(4)
    assert w.take() == [NO_BYTE] * 4
    w.push(["so", "because"])
    assert bytes(w.take()) == b"beca"
    w.push([])
    assert bytes(w.take()) == b"beca"  # held through a pause
    w.push(["so"])
    assert w.take() == [ord("s"), ord("o"), NO_BYTE, NO_BYTE]


def _with_heard(feats: TickFeatures, seed: int) -> TickFeatures:
    g = torch.Generator().manual_seed(seed)
    n = feats.user_dmel.shape[0]
    return TickFeatures(**{**vars(feats), "heard": torch.randint(0, BYTE_VOCAB, (n, 4), generator=g)})


@torch.inference_mode()
def test_reading_heard_words_streams_exactly_as_taught() -> None:
    net = small_net(small_cfg(heard_tokens=4), seed=3)
    assert net.heard is not None and bool((net.heard.weight[NO_BYTE] == 0).all())
    net.set_deterministic(True)
    feats = _with_heard(random_features(net.cfg, N_TICKS), 1)
    for a, b in zip(as_tuple(stream(net, feats)), as_tuple(net.forward_sequence(feats)), strict=True):
        assert torch.equal(a, b)
    batched = net.forward_batched(TickFeatures.cat([feats, feats]), N_TICKS)
    torch.testing.assert_close(batched.control[:N_TICKS], net.forward_sequence(feats).control, rtol=1e-4, atol=1e-5)
    # The words change what it does (the channel is read at all).
    other = _with_heard(random_features(net.cfg, N_TICKS), 2)
    assert not torch.allclose(net.forward_sequence(other).control, net.forward_sequence(feats).control)


@torch.inference_mode()
def test_a_checkpoint_given_the_channel_does_what_it_did() -> None:
    old = small_net(seed=4)
    new = add_heard_channel(old, 4).eval()
    assert new.cfg.heard_tokens == 4 and old.cfg.heard_tokens == 0
    feats = random_features(old.cfg, N_TICKS, seed=5)
    before = old.forward_sequence(feats)
    after = new.forward_sequence(_with_heard(feats, 6))
    for a, b in zip(as_tuple(before), as_tuple(after), strict=True):
        assert torch.equal(a, b)


def test_bad_heard_settings_and_inputs_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="heard_tokens"):
        small_cfg(heard_tokens=5)  # more bytes than user-audio slots to add them onto
    net = small_net(small_cfg(heard_tokens=4))
    with pytest.raises(ValueError, match=r"give TickFeatures\.heard"):
        net.forward_sequence(random_features(net.cfg, 2))  # a checkpoint that reads words, given none
    with pytest.raises(ValueError, match="already reads"):
        add_heard_channel(net, 2)
