"""Full-Duplex-Bench v1.0 / v1.5 compatible harness: generate a synthetic set, run it through the
server, score it with the official metric definitions (offline ASR and VAD).

Numbers from local synthetic data are not leaderboard numbers; every printed table says so.
"""
