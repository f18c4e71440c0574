"""Text bank for the training episodes: disjoint from bench/fdbench/_texts.py (a test checks it).

The assistant speaks only a closed set of phrases (REPLIES, BACKCHANNELS, FOUND): a ~10 M parameter
model trained for an hour on two CPU cores can learn to say a few dozen phrases in Piper joe's voice,
not open text. The user side is varied: the model must learn *when* to speak, from words and silence.
"""

from models.interaction.phrases import TRAINED_ANSWER_LEAD, TRAINED_REPLIES

# What the assistant says when it takes the floor (the closed phrase set; the voice is judged on it). The
# serving side decodes within the same set (models/interaction/phrases.py), so it is defined there once.
REPLIES = list(TRAINED_REPLIES)
# Short acknowledgements while the user holds the floor.
BACKCHANNELS = ["Mm-hm.", "Yeah.", "Right.", "Okay.", "I see."]
# Said before reading out a background result.
FOUND = TRAINED_ANSWER_LEAD

# User: questions and requests that hand the floor over.
QUESTIONS = [
    "Can you help me plan a picnic?",
    "What do you think about painting the kitchen yellow?",
    "Should I take the bus or ride my bike today?",
    "Is it a good idea to plant roses in the spring?",
    "How do I make my coffee taste less bitter?",
    "Could you give me a tip for sleeping better?",
    "What would you bring on a camping trip?",
    "Do you like the sound of rain on the roof?",
    "Would you recommend learning the guitar or the drums?",
    "Can you remind me why we water plants in the evening?",
    "Is a walk after dinner good for you?",
    "What is a nice present for my brother?",
    "How should I start writing a short story?",
    "Do you know a simple recipe for pancakes?",
    "Could you tell me how to fold a paper boat?",
    "Which colour should I pick for the new sofa?",
    # Questions of fact and how-to that still want a plain reply, not a look-up: a question word alone
    # ("what", "how", "which") must not mean "ask the reasoner" (the first checkpoint with 4 look-ups
    # delegated in 39 of 70 benchmark samples).
    "What is your favourite season of the year?",
    "How many cups of tea is too many?",
    "Which is nicer, a quiet beach or a busy city?",
    "What do people usually eat for breakfast?",
    "How do you keep a room cool in summer?",
    "Why do cats like sitting in boxes?",
    "What game could we play on a long drive?",
    "How can I stop losing my keys?",
    "Is it rude to leave a party early?",
    "What should I say in a thank you card?",
    "Where would you hang a big mirror?",
    "When is the best time to call an old friend?",
    "How do I tell my boss I need a day off?",
    "What makes a good cup of hot chocolate?",
    "Why does bread go stale so fast?",
    "Which shoes are best for a long walk?",
    # Requests said as commands want a reply as much as questions do ("Tell me...", "Explain..."): with
    # only questions here the model answered few of the benchmark's requests, and "Please ..." was
    # heard only in look-ups, which it must delegate. None asks to look up, find out, check or search.
    "Tell me a fun fact about owls.",
    "Explain why the sky turns red at sunset.",
    "Describe a perfect lazy Sunday.",
    "Give me an idea for a quick lunch.",
    "Talk me through making a cup of tea.",
    "Please suggest a name for my new puppy.",
    "Help me choose a book for the holiday.",
    "Tell me something that will cheer me up.",
    "Explain how a bicycle stays upright.",
    "Please describe how you would decorate a small flat.",
    "Give me three words that rhyme with light.",
    "Walk me through planting a small herb garden.",
    "Teach me a simple card trick.",
    "Tell me a short joke about penguins.",
    "Explain the rules of noughts and crosses.",
    "Please recommend a board game for four people.",
    "Suggest something fun to do on a rainy day.",
    "Tell me how to keep basil alive on a windowsill.",
    "Describe the view from the top of a hill.",
    "Give me a reason to get up early tomorrow.",
]
LEADS = [
    "Hi there.",
    "Hello, good evening.",
    "I have been wondering about something.",
    "Okay, next thing.",
    "Listen to this.",
    "So here is my situation.",
    "",
    "",
]
# User: unfinished clauses (ends on a word that promises more) and their continuations.
HEADS = [
    "Yesterday my neighbour and I decided to",
    "The problem with my old laptop is that",
    "I called my mother this morning because",
    "If the train is late again then",
    "What bothers me about the new office is",
    "We were going to paint the fence but",
    "After the meeting I realised that",
    "My plan for the holidays is to",
    "The funny thing about my dog is that",
    "I would love to visit the mountains and",
]
TAILS = [
    "clean out the whole garage together.",
    "the battery dies after an hour.",
    "she forgot her keys at my place.",
    "I will just walk to work instead.",
    "there are no windows at all.",
    "it started raining all afternoon.",
    "nobody had read the report.",
    "stay at home and read a lot.",
    "he is afraid of small birds.",
    "maybe swim in a cold lake.",
]
# Unfinished clauses built from parts, so the cue is the last word ("... because") and not a memorised
# sentence: 10 heads let the first trained model take the floor in pauses after heads it had never
# heard. The same clauses said as finished statements (STATEMENTS) get a reply, so the clause alone
# is no reason to wait.
_CLAUSES = [
    "I stayed up late last night",
    "My sister moved into a new flat",
    "We cancelled the picnic on Sunday",
    "The bus was full this morning",
    "I started learning the piano",
    "Our kitchen tap keeps dripping",
    "My brother lent me his bike",
    "The bakery closed early today",
    "I finally finished that long book",
    "We planted tomatoes in the garden",
    "My phone fell into the sink",
    "The neighbours had a party",
    "I forgot to water the plants",
    "Our team lost the final game",
    "I bought a second hand camera",
    "The printer at work broke down",
    "My friend is visiting next week",
    "We painted the bedroom green",
    "I walked home through the park",
    "The heating stopped working",
    "My aunt sent me a letter",
    "I skipped breakfast again",
    "The museum was very crowded",
    "We booked a cabin by the lake",
]
_CONNECTIVES = ["because", "and", "but", "so", "although", "when", "until", "since", "while", "and then",
                "which means that", "so that"]
HEADS += [f"{c} {k}" for c in _CLAUSES for k in _CONNECTIVES]
# A clause stops short on more than a connective: a modal, an article, a preposition, a wh-word or an
# auxiliary promises more just as well ("... and I could", "... because of the", "... I wonder
# whether"). With connectives only, the last word of a pause unlike them ("could", "whether", "was")
# was one the model had never read, and it took the floor. Each trail also ends a finished statement
# below with a content word, so what the trail starts with is no cue, only where it ends.
_TRAILS = ["and I could", "so we might", "because of the", "and my", "but I was", "and it is",
           "so I wonder if", "and I am not sure whether", "and the best part was", "but I think that",
           "and now I have to", "together with my", "and we should", "so I will", "and then the",
           "but what I", "and I really want to", "which is why I", "and I was about to", "so the",
           "and that is when", "because we can", "and I have been", "so I told them about",
           "but it would", "and a", "for the", "and I did not know how", "and they", "since the"]
_FINISHED = ["and I could not sleep", "so we might go later", "and my feet hurt", "but I was fine",
             "and it is still raining", "so I will call tomorrow", "and I have been busy", "but it would cost too much",
             "and then the lights went out", "and they were happy"]
HEADS += [f"{c} {t}" for c in _CLAUSES for t in _TRAILS]
STATEMENTS = [f"{c}." for c in _CLAUSES] + [f"{c} {e}." for c in _CLAUSES for e in _FINISHED]
# User: a longer telling, sentence by sentence (the assistant backchannels at the breaks).
STORY = [
    "My cousin bought an old sailing boat last month.",
    "It needed a lot of work on the engine.",
    "We spent three weekends sanding the deck.",
    "Then we painted it bright blue and white.",
    "The first trip out was a little scary.",
    "The wind picked up and the sail tore.",
    "Luckily a fisherman towed us back to shore.",
    "Now we laugh about it every time we meet.",
    "Next summer we want to sail to the island.",
    "I am already looking forward to it.",
]
# User: barge-ins while the assistant talks, and the same redirects once it has stopped. Most carry a
# question or a request after the "wait": the assistant yields, then answers what came after it.
BARGE_INS = [
    "Sorry, one more thing.",
    "Wait, let me stop you there.",
    "Hold on a second please.",
    "No no, that is not what I meant.",
    "Excuse me, can I ask something else?",
    "Wait, what did you say about the price?",
    "Hold on, can you say the last bit again?",
    "Sorry, can you make it shorter?",
    "Just a second, where is that exactly?",
    "Stop there, I need the simple version.",
    "Hang on a moment, why is that?",
    "Wait a minute, who told you that?",
    "Sorry, but is that safe for children?",
    "Hold on, what does that word mean?",
    "Okay wait, how much would that cost?",
    "One second, can you give me an example?",
    "Excuse me, is there an easier way?",
    "Sorry to cut in, what about at night?",
    "Wait, go back to the first step please.",
    "Actually, I would like to talk about my garden.",
    "Hold on, that sounds too complicated.",
    "Stop please, I changed my mind.",
    "Wait, how often should I do that?",
    "Sorry, which one did you mean?",
    "Just a moment, can you slow down?",
    "Hang on, what happens if it rains?",
    "Actually no, tell me about the weekend instead.",
    "Wait, is that the cheapest one?",
    "Hold on, why would I need that?",
]
# The assistant's holding phrases while the background reasoner looks something up. They are replies of
# the phrase set (the talker speaks nothing else), so an edit of TRAINED_REPLIES must not strand them.
HOLDS = ["Please give me one moment.", "Okay, let me think about it."]
if not set(HOLDS) <= set(REPLIES):
    raise ValueError(f"holding phrases {sorted(set(HOLDS) - set(REPLIES))} are not in TRAINED_REPLIES")
# User: backchannels while the assistant talks (the assistant keeps going).
USER_BACKCHANNELS = ["Mm-hm.", "Yeah.", "Uh-huh.", "Right.", "Okay."]
# Background talk not addressed to the assistant (another room, a radio): quieter.
OVERHEARD = [
    "The next stop is the central station.",
    "Did anyone see where I put the scissors?",
    "The weather tonight will be cold and clear.",
    "We need more milk and some bread.",
    "The match starts at eight on channel four.",
]
# Requests that need the background reasoner (delegate), and the results it sends back.
# Each asks in so many words for something looked up, found or checked (a fact it cannot know: hours,
# prices, times, distances, today's news), phrased many ways, so the request and not one sentence is
# the cue; RESULTS[i] answers LOOKUPS[i].
_LOOKUP_PAIRS = [
    ("Can you look up the opening hours of the library?", "The library opens at nine."),
    ("Please find out when the next ferry leaves.", "The next ferry leaves at noon."),
    ("Could you check the price of a train ticket to the coast?", "A return ticket costs twelve euros."),
    ("Look up how tall the town hall tower is.", "The tower is forty metres tall."),
    ("Search for a pharmacy that is open tonight.", "The pharmacy on Mill Street is open until ten."),
    ("Can you check when the swimming pool closes?", "The pool closes at eight."),
    ("Find out how far it is to the airport.", "The airport is thirty kilometres away."),
    ("Please look up the score of last night's match.", "The home team won two to one."),
    ("Could you find the phone number of the dentist?", "The number is five five five, two one four."),
    ("Check whether the museum is open on Mondays.", "The museum is closed on Mondays."),
    ("Can you search for the cheapest flight to Lisbon?", "The cheapest flight costs ninety euros."),
    ("Look up what time the sun sets today.", "The sun sets at half past five."),
    ("Please check if my parcel has been delivered.", "Your parcel arrives tomorrow morning."),
    ("Could you look up the population of Norway?", "Norway has about five million people."),
    ("Find out which platform the ten o'clock train leaves from.", "It leaves from platform four."),
    ("Can you check the forecast for Saturday?", "Saturday will be sunny and mild."),
    ("Search the news for the election results.", "The results come out tonight."),
    ("Please find a recipe that uses leeks and potatoes.", "Try a leek and potato soup."),
    ("Could you check how much a new passport costs?", "A new passport costs seventy euros."),
    ("Look up when the bakery on the corner opens.", "The bakery opens at seven."),
    ("Can you find out who wrote that song about the river?", "It was written by a Welsh band."),
    ("Check the exchange rate for dollars today.", "One dollar buys ninety cents."),
    ("Please search for a bike shop near the station.", "There is one beside the station car park."),
    ("Could you find out how long the bridge is?", "The bridge is two kilometres long."),
]
LOOKUPS = [q for q, _ in _LOOKUP_PAIRS]
RESULTS = [r for _, r in _LOOKUP_PAIRS]
# Typed messages (arrive as text, not audio).
TYPED = [
    "hello, are you there?",
    "can you help me with a question?",
    "what should I do this weekend?",
    "thanks for the help earlier",
]


def phrase_set() -> list[str]:
    """Every phrase the assistant can say: the closed set the voice is evaluated on."""
    return [*REPLIES, *BACKCHANNELS, FOUND, *RESULTS]

# The overlap probe (train/overlap.py, models/speech/overlap.py): what a listener says over a speaker
# to keep them going, and how people start to interrupt. The backchannel lexicon is small and closed
# (the probe learns it, so one- and two-word entries are shared with any benchmark by nature);
# the interruptions are sentences of their own, some starting with a backchannel word ("Okay, but").
OVERLAP_BACKCHANNELS = [
    "Mm-hm.", "Uh-huh.", "Yeah.", "Yep.", "Right.", "Okay.", "Sure.", "I see.", "Oh, wow.", "Really?",
    "Got it.", "Mhm.", "True.", "Exactly.", "Oh, nice.", "Yes.", "Uh-huh, yeah.", "Oh okay.", "Yeah, yeah.",
    "Mm.", "Wow.", "Of course.", "Totally.", "Sure, sure.", "Right, right.", "Okay, okay.", "Ah, I see.",
    "Yes, yes.", "Oh, right.", "Cool.",
]
OVERLAP_INTERRUPTIONS = [
    "Wait a second, that is not what I asked.",
    "Hold it, can we go back to the start?",
    "Stop, stop, I need something else.",
    "Excuse me, could you repeat the last part?",
    "No no, I meant the other one.",
    "Sorry, but how much does it cost?",
    "Hey, quick question about that.",
    "Just a moment, what did you say?",
    "Actually, let me ask you something.",
    "But why is that?",
    "Can I ask something first?",
    "Listen, I have to go soon.",
    "What do you mean by that?",
    "Okay, but what about the price?",
    "Yeah, but that does not make sense.",
    "Right, and what happens after that?",
    "Please skip that part.",
    "I think you are wrong about that.",
    "One more thing before you go on.",
    "Never mind, tell me about dogs instead.",
    "How about the weather tomorrow?",
    "That is enough, thank you.",
    "Pardon me, who said that?",
    "Let me interrupt you for a moment.",
    "Could you give me the number again?",
    "Why would anyone do that?",
    "Is there a cheaper option?",
    "So what should I do now?",
    "Hmm, no, I do not agree.",
    "Sorry, I did not catch that.",
    "Quick, what time is it?",
    "Um, can you speak louder?",
    "Oh wait, I forgot to tell you something.",
    "Yes, but where is it exactly?",
    "Really? Since when?",
    "Go back to the part about the river.",
    "Enough about that, what about lunch?",
    "Are you sure about that number?",
    "Tell me the answer first.",
    "Another question, if I may.",
]
