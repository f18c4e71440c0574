"""The GPT-Live protocol (`/v1/live/sessions`) beside the Realtime one, on the same runtime verbs.

`events.py` names the client events and builds the protocol's errors, `config.py` resolves and checks
a session's configuration, `audio.py` converts the session's audio format at the edge, `context.py`
places the app's appends on the micro-turn timeline, `delegation.py` maps the background reasoner's
work to `response.event` envelopes, `connection.py` is one client connection (the session's output
sink), `endpoint.py` the WebSocket route and `rtc.py` the WebRTC one (the Realtime call, given the live
connection as its codec), `camera.py` duplex's camera extension, `census.py` the sessions per protocol
for /metrics. docs/live.md documents the protocol as served.
"""
