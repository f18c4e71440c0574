"""Text heuristics of the turn-taking policy: transcript completeness, backchannel words, sentences.

pocketsphinx gives lower-case words without punctuation, so "does this transcript look finished?" is
judged from its last word: a turn that ends on an article, preposition, conjunction, auxiliary or
filler is almost certainly mid-sentence ("what is the weather in ..."), so the policy waits for the
longer `eot_max_silence_ms` before taking the floor.
"""

from __future__ import annotations

import re

from models.cascade.options import CascadeOptions


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Last words after which an English utterance is very unlikely to be finished. Subject pronouns only:
# object pronouns end sentences all the time ("Thank you." "Can you help me?" "I love it.").
_INCOMPLETE_END = _wordset(
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
BACKCHANNEL_WORDS = _wordset(
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
    return bool(words) and words[-1] not in _INCOMPLETE_END


FINISHED, UNCLEAR, UNFINISHED = "finished", "unclear", "unfinished"


def verdict(
    raw: str,
    p_text: float | None = None,
    text_open: float = CascadeOptions.text_open,
    text_done: float = CascadeOptions.text_done,
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
OPENERS = _wordset("yeah yes yep yup ok okay right sure alright oh ah uh um huh")


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


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


_SENTENCE_END = re.compile(r"[.!?](?:[\"')\]]*)\s")
_CLAUSE_END = re.compile(r"[,;:]\s")
_COMPLETE_WORD = re.compile(r"\S+\s+")
# Words that open a phrase of their own (conjunctions, prepositions, relative words): a sentence has a
# prosodic break before them, so an answer's first piece may end there without sounding cut.
_PHRASE_START = _wordset(
    """
    and or but so because if when while as though although unless until whether which who whose where
    that to with by for from in on at into onto about over under between through after before during
    without within like than
    """
)


class SentenceSplitter:
    """Accumulates streamed text deltas and releases whole sentences as soon as they end.

    A long clause (`max_words` or more before a comma) is released early too, so the first audio of
    a long first sentence does not wait for its full stop. A run of more than `hard_words` words with
    neither is cut after `hard_words`, at a word boundary: Piper's memory grows with a phrase's length
    (measured: +155 MB for 20 words, +470 MB for 80, +1,150 MB for 160) and a small reasoner does
    write run-on sentences (the conversational cascade soak's RSS spiked by up to 700 MB). Text with no
    space at all ("1.1.1.1." from a looping reasoner) is cut every `hard_chars` characters: it has no
    word boundary, so it was held until the answer ended (nothing said in time) and then synthesised
    as one unbounded phrase.

    The answer's *first* piece is released sooner still (`first_words`): at a comma after 3 words, at a
    phrase break after `first_words // 2` words (a word that can end a phrase, before one that opens the
    next: "The human heart pumps blood | through its ..."), and at a word boundary after `first_words`.
    Its audio is what the user waits for: with six sessions asking at once, the reasoner wrote a first
    sentence 1.6 s p50 after its first word, and its first audio came 1.2 s p50 after that (a synthesis
    budget that grows with its length, and Piper late past it on a busy machine). With the early first
    piece, question -> first audio went from 3.4 to 1.6-1.8 s p50 (bench.answer_lag, 6 sessions). The
    pieces after it are spoken while the rest is written, so they keep the whole-sentence rules.
    """

    def __init__(self, max_words: int = 12, hard_words: int = 20, hard_chars: int = 160,
                 first_words: int = 10) -> None:
        if not 1 <= max_words <= hard_words:
            raise ValueError(f"need 1 <= max_words <= hard_words, got {max_words} and {hard_words}")
        if hard_chars < 20:
            raise ValueError(f"hard_chars must be at least 20, got {hard_chars}")
        if not 0 <= first_words <= hard_words:
            raise ValueError(f"need 0 <= first_words <= hard_words (0 = no early first piece), got {first_words}")
        self.buf = ""
        self.max_words = max_words
        self.hard_words = hard_words
        self.hard_chars = hard_chars
        self.first_words = first_words
        self.first_out = False  # the answer's first piece has been released

    def push(self, delta: str) -> list[str]:
        self.buf += delta
        out = []
        while True:
            m = _SENTENCE_END.search(self.buf)
            end = m.end() if m is not None else None
            if end is None and not self.first_out and self.first_words:
                end = self._first_end()
            if end is None:
                m = _CLAUSE_END.search(self.buf)
                if m is not None and len(self.buf[: m.end()].split()) >= self.max_words:
                    end = m.end()
            if end is None or len(self.buf[:end].split()) > self.hard_words:
                end = self._run_end()
            if (len(self.buf) if end is None else end) > self.hard_chars:
                end = self._char_end()
            if end is None:
                break
            piece, self.buf = self.buf[:end].strip(), self.buf[end:]
            if piece:
                out.append(piece)
                self.first_out = True
        return out

    def _first_end(self) -> int | None:
        """Where the answer's first piece may end before its sentence does (class docstring), if yet."""
        m = _CLAUSE_END.search(self.buf)
        if m is not None and len(self.buf[: m.end()].split()) >= min(3, self.first_words):
            return m.end()
        words = list(_COMPLETE_WORD.finditer(self.buf))
        bare = [re.sub(r"[^\w'-]", "", w.group().lower()) for w in words]
        shortest = max(1, self.first_words // 2)
        for i in range(shortest, len(words)):  # words[:i] would be the piece, words[i] opens the next
            if bare[i] in _PHRASE_START and bare[i - 1] not in _INCOMPLETE_END:
                return words[i - 1].end()
        if len(words) > self.first_words:  # no break yet: cut at a word that can end a phrase, if any
            i = self.first_words
            while i > shortest and bare[i - 1] in _INCOMPLETE_END:
                i -= 1
            return words[i - 1].end()
        return None

    def _run_end(self) -> int | None:
        """Where the first `hard_words` complete words (each followed by a space) end, if more follow."""
        words = list(_COMPLETE_WORD.finditer(self.buf))
        return words[self.hard_words - 1].end() if len(words) > self.hard_words else None

    def _char_end(self) -> int:
        """Where a piece of at most `hard_chars` characters ends: at its last space, else mid-run."""
        space = self.buf.rfind(" ", 0, self.hard_chars + 1)
        return space + 1 if space > 0 else self.hard_chars

    def flush(self) -> list[str]:
        # push never leaves more than hard_chars in the buffer, so only the word bound applies here.
        words, self.buf = self.buf.split(), ""
        return [" ".join(words[i : i + self.hard_words]) for i in range(0, len(words), self.hard_words)]
