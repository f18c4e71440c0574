"""Turn-taking parts both voices use, owned by neither: whose voice it is by its level (level.py), the
words' verdict and a listener's backchannels (words.py), and off-thread work due at a micro-turn (work.py).
They import neither voice; the cascade (models/cascade) and the native model (models/interaction) import them.
"""
