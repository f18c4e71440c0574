"""Learning for the native interaction model: episodes, features, losses, LoRA, the training client.

Never imported by the server (docs/architecture.md: the layers); `duplex train` reaches it through a lazy import.
"""
