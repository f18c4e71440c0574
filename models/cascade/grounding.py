"""Answers about what is seen, held to what perception saw.

A question about the picture or the camera ("what does the card say?", "how many fingers am I holding
up?", "is anyone there?") goes to the reasoner with the facts and an instruction to answer from them
(`INSTRUCTION`, after the facts line). A small reasoner still rewrites them: half the text, a made-up
object, a count that is not the detector's. So its answer to such a question is held until it is whole
and checked here before it is said: an answer that names a number the facts do not have, leaves out
text it was asked to read, says someone is there when nobody is (or the reverse), or uses a word that
is neither in the facts, the question nor the plain words any answer is made of, is not said; the facts
are said instead (`fallback`). Pure text rules, no model: it holds for every reasoner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INSTRUCTION = ("If the user asks about what is seen, answer from these facts only: quote text exactly as "
               "written and give counts and gestures as stated; say nothing the facts do not say.")

NUMBER_WORDS = {"zero": 0, "no": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
                "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
                "thirty": 30, "forty": 40, "fifty": 50}
GESTURE_WORDS = {"open_palm": ("open", "palm", "hand", "stop"), "raised_hand": ("raised", "raising", "hand", "up"),
                 "thumbs_up": ("thumbs", "thumb", "up"), "pointing": ("pointing", "point", "finger"),
                 "victory": ("victory", "peace", "sign", "v"), "fist": ("fist", "closed", "hand")}
# How an answer names each gesture: naming one the detectors did not give contradicts them.
GESTURE_NAMES = {"open_palm": ("open palm", "open hand"), "raised_hand": ("raised hand", "raising your hand"),
                 "thumbs_up": ("thumbs up", "thumb up"), "pointing": ("pointing",),
                 "victory": ("victory", "peace sign"), "fist": ("fist",)}
NEGATIVE = frozenset(["no", "nobody", "noone", "not", "don't", "can't", "cannot", "isn't", "aren't", "nothing",
                      "empty", "none"])
AFFIRM = frozenset(["yes", "yeah", "you", "you're", "person", "people", "someone", "somebody", "man", "woman"])
# Words any plain answer about a picture is made of; a word outside these, the facts and the question
# is something the reasoner added.
_PLAIN_WORDS = """
a an the it it's its this that these those there there's here is are was were be being been am i i'm me my
mine you you're your yours we he she they them their his her what which who whom how many much so some any
and or but of to in on at by for from with as up down out over about into just only also yes yeah sure okay
ok well oh hmm right now currently still both each all can could do does did see seen sees saw look looks
looking appear appears appeared seems shows show showing shown has have having hold holds holding held
raise raised raising read reads reading readable written writes says say said text word words letters
letter line lines card sign note paper page label picture photo photograph image camera view frame front
person people someone somebody anyone anybody everyone nobody face faces hand hands finger fingers thumb
thumbs gesture gestures making make made doing clearly exactly simply total altogether visible
think believe there're that's what's it'll i'll i'd you've count counted counting
"""
PLAIN = frozenset(_PLAIN_WORDS.split())


def words(text: str) -> list[str]:
    """Lower-case words and numbers ("4:15" is 4 and 15), apostrophes kept inside words."""
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    return [w.strip("'") for w in re.findall(r"[a-z0-9']+", text) if w.strip("'")]


def numbers(ws: list[str]) -> set[int]:
    out = set()
    for w in ws:
        if w.isdigit():
            out.add(int(w))
        elif w in NUMBER_WORDS and w != "no":
            out.add(NUMBER_WORDS[w])
    return out


def kind_of(question: str) -> str | None:
    """What a question asks of the picture: "read", "count", "presence", "gesture", "look"; None when it
    is not about what is seen."""
    q = " ".join(words(question))
    if re.search(r"\bhow many (fingers|people|persons|faces|hands)\b|\bfingers?\b", q):
        return "count"
    if re.search(r"\b(is|are) (any|some)(one|body) (there|here|in view|in the picture|on camera|in front)\b"
                 r"|\bcan you see (me|anyone|anybody|someone|somebody)\b|\bwho is there\b|\bam i (there|in view)\b", q):
        return "presence"
    if re.search(r"\b(say|says|saying|read|reads|written|writing)\b", q) and re.search(
            r"\b(card|sign|this|it|that|paper|page|note|label|picture|photo|image|holding|written|text|camera)\b", q):
        return "read"
    if re.search(r"\bwhat (gesture|sign)\b|\bthumbs?\b|\bwhat am i (holding|showing|doing|making)\b", q):
        return "gesture"
    if re.search(r"\bwhat (do|can) you see\b|\bwhat('s| is) (in|on) (the |this |my )?(picture|photo|image|camera)\b"
                 r"|\blook at (this|me|my)\b", q):
        return "look"
    return None


@dataclass(frozen=True)
class Facts:
    """What perception said, as the question was asked: the camera now and the pictures kept."""

    present: bool
    people: int
    gesture: str | None
    fingers: int | None
    texts: tuple[str, ...]  # text in view now (or in the newest picture when the camera shows none)
    line: str  # the facts line the reasoner got

    def numbers(self) -> set[int]:
        got = numbers(words(" ".join(self.texts)))
        if self.fingers is not None:
            got.add(self.fingers)
        if self.present:
            got.add(max(1, self.people))
        return got


@dataclass(frozen=True)
class Verdict:
    ok: bool
    why: str  # "" when ok: what the answer got wrong


def check(question: str, answer: str, facts: Facts) -> Verdict:
    """Whether `answer` to `question` says only what `facts` say (and, asked to read or count, says it)."""
    kind = kind_of(question)
    if kind is None:
        return Verdict(True, "")
    said = words(answer)
    if not said:
        return Verdict(False, "empty")
    fact_words = set(words(facts.line)) | set(words(" ".join(facts.texts)))
    if facts.gesture:
        fact_words |= set(GESTURE_WORDS.get(facts.gesture, ()))
    extra = numbers(said) - facts.numbers()
    if extra:
        return Verdict(False, f"number not in the facts: {sorted(extra)}")
    allowed = PLAIN | NEGATIVE | fact_words | set(words(question)) | set(NUMBER_WORDS) | {"doesn't", "there's"}
    added = [w for w in said if w not in allowed]
    if added:
        return Verdict(False, f"words not in the facts: {added[:5]}")
    named = [g for g, names in GESTURE_NAMES.items() if g != facts.gesture
             and any(re.search(rf"\b{n}\b", " ".join(said)) for n in names)]
    if named:
        return Verdict(False, f"a gesture the detectors did not give: {named}")
    if kind == "read":
        text = words(" ".join(facts.texts))
        if not text:
            return Verdict(False, "no text in view") if not NEGATIVE & set(said) else Verdict(True, "")
        if NEGATIVE & set(said):
            return Verdict(False, "says the text is not there")
        missing = [w for w in text if w not in said and not _same_number(w, said)]
        if missing:
            return Verdict(False, f"text left out: {missing[:5]}")
    if kind == "count" and facts.fingers is not None and facts.fingers not in numbers(said):
        return Verdict(False, "the count is not said")
    if kind == "presence" and facts.present == bool(NEGATIVE & set(said)):
        return Verdict(False, "contradicts who is there")
    if kind == "presence" and facts.present and not AFFIRM & set(said):
        return Verdict(False, "does not say who is there")  # "I'm here": the assistant, not what is seen
    return Verdict(True, "")


def _same_number(w: str, said: list[str]) -> bool:
    return w.isdigit() and int(w) in numbers(said)


def fallback(question: str, facts: Facts) -> str:
    """The facts as a short spoken answer to `question`."""
    kind = kind_of(question)
    text = f'"{", ".join(facts.texts)}"' if facts.texts else ""
    hand = _hand(facts)
    if kind == "read":
        return f"It says {text}." if text else "I can't read any text in view."
    if kind == "count":
        if facts.fingers is None:
            return "I don't see a hand."
        return f"You're holding up {facts.fingers} finger{'s' if facts.fingers != 1 else ''}."
    if kind == "presence":
        if not facts.present:
            return "Nobody is in view."
        return "Yes, one person is in view." if facts.people <= 1 else f"Yes, {facts.people} people are in view."
    if kind == "gesture":
        return hand or (f"You're holding up text that says {text}." if text else "I don't see a gesture.")
    parts = ["a person" if facts.present else "nobody"]
    parts += [hand.rstrip(".").replace("You're making ", "")] if hand else []
    parts += [f"text that says {text}"] if text else []
    return "I see " + ", ".join(parts) + "."


def _hand(facts: Facts) -> str:
    if facts.gesture:
        name = facts.gesture.replace("_", " ")
        return f"You're making {'an' if name[0] in 'aeiou' else 'a'} {name}."
    if facts.fingers is not None:
        return f"You're holding up {facts.fingers} finger{'s' if facts.fingers != 1 else ''}."
    return ""
