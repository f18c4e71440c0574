"""Seeded text bank for the synthetic set: small lists combined by a `random.Random`.

Kept as data so that a regenerated set with the same seed has the same texts and timings.
"""

import random

# Pause handling: an unfinished thought, a pause, then its end. The first half ends where a
# speaker naturally hesitates (a conjunction, a filler), so a listener should wait.
PAUSE_HEADS = [
    "I was thinking that maybe this weekend we could",
    "So the thing about my new job is that",
    "When I went to the store yesterday I noticed that",
    "The reason I called you today is because",
    "My sister told me that her neighbour",
    "I have been trying to figure out whether",
    "What I really want to know is",
    "Last summer we drove all the way to",
    "The best part of the whole trip was",
    "I am not sure if you remember but",
    "Before we start I wanted to say that",
    "One thing I keep forgetting is",
]
PAUSE_TAILS = [
    "go hiking up by the lake.",
    "everyone leaves at five on the dot.",
    "the prices had gone up again.",
    "I need some advice about my garden.",
    "bought a very old motorcycle.",
    "I should learn to play the piano.",
    "how long it takes to bake bread.",
    "the coast to see my grandparents.",
    "the little cafe near the harbour.",
    "we met at a concert years ago.",
    "I really appreciate your help.",
    "where I parked the car this morning.",
]

# Smooth turn-taking: a short lead-in then a question that hands the floor over.
TURN_LEADS = [
    "I have a quick question.",
    "So I was reading about this earlier.",
    "My friend and I were arguing about something.",
    "I am planning a small dinner party.",
    "I just got back from a long walk.",
    "Okay here is something I never understood.",
    "",
]
TURN_QUESTIONS = [
    "What is the best way to learn a new language?",
    "Do you think it will rain tomorrow afternoon?",
    "How long should I boil an egg for a soft yolk?",
    "Which is bigger, the moon or the planet Mercury?",
    "Can you recommend a good book about history?",
    "Why is the sky blue during the day?",
    "What should I cook for six people?",
    "How do airplanes stay up in the air?",
    "Is it better to run in the morning or in the evening?",
    "What is a good name for a small grey cat?",
]

# User interruption: a request that invites a long answer, then a redirect mid-answer.
INTERRUPT_CONTEXTS = [
    "Can you tell me about the history of the Roman Empire?",
    "Please explain how a car engine works.",
    "Tell me everything about planting tomatoes.",
    "Could you describe how the internet was invented?",
    "What can you tell me about the ocean and its animals?",
    "Explain to me how bread is made from start to finish.",
    "Tell me a long story about a dragon and a knight.",
    "How does the human heart pump blood around the body?",
]
INTERRUPT_TURNS = [
    "Wait, sorry, can you just tell me the short version?",
    "Actually stop, I would rather hear about something else.",
    "Hold on, how long does that usually take?",
    "Sorry to interrupt, but what about in winter?",
    "Wait wait, can you say that again more slowly?",
    "Okay stop, just give me one example please.",
    "Hang on, is that really true?",
]

# Backchannel: a narrative with short breaks where a listener would say "mm-hmm".
STORY_SENTENCES = [
    "So last week I finally went back to my home town.",
    "I had not been there for almost ten years.",
    "The old bakery on the corner is still open.",
    "The same woman runs it and she remembered my name.",
    "Then I walked down to the river where we used to swim.",
    "They built a new bridge there, a really tall one.",
    "My old school looks much smaller than I remember.",
    "I met a friend from first grade by complete accident.",
    "We talked for hours about our teachers.",
    "In the evening we had dinner at my aunt's house.",
    "She cooked the same soup she made when I was a kid.",
    "It was strange and lovely at the same time.",
    "On the way back the train was delayed for an hour.",
    "But honestly I did not mind at all.",
]

# v1.5 overlaps.
USER_BACKCHANNELS = ["Uh-huh.", "Yeah.", "Right.", "Okay.", "Mm-hmm, I see.", "Oh, really?", "Got it."]
SIDE_REMARKS = [
    "Hey, can you close the door please?",
    "Just put the bags on the table, thanks.",
    "Honey, dinner is almost ready.",
    "No, not now, I am on a call.",
    "Can you turn the music down a bit?",
]
BACKGROUND_LINES = [
    "And in other news, the city council met on Tuesday to discuss the new park.",
    "Tomorrow will be sunny with a light breeze from the west.",
    "The final score was three to one after a dramatic second half.",
    "Traffic on the main highway is moving slowly this evening.",
    "Stay tuned for more music after this short break.",
]


def pause_text(rng: random.Random) -> tuple[str, str]:
    return rng.choice(PAUSE_HEADS), rng.choice(PAUSE_TAILS)


def turn_text(rng: random.Random) -> tuple[str, str]:
    return rng.choice(TURN_LEADS), rng.choice(TURN_QUESTIONS)


def interrupt_text(rng: random.Random) -> tuple[str, str]:
    return rng.choice(INTERRUPT_CONTEXTS), rng.choice(INTERRUPT_TURNS)


def story(rng: random.Random, sentences: int) -> list[str]:
    start = rng.randrange(len(STORY_SENTENCES))
    return [STORY_SENTENCES[(start + i) % len(STORY_SENTENCES)] for i in range(sentences)]
