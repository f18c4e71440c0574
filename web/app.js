// duplex web client: one WebRTC call (mic + optional camera in, voice out) and the Realtime events on a
// data channel, or GPT-Live's (Settings: Protocol). Plain ES module, no build step. State lives in
// `call`; the DOM is only written here.

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), connect: $("connect"), camera: $("camera"), apiKey: $("api-key"), settings: $("settings"),
  protocol: $("protocol"),
  message: $("message"), transcript: $("transcript"), form: $("text-form"), text: $("text"), send: $("send"),
  ask: $("ask"), previewBox: $("preview-box"), preview: $("preview"), seen: $("seen"), seenBox: $("seen-box"), background: $("background"),
  rtt: $("rtt"), late: $("late"), buffered: $("buffered"), jitter: $("jitter"), remote: $("remote"),
  micLevel: $("mic-level"), remoteLevel: $("remote-level"),
};

const PING_MS = 1000; // data-channel round-trip probe (the server also pings us for liveness)
const STATS_MS = 500;
const GATHER_TIMEOUT_MS = 3000; // the server takes no trickled candidates: wait for gathering, but not forever

// Diagnostics the page exposes for people and tests (read-only for them).
const diag = (window.duplex = {
  state: "idle", events: 0, audioEnergy: 0, packetsReceived: 0, rttMs: null, lateMs: null, jitterMs: null,
});

let call = null; // the live call, or null

// -- messages and status ------------------------------------------------------------------------

function setStatus(state, text) {
  diag.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = text || state;
  const busy = state === "connecting" || state === "live";
  ui.connect.textContent = busy ? "Hang up" : "Connect";
  ui.connect.classList.toggle("hangup", busy);
  // GPT-Live takes no typed user turns and has no background requests of the client's own.
  const typing = state === "live" && !(call && call.live);
  for (const el of [ui.text, ui.send, ui.ask]) el.disabled = !typing;
}

function showMessage(text, kind = "error", code = "") {
  ui.message.hidden = false;
  ui.message.textContent = text;
  ui.message.dataset.kind = kind;
  ui.message.dataset.code = code;
}

function clearMessage() {
  ui.message.hidden = true;
  ui.message.textContent = "";
  delete ui.message.dataset.code;
}

class CallError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

// -- connecting ---------------------------------------------------------------------------------

function authHeaders() {
  const key = ui.apiKey.value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, options = {}) {
  let res;
  try {
    res = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  } catch {
    throw new CallError("server_unreachable", `Cannot reach the server at ${location.origin}. Is it running ` +
      "(`make serve`)? Check the address and your network, then press Connect again.");
  }
  if (res.ok) return res;
  let err = {};
  try { err = (await res.json()).error || {}; } catch { /* not JSON: use the status */ }
  const code = err.code || `http_${res.status}`;
  if (code === "server_full") {
    throw new CallError(code, `The server is full: ${err.message || "no free session"}. ` +
      `Try again in ${res.headers.get("Retry-After") || "a few"} seconds.`);
  }
  if (res.status === 401) {
    ui.settings.open = true;
    throw new CallError("invalid_api_key", "This server needs an API key: enter it under Settings and press Connect again.");
  }
  throw new CallError(code, `The server refused the call (${res.status} ${code}): ${err.message || res.statusText}`);
}

async function getMedia(withCamera) {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new CallError("no_media", "This page cannot use the microphone here: browsers allow it only on " +
      "https:// or http://localhost. Open the page through one of those.");
  }
  const audio = { echoCancellation: true, noiseSuppression: true, autoGainControl: true };
  const video = withCamera ? { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 15 } } : false;
  try {
    return await navigator.mediaDevices.getUserMedia({ audio, video });
  } catch (e) {
    if (e.name === "NotAllowedError" || e.name === "SecurityError") {
      throw new CallError("mic_refused", (withCamera ? "Microphone or camera" : "Microphone") + " access was " +
        "refused. Allow it for this site (the icon in the address bar), then press Connect again.");
    }
    if (e.name === "NotFoundError" || e.name === "OverconstrainedError") {
      throw new CallError("no_device", `No ${withCamera ? "microphone or camera" : "microphone"} was found. ` +
        "Plug one in (or untick Camera) and press Connect again.");
    }
    throw new CallError("media_error", `Could not open the microphone: ${e.name}: ${e.message}`);
  }
}

function waitForGathering(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", done); resolve(); } };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, GATHER_TIMEOUT_MS);
  });
}

async function connect(resumeToken = null) {
  clearMessage();
  setStatus("connecting", resumeToken ? "resuming" : "connecting");
  const c = { pc: null, dc: null, stream: null, camera: null, timers: [], token: resumeToken, sessionId: null,
              callId: null, pings: new Map(), rtts: [], closing: false, resumed: resumeToken !== null,
              live: ui.protocol.value === "live" };
  call = c;
  try {
    c.stream = await getMedia(ui.camera.checked);
    if (call !== c) return; // hung up meanwhile
    const { ice_servers: iceServers } = await (await api("/v1/realtime/calls/ice")).json();
    c.pc = new RTCPeerConnection({ iceServers });
    const mic = c.stream.getAudioTracks()[0];
    c.pc.addTrack(mic, c.stream);
    // A video sender always exists, so the camera can be switched on and off without renegotiating.
    c.videoSender = c.pc.addTransceiver("video", { direction: "sendonly" }).sender;
    const cam = c.stream.getVideoTracks()[0];
    if (cam) await setCamera(c, cam);
    c.pc.ontrack = (ev) => { ui.remote.srcObject = ev.streams[0] || new MediaStream([ev.track]); };
    c.pc.onconnectionstatechange = () => onConnectionState(c);
    c.dc = c.pc.createDataChannel("oai-events");
    c.dc.onopen = () => onChannelOpen(c);
    c.dc.onmessage = (ev) => onEvent(c, JSON.parse(ev.data));
    c.dc.onclose = () => { if (!c.closing && call === c) note("event channel closed"); };
    await c.pc.setLocalDescription(await c.pc.createOffer());
    await waitForGathering(c.pc);
    // The resume token rides in a header, never the URL, so access logs don't record it.
    const headers = { "X-Duplex-Extensions": "1" };  // resume, duplex.* events
    if (resumeToken) headers["X-Duplex-Resume-Token"] = resumeToken;
    const answer = await (c.live ? offerLive(c, headers) : offerRealtime(c, headers));
    if (call !== c) return;
    await c.pc.setRemoteDescription({ type: "answer", sdp: answer });
    c.timers.push(setInterval(() => sendPing(c), PING_MS), setInterval(() => readStats(c), STATS_MS));
  } catch (e) {
    teardown(c);
    if (call === c) call = null;
    setStatus("error", "not connected");
    showMessage(e instanceof CallError ? e.message : `Connecting failed: ${e.message || e}`, "error",
      e instanceof CallError ? e.code : "connect_failed");
  }
}

// Realtime: the offer is the body; the call's id is in Location.
async function offerRealtime(c, headers) {
  const res = await api("/v1/realtime/calls", { method: "POST", body: c.pc.localDescription.sdp,
    headers: { ...headers, "Content-Type": "application/sdp" } });
  c.callId = (res.headers.get("Location") || "").split("/").pop();
  return res.text();
}

// GPT-Live: the session's configuration and the offer in one JSON body; the session starts with the call.
async function offerLive(c, headers) {
  const body = { session: { model: "gpt-live-1" }, transport: { type: "webrtc", sdp: c.pc.localDescription.sdp } };
  const res = await api("/v1/live/sessions", { method: "POST", body: JSON.stringify(body),
    headers: { ...headers, "Content-Type": "application/json" } });
  const answer = await res.json();
  c.callId = answer.session.id;
  return answer.transport.sdp;
}

function onChannelOpen(c) {
  setStatus("live", "live");
  // Ask for per-micro-turn stats (tick lateness) for the latency readout (a Realtime extension).
  if (!c.live) send(c, { type: "session.update", session: { duplex: { tick_stats: true } } });
}

function onConnectionState(c) {
  const state = c.pc.connectionState;
  if (call !== c || c.closing) return;
  if (state === "failed" || state === "closed") {
    // The server keeps the session for its grace period: try to pick it up again once.
    const token = c.token;
    teardown(c);
    call = null;
    if (token && !c.resumed) {
      note("connection lost; resuming…");
      connect(token);
    } else {
      setStatus("error", "disconnected");
      showMessage("The connection to the server was lost. Press Connect to start a new conversation.", "error", "connection_lost");
    }
  }
}

async function hangup() {
  const c = call;
  call = null;
  if (!c) return;
  c.closing = true;
  if (c.callId) {
    // Frees the session at once instead of after the resume grace period. keepalive: survives page unload.
    const path = c.live ? `/v1/live/sessions/${c.callId}/hangup` : `/v1/realtime/calls/${c.callId}/hangup`;
    fetch(path, { method: "POST", headers: authHeaders(), keepalive: true }).catch(() => {});
  }
  teardown(c);
  setStatus("idle", "idle");
  note("call ended");
}

function teardown(c) {
  c.closing = true;
  for (const t of c.timers) clearInterval(t);
  c.timers = [];
  if (c.dc) try { c.dc.close(); } catch { /* already closed */ }
  if (c.pc) try { c.pc.close(); } catch { /* already closed */ }
  if (c.stream) for (const t of c.stream.getTracks()) t.stop();
  if (c.camera) c.camera.stop();
  ui.previewBox.hidden = true;
  ui.preview.srcObject = null;
  ui.micLevel.value = ui.remoteLevel.value = 0;
}

// -- camera ---------------------------------------------------------------------------------------

async function setCamera(c, track) {
  if (c.camera && c.camera !== track) c.camera.stop();
  c.camera = track;
  await c.videoSender.replaceTrack(track);
  ui.previewBox.hidden = !track;
  ui.preview.srcObject = track ? new MediaStream([track]) : null;
}

ui.camera.addEventListener("change", async () => {
  const c = call;
  if (!c || !c.videoSender) return; // applies at the next Connect
  try {
    const track = ui.camera.checked
      ? (await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 640 }, height: { ideal: 480 } } })).getVideoTracks()[0]
      : null;
    await setCamera(c, track);
  } catch (e) {
    ui.camera.checked = false;
    showMessage(`The camera could not be opened (${e.name}). Allow it for this site and tick Camera again.`, "error", "camera_refused");
  }
});

// -- what the assistant sees ---------------------------------------------------------------------

// The server's `vision` event: the face box (fractions of the frame) over the preview, a caption with
// the gesture, fingers and text read, and each cue that began in the event log.
function showSeen(d) {
  const parts = [d.present ? (d.facing ? "person, facing the camera" : "person, looking away") : "nobody in view"];
  if (d.gesture) parts.push(d.gesture.replace("_", " "));
  if (d.fingers !== null && d.fingers !== undefined) parts.push(`${d.fingers} finger${d.fingers === 1 ? "" : "s"}`);
  if (d.texts && d.texts.length) parts.push(`text: “${d.texts.join(" / ")}”`);
  ui.seen.textContent = "Seen: " + parts.join(" · ");
  const box = d.face_box;
  ui.seenBox.hidden = !box;
  if (box) {
    Object.assign(ui.seenBox.style, { left: `${box[0] * 100}%`, top: `${box[1] * 100}%`,
      width: `${(box[2] - box[0]) * 100}%`, height: `${(box[3] - box[1]) * 100}%` });
  }
  for (const cue of d.cues || []) note(`seen: ${cue.replace("_", " ")}`);
}

// -- events ---------------------------------------------------------------------------------------

function send(c, event) {
  if (c && c.dc && c.dc.readyState === "open") c.dc.send(JSON.stringify(event));
}

function sendPing(c) {
  const id = Math.random().toString(36).slice(2);
  c.pings.set(id, performance.now());
  if (c.pings.size > 20) c.pings.delete(c.pings.keys().next().value);
  send(c, { type: "duplex.ping", id });
}

const convo = { user: null, assistant: null, userSpeaking: false, assistantSpeaking: false };

function onEvent(c, ev) {
  diag.events += 1;
  switch (ev.type) {
    case "duplex.ping": send(c, { type: "duplex.pong", t: ev.t }); break; // liveness: the server hangs up otherwise
    case "duplex.pong": {
      const sent = c.pings.get(ev.id);
      if (sent !== undefined) {
        c.pings.delete(ev.id);
        c.rtts = [...c.rtts.slice(-4), performance.now() - sent];
        const sorted = [...c.rtts].sort((a, b) => a - b);
        diag.rttMs = sorted[Math.floor(sorted.length / 2)];
        ui.rtt.textContent = `${diag.rttMs.toFixed(1)} ms`;
      }
      break;
    }
    case "duplex.session.resume":
      c.token = ev.resume_token; c.sessionId = ev.session_id;
      if (ev.resumed) note("conversation resumed");
      break;
    case "duplex.session.closing":
      showMessage(`The server ended the session: ${ev.reason || "closed"}.`, "info", "session_closing");
      c.closing = true;
      break;
    case "duplex.tick":
      if (typeof ev.late_ms === "number") { diag.lateMs = ev.late_ms; ui.late.textContent = `${ev.late_ms.toFixed(1)} ms`; }
      if (typeof ev.buffered_ms === "number") ui.buffered.textContent = `${ev.buffered_ms} ms`;
      break;
    case "conversation.item.added": {
      const item = ev.item || {};
      if (item.role === "user" && item.type === "message") {
        const text = (item.content || []).map((p) => p.text || "").join(" ");
        line("user", text, ["typed"]);
      }
      break;
    }
    case "input_audio_buffer.speech_started":
      convo.userSpeaking = true;
      convo.user = line("user", "");
      // Both talking at once: mark the user's line and what the assistant was saying.
      if (convo.assistantSpeaking) { tag(convo.user, "overlap"); tag(convo.assistant, "overlap"); }
      break;
    case "input_audio_buffer.speech_stopped":
      convo.userSpeaking = false;
      break;
    case "conversation.item.input_audio_transcription.delta":
      if (!convo.user) convo.user = line("user", "");
      append(convo.user, ev.delta);
      break;
    case "conversation.item.input_audio_transcription.completed":
      if (convo.user) setText(convo.user, ev.transcript);
      convo.user = null;
      break;
    case "response.created":
      // The assistant starts speaking; its line appears with its first words (audio may come without text).
      convo.assistantSpeaking = true;
      if (convo.userSpeaking) tag(convo.user, "overlap");
      break;
    case "response.output_audio_transcript.delta":
      if (!convo.assistant) {
        convo.assistant = line("assistant", "");
        if (convo.userSpeaking) { tag(convo.assistant, "overlap"); tag(convo.user, "overlap"); }
      }
      append(convo.assistant, ev.delta);
      break;
    case "response.done":
      convo.assistantSpeaking = false;
      if (ev.response && ev.response.status === "cancelled") tag(convo.assistant, "interrupted");
      convo.assistant = null;
      break;
    case "duplex.event":
      if (ev.event === "yielded") tag(convo.assistant, "interrupted");
      else if (ev.event === "backchannel") note(`backchannel${ev.data && ev.data.text ? `: ${ev.data.text}` : ""}`);
      else if (ev.event === "vision") showSeen(ev.data || {});
      break;
    case "duplex.background.started": bgItem(ev.request_id, ev.query, ev.queued ? "queued" : "running"); break;
    case "duplex.background.delta": bgAppend(ev.request_id, ev.delta); break;
    case "duplex.background.done": bgDone(ev.request_id, ev.status, ev.text, ev.reason); break;
    case "duplex.background.error": {
      const err = ev.error || {};
      if (ev.request_id) bgDone(ev.request_id, "error", "", err.message || err.code);
      else note(`background: ${err.message || "error"}`);
      break;
    }
    case "error": {
      const err = ev.error || {};
      note(`server: ${err.message || err.code || "error"}`);
      break;
    }
    // GPT-Live: transcripts of both voices on the session's timeline, hand-offs, the session's end.
    case "session.started": note(`GPT-Live session (model ${(ev.session.duplex || {}).model || "?"})`); break;
    case "session.input_transcript.delta":
      if (!convo.user) { convo.user = line("user", ""); convo.assistant = null; }
      append(convo.user, ev.delta);
      break;
    case "session.output_transcript.delta":
      if (!convo.assistant) { convo.assistant = line("assistant", ""); convo.user = null; }
      append(convo.assistant, ev.delta);
      break;
    case "session.delegation.created": note("handed off to the reasoner"); break;
    case "session.closed": note(`session closed: ${ev.reason || "closed"}`); break;
    default: break;
  }
}

// -- transcript -------------------------------------------------------------------------------------

function line(who, text, tags = []) {
  const el = document.createElement("div");
  el.className = `line ${who}`;
  el.innerHTML = `<span class="who">${who === "user" ? "you" : "assistant"}</span><span class="text"></span>`;
  el.querySelector(".text").textContent = text;
  for (const t of tags) tag(el, t);
  ui.transcript.append(el);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return el;
}

function append(el, text) {
  if (!el || !text) return;
  const t = el.querySelector(".text");
  t.textContent += (t.textContent && !/^\s/.test(text) && !/\s$/.test(t.textContent) ? " " : "") + text;
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

function setText(el, text) { if (el && text) el.querySelector(".text").textContent = text; }

function tag(el, name) {
  if (!el || el.querySelector(`.tag.${name}`)) return;
  const t = document.createElement("span");
  t.className = `tag ${name}`;
  t.textContent = name;
  el.querySelector(".who").append(t);
}

function note(text) {
  const el = document.createElement("div");
  el.className = "line note";
  el.textContent = text;
  ui.transcript.append(el);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

// -- background panel -------------------------------------------------------------------------------

function bgItem(id, query, status) {
  ui.background.querySelector(".empty")?.remove();
  let el = ui.background.querySelector(`[data-id="${CSS.escape(id)}"]`);
  if (!el) {
    el = document.createElement("div");
    el.className = "bg-item";
    el.dataset.id = id;
    el.innerHTML = '<div class="query"></div><div class="answer"></div>';
    el.querySelector(".query").textContent = query || "";
    ui.background.prepend(el);
  }
  el.dataset.status = status;
  return el;
}

function bgAppend(id, delta) {
  const el = bgItem(id, "", "running");
  el.querySelector(".answer").textContent += delta || "";
}

function bgDone(id, status, text, error = "") {
  const el = bgItem(id, "", status);
  const answer = el.querySelector(".answer");
  // `text` is the whole answer: it replaces the streamed deltas when complete, fills in when none came.
  if (text && (status === "completed" || !answer.textContent)) answer.textContent = text;
  if (status !== "completed") {
    const mark = document.createElement("span");
    mark.className = "status";
    mark.textContent = error ? ` (${status}: ${error})` : ` (${status})`;
    answer.append(mark);
  }
}

// -- stats --------------------------------------------------------------------------------------------

async function readStats(c) {
  if (!c.pc || c.closing) return;
  const stats = await c.pc.getStats();
  stats.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      diag.packetsReceived = s.packetsReceived || 0;
      diag.audioEnergy = s.totalAudioEnergy || 0;
      ui.remoteLevel.value = s.audioLevel || 0;
      // The browser's own playout buffer over the last interval (the stats are totals since the start).
      const prev = c.jitterPrev || { delay: 0, count: 0 };
      const count = (s.jitterBufferEmittedCount || 0) - prev.count;
      if (count > 0) {
        diag.jitterMs = (1000 * ((s.jitterBufferDelay || 0) - prev.delay)) / count;
        ui.jitter.textContent = `${diag.jitterMs.toFixed(0)} ms`;
      }
      c.jitterPrev = { delay: s.jitterBufferDelay || 0, count: s.jitterBufferEmittedCount || 0 };
    } else if (s.type === "media-source" && s.kind === "audio") {
      ui.micLevel.value = s.audioLevel || 0;
    }
  });
}

// -- wiring ---------------------------------------------------------------------------------------------

ui.connect.addEventListener("click", () => (call ? hangup() : connect()));

ui.form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = ui.text.value.trim();
  if (!text || !call) return;
  send(call, { type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  ui.text.value = "";
});

ui.ask.addEventListener("click", () => {
  const text = ui.text.value.trim();
  if (!text || !call) return;
  send(call, { type: "duplex.background.request", query: text });
  ui.text.value = "";
});

// Enter in the key field connects, like pressing Connect.
document.getElementById("settings-form").addEventListener("submit", (ev) => { ev.preventDefault(); if (!call) connect(); });
ui.apiKey.value = localStorage.getItem("duplex.apiKey") || "";
ui.apiKey.addEventListener("change", () => localStorage.setItem("duplex.apiKey", ui.apiKey.value.trim()));
window.addEventListener("pagehide", () => { if (call) hangup(); });
setStatus("idle", "idle");
