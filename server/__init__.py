"""The duplex server: engine (tick loop), sessions, WebSocket/WebRTC transports, metrics, CLI.

No tensor math here: everything that computes lives in `models/`.
"""
