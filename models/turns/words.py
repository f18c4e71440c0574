"""The words' verdict on a turn: transcript completeness and a listener's backchannel words and phrases.

pocketsphinx gives lower-case words without punctuation, so "does this transcript look finished?" is
judged from its last word: a turn that ends on an article, preposition, conjunction, auxiliary or
filler is almost certainly mid-sentence ("what is the weather in ..."), so the policy waits for the
longer `eot_max_silence_ms` before taking the floor.
"""

from __future__ import annotations

import re


def wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Last words after which an English utterance is very unlikely to be finished. Subject pronouns only:
# object pronouns end sentences all the time ("Thank you." "Can you help me?" "I love it.").
INCOMPLETE_END = wordset(
    """
    a an the this that these those my your his her its our their some any every each no
    and or but so because if when while than then as though although unless until whether
    of to in on at by for with from into onto about over under between through after before
    during without within against toward towards like
    is are was were be been being am do does did have has had can could will would shall should
    may might must
    i he she we they
    um uh er ah hmm mm well also just very really more most less
    what which who whom whose where how why
    """
)

# Words a listener says without taking the floor.
BACKCHANNEL_WORDS = wordset(
    """
    mm hmm hm mhm mmm mm-hmm mm-hm uh-huh uh-oh huh uh um yeah yes yep yup ok okay right sure ah oh aha
    wow cool nice great alright really true totally exactly indeed gotcha definitely absolutely
    interesting awesome amazing perfect wonderful
    """
)

# A hum, however Whisper spells it ("mmm", "MmMmM", "mm-mm", "hmm-mm", "mhmm"): letters m and h only, at
# least one m. Said over a speaker it is a listener's, yes or no; the list above cannot hold every spelling
# (on the synthetic "Mm-hmm, I see." of the FD-bench generator Whisper tiny.en wrote "MmMmM" and "Mm-mm.").
_HUM = re.compile(r"[mh]*m[mh]*(?:-[mh]*m[mh]*)*")


def backchannel_word(word: str) -> bool:
    """A word a listener says without taking the floor (`word`: lower case, no punctuation but ' and -)."""
    return word in BACKCHANNEL_WORDS or _HUM.fullmatch(word) is not None


def looks_complete(transcript: str) -> bool:
    """True when the transcript does not end on a word that needs a continuation."""
    words = transcript.lower().split()
    return bool(words) and words[-1] not in INCOMPLETE_END


FINISHED, UNCLEAR, UNFINISHED = "finished", "unclear", "unfinished"
# The text model's P(finished) under which the words need a continuation, and at or above which they may
# end whatever their last word (the cascade's `text_open` and `text_done` default to these).
TEXT_OPEN = 0.02
TEXT_DONE = 0.2


def verdict(
    raw: str,
    p_text: float | None = None,
    text_open: float = TEXT_OPEN,
    text_done: float = TEXT_DONE,
) -> str:
    """What a punctuated transcript (Whisper's) says of the turn it heard:
    FINISHED: a sentence ends on a word that can end one ("... in Paris?");
    UNFINISHED: it trails off ("...") or ends on a word that needs a continuation ("... we could.");
    UNCLEAR: neither (no closing punctuation after a word that can end a sentence, or no words).

    `p_text`, the text model's P(the words are a finished message) (models.speech.text_turn), when
    known, judges the words instead of the last-word list whenever it is sure: under `text_open` they
    are cut short ("... that her neighbour."), at `text_done` or above they can end ("... to me?");
    in between, and for a trailing "...", the rules above stand."""
    raw = raw.strip()
    if raw.endswith(("..", "\u2026")):
        return UNFINISHED
    words = re.sub(r"[^\w\s'-]", " ", raw).split()
    if not words:
        return UNCLEAR
    if p_text is not None and p_text < text_open:
        return UNFINISHED
    if (p_text is None or p_text < text_done) and not looks_complete(" ".join(words)):
        return UNFINISHED
    return FINISHED if raw[-1] in ".?!" else UNCLEAR


def sentence_finished(raw: str) -> bool:
    """A punctuated transcript (Whisper's) that ends a sentence: ".", "?" or "!" after a word that
    does not need a continuation ("... we could." is not finished; "..." never is)."""
    return verdict(raw) == FINISHED


# Short phrases a listener says without taking the floor ("Mm-hmm, I see."): removed before the
# word test, so their words ("see", "got") do not count as backchannel words anywhere else.
BACKCHANNEL_PHRASES = (
    "i see", "got it", "i know", "makes sense", "that makes sense", "that's right", "of course", "no way",
    "fair enough", "sounds good", "oh my god", "oh my gosh", "oh no", "me too", "i agree", "good point",
    "that's true", "that's interesting", "it's interesting", "how interesting", "that's great",
    "that's cool",
)
_LONGEST_FIRST = sorted(BACKCHANNEL_PHRASES, key=len, reverse=True)
_LEADS = frozenset({"it's", "that's"})


# Backchannel words that also open a turn ("okay, stop", "yeah, but", "oh wait", "right, and"): alone
# they say nothing about what follows.
OPENERS = wordset("yeah yes yep yup ok okay right sure alright oh ah uh um huh")


def _backchannel_parts(transcript: str) -> tuple[list[str], int]:
    """(the transcript's words once backchannel phrases are removed, how many phrases were removed)."""
    text = " " + " ".join(re.sub(r"[^\w\s'-]", " ", transcript.lower()).split()) + " "
    text = text.replace(" all right ", " alright ")  # Whisper spells it both ways
    phrases = 0
    for phrase in _LONGEST_FIRST:  # "that makes sense" before "makes sense"
        phrases += text.count(f" {phrase} ")
        text = text.replace(f" {phrase} ", " ")
    words = text.split()
    # "That's ..." / "it's ..." before a backchannel ("that's all right", "it's okay"); Whisper tiny
    # also puts them before a short clip that never said them ("really?" read "it's really").
    if len(words) > 1 and words[0] in _LEADS:
        words = words[1:]
    return words, phrases


def only_backchannel(transcript: str) -> bool:
    """True for an empty transcript or one made only of backchannel words and phrases."""
    words, _ = _backchannel_parts(transcript)
    return all(backchannel_word(w) for w in words)


def clearly_backchannel(transcript: str) -> bool:
    """Only backchannel words and phrases, and at least one that does not also open a turn: "mm-hm",
    "oh, really?", "uh-huh, yeah", "I see" are; "okay", "yeah", "oh" (or nothing) are not."""
    words, phrases = _backchannel_parts(transcript)
    return all(backchannel_word(w) for w in words) and (phrases > 0 or any(w not in OPENERS for w in words))
