"""Text the cascade's answers are spoken in: sentences released from streamed text as soon as they end."""

from __future__ import annotations

import re

from models.turns.words import INCOMPLETE_END, wordset


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


_SENTENCE_END = re.compile(r"[.!?](?:[\"')\]]*)\s")
_CLAUSE_END = re.compile(r"[,;:]\s")
_COMPLETE_WORD = re.compile(r"\S+\s+")
# Words that open a phrase of their own (conjunctions, prepositions, relative words): a sentence has a
# prosodic break before them, so an answer's first piece may end there without sounding cut.
_PHRASE_START = wordset(
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
            if bare[i] in _PHRASE_START and bare[i - 1] not in INCOMPLETE_END:
                return words[i - 1].end()
        if len(words) > self.first_words:  # no break yet: cut at a word that can end a phrase, if any
            i = self.first_words
            while i > shortest and bare[i - 1] in INCOMPLETE_END:
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
