"""What a native-model session emits in a micro-turn once its action is decided: the text it writes, the
user's transcript, its events, and the gate on its voice."""

from models.base import Event, TickInput
from models.interaction.config import NO_BYTE
from models.interaction.floor import BACKCHANNEL, SILENT, SPEAK, YIELD, Floor
from models.interaction.query import QUERY_CHARS
from models.interaction.session import NativeSession


def emit(
    st: NativeSession,
    tick: TickInput,
    action: int,
    voice: bool,
    text: list[int],
    transcript: list[int],
    floor: Floor,
) -> tuple[float, str, str, list[Event]]:
    """Map head decisions to events and what is emitted; update the session's floor state."""
    events: list[Event] = []
    if tick.cancel:
        action = YIELD if st.speaking else SILENT  # the client asked us to stop: drop this utterance
    changed = voice != st.user_speaking
    if changed:
        events.append(Event("speech_started" if voice else "speech_stopped"))
        st.user_speaking = voice
        if not voice and st.hear is not None:
            st.hear.flush()  # the turn's words go out with it, not after
    if action == BACKCHANNEL:
        events.append(Event("backchannel"))
    if action == YIELD and st.speaking:
        events.append(Event("yielded"))
    events += floor.settle(st, action, changed, lambda: said(st))
    st.speaking, st.last_action = action == SPEAK, action
    written = [b for b in text if b != NO_BYTE] if action == SPEAK else []
    st.own_text = written + [NO_BYTE] * (len(text) - len(written))
    if st.hear is not None:
        # The recogniser's committed words are the user's transcript (real words; the tiny model's
        # transcript head is not yet), streamed as they become final.
        user_text = st.hear.take_fresh()
    else:
        heard = bytes(b for b in transcript if b != NO_BYTE)
        user_text = st.transcript_dec.decode(heard)
        st.transcript = (st.transcript + user_text)[-500:]
    gate = 1.0 if action in (SPEAK, BACKCHANNEL) else 0.0
    return gate, st.text_dec.decode(bytes(written)), user_text, events


def said(st: NativeSession) -> str:
    """A hand-off's words where Whisper's are not at hand: what the recogniser heard, where the checkpoint has
    one (its words are real words; the tiny model's transcript head is not yet), else its transcript, else the
    last typed text."""
    words = " ".join(st.hear.words) if st.hear is not None else ""
    return words[-QUERY_CHARS:] or st.transcript[-QUERY_CHARS:] or st.last_typed
