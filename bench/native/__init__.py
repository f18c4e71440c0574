"""Benches of the native model (models/interaction): what its heads decide and what its parts cost.

- `handoff`: whether it hands a request to the background reasoner or answers it itself.
- `onset`: calibrating the p(speak) a checkpoint needs to take the floor.
- `replay`: how fast a session is rebuilt from its micro-turn log.
- `talker`: the Piper talker, heard as words, and its cost.
- `precision`: what bf16 products cost in output quality; `vocoder_quality`: the streaming vocoder's cost and
  how well it inverts; `train_throughput`: one training step against this machine's matmul peak.
"""
