"""The GPT-Live protocol (`/v1/live/sessions`) beside the Realtime one, on the same runtime verbs.

`events.py` names the client events and builds the protocol's errors, `config.py` resolves and checks
a session's configuration, `audio.py` converts the session's audio format at the edge, `context.py`
places the app's appends on the micro-turn timeline, `delegation.py` maps the background reasoner's
work to `response.event` envelopes, `connection.py` is one client connection (the session's output
sink) and `endpoint.py` the WebSocket route. docs/live.md documents the protocol as served.
"""
