// The playground: chat with a served model through POST /v1/chat/completions, streamed (server-sent events read
// with fetch), with the sampling settings and the exact request shown.
"use strict";

const chat = {messages: [], controller: null};
const $ = (id) => document.getElementById(id);

function settings() {
  const body = {model: $("set-model").value, messages: [], stream: true, stream_options: {include_usage: true}};
  const system = $("set-system").value.trim();
  if (system) body.messages.push({role: "system", content: system});
  body.messages.push(...chat.messages);
  for (const [id, key, parse] of [["set-temperature", "temperature", parseFloat], ["set-top-p", "top_p", parseFloat],
                                  ["set-max-tokens", "max_tokens", (v) => parseInt(v, 10)],
                                  ["set-seed", "seed", (v) => parseInt(v, 10)]]) {
    const v = parse($(id).value);
    if (!Number.isNaN(v)) body[key] = v;
  }
  return body;
}

function showRequest(body) {
  const auth = lf.key() ? "Authorization: Bearer <your key>\n" : "";
  $("raw-request").textContent = `POST ${location.origin}/v1/chat/completions\nContent-Type: application/json\n` +
    auth + "\n" + JSON.stringify(body, null, 2);
}

function addMessage(role, text) {
  const node = lf.el("div", {class: "msg " + role}, lf.el("span", {class: "who"}, role),
                     lf.el("span", {class: "text"}, text));
  $("chat-log").append(node);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return node;
}

// Yields each parsed `data:` payload of an SSE body until `[DONE]`.
async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

async function send(text) {
  chat.messages.push({role: "user", content: text});
  addMessage("user", text);
  const body = settings();
  showRequest(body);
  const answer = addMessage("assistant", "");
  const out = answer.querySelector(".text");
  chat.controller = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  const t0 = performance.now();
  let first = null, usage = null, content = "";
  try {
    const resp = await lf.call("/v1/chat/completions", {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json"}, signal: chat.controller.signal});
    if (!resp.ok) {
      const err = await resp.json().catch(() => ({}));
      throw new Error(`${resp.status}: ${(err.error && err.error.message) || resp.statusText}`);
    }
    for await (const ev of events(resp)) {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.usage) usage = ev.usage;
      const piece = ev.choices && ev.choices.length ? ev.choices[0].delta.content || "" : "";
      if (piece) {
        if (first === null) first = performance.now();
        content += piece;
        out.textContent = content;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
    }
    answer.classList.add("done");
    chat.messages.push({role: "assistant", content});
    const secs = (performance.now() - t0) / 1000;
    const words = [`first token after ${first === null ? "–" : lf.num(first - t0, 0) + " ms"}`];
    if (usage) {
      words.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} generated tokens`);
      if (first !== null && usage.completion_tokens > 1) {
        words.push(`${lf.num((usage.completion_tokens - 1) / ((performance.now() - first) / 1000), 1)} tokens/s`);
      }
    }
    words.push(`${lf.num(secs, 2)} s in all`);
    $("chat-stats").textContent = words.join(", ");
  } catch (e) {
    answer.classList.add("failed");
    chat.messages.pop(); // the turn did not happen: it is not sent again with the next one
    out.textContent = content + (e.name === "AbortError" ? " [stopped]" : (content ? "\n" : "") + "error " + e.message);
    $("chat-stats").textContent = "";
  } finally {
    chat.controller = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

$("chat-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chat.controller) return;
  $("chat-input").value = "";
  send(text);
});
$("chat-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("chat-form").requestSubmit(); }
});
$("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
$("chat-clear").addEventListener("click", () => {
  chat.messages = [];
  $("chat-log").replaceChildren();
  $("chat-stats").textContent = "";
  showRequest(settings());
});
for (const input of document.querySelectorAll(".settings input, .settings select, .settings textarea")) {
  input.addEventListener("input", () => showRequest(settings()));
}
// the model list follows the status the dashboard polls
document.addEventListener("lf-status", (ev) => {
  const select = $("set-model");
  const names = ev.detail.models.map((m) => m.name);
  if ([...select.options].map((o) => o.value).join("\n") === names.join("\n")) return;
  const keep = select.value;
  select.replaceChildren(...names.map((n) => lf.el("option", {value: n}, n)));
  if (names.includes(keep)) select.value = keep;
  showRequest(settings());
});
showRequest(settings());
