// The dashboard: polls GET /v1/status every second and draws it. The server keeps the last five minutes of samples;
// the page asks only for those it has not seen (?since=) and keeps the same five minutes.
"use strict";

const POLL_MS = 1000;
const seen = {samples: [], lastT: 0, recentKey: ""};

function merge(history) {
  for (const s of history.samples) if (s.t > seen.lastT) seen.samples.push(s);
  if (seen.samples.length) seen.lastT = seen.samples[seen.samples.length - 1].t;
  const oldest = seen.lastT - history.span_s;
  while (seen.samples.length && seen.samples[0].t <= oldest) seen.samples.shift();
}

const series = (pick) => seen.samples.map(pick);
const replicaSeries = (id, key) => series((s) => (s.replicas.find((r) => r.id === id) || {})[key] ?? null);

// the mean of a series' values over the last minute (null when nothing was observed)
function lastMinute(key) {
  const values = seen.samples.filter((x) => x.t > seen.lastT - 60 && x[key] !== null).map((x) => x[key]);
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

function spark(values, cls) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark " + (cls || "small"));
  requestAnimationFrame(() => lf.sparkline(svg, values));
  return svg;
}

function renderHeader(s) {
  const badge = document.getElementById("server-status");
  badge.textContent = s.status;
  badge.className = "badge " + s.status;
  if (s.overloaded) badge.title = s.overloaded;
  const downloads = (s.downloads || []).map((d) => d.state === "failed" ? `${d.id} (download failed)` :
    `${d.id} (downloading ${lf.pct(d.download.total ? d.download.bytes / d.download.total : null)}, ` +
    `${lf.num((d.download.bytes_per_s || 0) / 1e6, 1)} MB/s, ETA ${d.download.eta_s == null ? "?" : lf.duration(d.download.eta_s)})`);
  document.getElementById("server-models").textContent = s.models.map((m) => m.name).concat(downloads).join(", ");
  document.getElementById("server-uptime").textContent = "up " + lf.duration(s.time - s.started);
  document.getElementById("version").textContent = "llamafleet " + s.version;
}

function renderOverview(s) {
  const t = s.totals;
  document.getElementById("tokens-per-s").textContent = lf.num(t.tokens_per_s, 1);
  document.getElementById("queue-depth").textContent = lf.num(t.queue_depth, 0);
  for (const [id, key] of [["ttft", "ttft_s"], ["itl", "itl_s"]]) {
    document.getElementById(id).textContent = lf.ms(lastMinute(key));
    document.getElementById(id + "-all").textContent = "last minute; since start " + lf.ms(t[key]);
  }
  document.getElementById("cache-hit").textContent = lf.pct(t.cache_hit_rate);
  document.getElementById("tokens-total").textContent =
    `${lf.num(t.prompt_tokens_cached, 0)} of ${lf.num(t.prompt_tokens, 0)} prompt tokens cached; ` +
    `${lf.num(t.generated_tokens, 0)} generated`;
  document.getElementById("spec-acceptance").textContent = lf.pct(t.draft_acceptance);
  document.getElementById("spec-tokens").textContent = t.draft_tokens
    ? `speculative decoding: ${lf.num(t.draft_accepted_tokens, 0)} of ${lf.num(t.draft_tokens, 0)} drafted tokens kept`
    : "no draft yet (speculative decoding off, or nothing drafted)";
  document.getElementById("http-requests").textContent = lf.num(t.http_requests, 0);
  document.getElementById("sequences").textContent =
    Object.entries(t.sequences).map(([k, v]) => `${k} ${lf.num(v, 0)}`).join(", ") || "no sequence yet";
  for (const svg of document.querySelectorAll("#overview svg.spark")) {
    lf.sparkline(svg, series((x) => x[svg.dataset.series]));
  }
}

function memoryBar(d) {
  const planned = {weights: 0, kv: 0, compute: 0, margin: 0};
  for (const p of d.planned) {
    planned.weights += p.weights_mib; planned.kv += p.kv_mib;
    planned.compute += p.compute_mib; planned.margin += p.margin_mib;
  }
  const sum = planned.weights + planned.kv + planned.compute + planned.margin;
  const m = d.measured;
  const totalMib = m && m.total_bytes ? m.total_bytes / 2 ** 20 : Math.max(d.capacity_mib || 0, sum);
  const bar = lf.el("div", {class: "bar"});
  for (const [part, mib] of Object.entries(planned)) {
    if (!mib || !totalMib) continue;
    const seg = lf.el("span", {class: part, title: `${part}: ${lf.mib(mib)} planned`});
    seg.style.width = (100 * mib / totalMib).toFixed(2) + "%";
    bar.append(seg);
  }
  if (m && totalMib) {
    const mark = lf.el("span", {class: "measured", title: `measured in use: ${lf.mib(m.used_bytes / 2 ** 20)}`});
    mark.style.left = Math.min(99.5, 100 * m.used_bytes / 2 ** 20 / totalMib).toFixed(2) + "%";
    bar.append(mark);
  }
  const free = Math.max(0, totalMib - Math.max(sum, m ? m.used_bytes / 2 ** 20 : 0));
  const words = [`planned ${lf.mib(sum)} (weights ${lf.mib(planned.weights)}, KV ${lf.mib(planned.kv)}, ` +
                 `compute ${lf.mib(planned.compute)}, margin ${lf.mib(planned.margin)})`];
  if (m) words.push(`measured ${lf.mib(m.used_bytes / 2 ** 20)} in use` +
                    (d.index === null ? " by the workers" : ""));
  words.push(totalMib ? `${lf.mib(free)} free of ${lf.mib(totalMib)}` : "size unknown");
  return [bar, lf.el("div", {class: "muted memory-words"}, words.join("; "))];
}

function renderDevices(s) {
  const box = document.getElementById("devices");
  box.replaceChildren(...s.devices.map((d) => {
    const who = d.planned.map((p) => `${p.model}, replica ${p.replicas.join(", ")}`).join(", ") || "not used by the plan";
    const node = lf.el("div", {class: "device", "data-device": d.device},
      lf.el("div", {class: "title"}, lf.el("strong", {}, `${d.device} `, lf.el("span", {class: "muted"}, d.name)),
            lf.el("span", {class: "muted"}, who)),
      ...memoryBar(d));
    if (d.index !== null) {
      const util = series((x) => ((x.gpus.find((g) => g.index === d.index) || {}).utilization ?? null));
      const now = d.measured ? d.measured.utilization : null;
      node.append(lf.el("div", {class: "muted"}, `utilisation ${lf.pct(now)} `, spark(util, "util")));
    }
    return node;
  }));
}

function renderPlans(s) {
  const box = document.getElementById("plans");
  if (!s.plans.length) { box.replaceChildren(lf.el("p", {class: "muted"}, "no plan (not placed by this server)")); return; }
  box.replaceChildren(...s.plans.map((p) => lf.el("div", {class: "plan"},
    lf.el("p", {}, lf.el("strong", {}, p.model), ` on ${p.device.toUpperCase()}: ${p.replicas.length} replica(s), ` +
          `${p.n_seq} slots x ${p.n_ctx_per_seq} tokens each, KV ${p.kv_type}, batch ${p.n_batch}`),
    lf.el("ul", {class: "reasons"}, ...p.reasons.map((r) => lf.el("li", {}, r)),
          ...p.warnings.map((w) => lf.el("li", {class: "warning"}, "warning: " + w))))));
}

function renderReplicas(s) {
  const body = document.querySelector("#replicas tbody");
  body.replaceChildren(...s.replicas.map((r) => lf.el("tr", {"data-id": r.id},
    lf.el("td", {}, r.index), lf.el("td", {}, r.model), lf.el("td", {}, r.where),
    r.suspect && r.status === "ready"
      ? lf.el("td", {class: "state state-suspect", title: "silent past its bound: no new work, its queued " +
                     `sequences moved elsewhere (suspected ${r.suspicions} time(s))`}, "suspect")
      : lf.el("td", {class: "state state-" + r.status},
              r.status === "loading" ? `loading ${lf.pct(r.load_fraction)}` : r.status),
    lf.el("td", {class: "slots"}, `${r.slots_busy} / ${r.slots ?? "?"}`),
    lf.el("td", {class: "queued", title: `${r.waiting} waiting inside the engine`}, r.queued),
    lf.el("td", {class: "tps"}, lf.num(r.tokens_per_s, 1), " ", spark(replicaSeries(r.id, "tokens_per_s"))),
    lf.el("td", {class: "ttft"}, lf.ms(r.ttft_s), " ", spark(replicaSeries(r.id, "ttft_s"))),
    lf.el("td", {class: "itl"}, lf.ms(r.itl_s), " ", spark(replicaSeries(r.id, "itl_s"))),
    lf.el("td", {class: "restarts"}, r.restarts),
    lf.el("td", {class: "cache", title: tierTitle(r.kv_tiers)}, lf.pct(r.cache_hit_rate),
          r.kv_tiers ? ` · park ${r.kv_tiers.park.hits} / RAM ${r.kv_tiers.ram.hits} / disk ${r.kv_tiers.disk.hits} hits`
            : ""),
    lf.el("td", {class: "drafts", title: `speculative decoding: ${r.draft_accepted_tokens} of ${r.draft_tokens} ` +
                 "drafted tokens kept"}, r.draft_tokens ? lf.pct(r.draft_acceptance) : "–"),
    lf.el("td", {}, r.kv_tokens ? lf.pct(r.kv_tokens_used / r.kv_tokens) : "–"),
    lf.el("td", {class: "error"}, r.last_error || ""))));
}

function tierTitle(t) {  // the KV tiers beyond the slots, for a replica's cache cell
  if (!t) return "KV tiers off";
  const mib = (b) => lf.num(b / 1048576, 0) + " MiB";
  return (t.park.sequences ? `park tier: ${t.park.entries} of ${t.park.sequences} sessions, ` +
    `${t.park.tokens} tokens restored, ${t.park.evictions} evicted\n` : "") + `RAM tier: ${mib(t.ram.bytes)} of ${mib(t.ram.limit_bytes)}, ${t.ram.entries} states, ` +
    `${t.ram.tokens} tokens restored, ${t.ram.evictions} evicted\n` +
    (t.disk.on ? `disk tier: ${mib(t.disk.bytes)} of ${mib(t.disk.limit_bytes)}, ${t.disk.entries} files, ` +
      `${t.disk.tokens} tokens restored, ${t.disk.evictions} evicted` : "disk tier off");
}

function cacheText(c) {  // where a recent request's cached prompt tokens came from
  if (!c) return "";
  const msg = c.differs_in_message == null ? "" : ` (message ${c.differs_in_message})`;
  const at = c.differs_at === null ? "" : `; differs from the best cached prefix at token ${c.differs_at}${msg}`;
  return `cached: slot ${c.slot}, park ${c.park}, RAM ${c.ram}, disk ${c.disk}${at}`;
}

function renderRecent(s) {
  const rows = s.recent.requests;
  const key = rows.length ? `${rows.length}:${rows[0].t}:${rows[0].status}` : "0";
  document.getElementById("contents-note").textContent =
    s.recent.contents ? "(contents kept: recent_request_contents is on)" : "(contents not kept)";
  if (key !== seen.recentKey) {
    seen.recentKey = key;
    document.querySelector("#recent tbody").replaceChildren(...rows.slice(0, 40).map((e) => {
      const route = lf.el("td", {}, e.route);
      if (e.request_body !== null) {
        route.append(lf.el("details", {}, lf.el("summary", {}, "contents"),
          lf.el("pre", {}, "request:\n" + e.request_body + "\n\nanswer:\n" + e.response_body)));
      }
      const tokens = e.prompt_tokens === null ? "–" : `${e.prompt_tokens} / ${e.completion_tokens}`;
      return lf.el("tr", {class: e.error ? "failed" : null, title: e.error},
        lf.el("td", {}, lf.clock(e.t)), lf.el("td", {}, e.method), route, lf.el("td", {class: "status"}, e.status),
        lf.el("td", {}, lf.ms(e.latency_s)), lf.el("td", {class: "tokens", title: cacheText(e.cache)}, tokens),
        lf.el("td", {}, e.replicas || ""));
    }));
  }
  const errors = document.getElementById("errors");
  errors.replaceChildren(...(s.recent.errors.length ? s.recent.errors.slice(0, 50).map((e) => lf.el("li", {},
    lf.el("span", {class: "muted"}, lf.clock(e.t) + " "), lf.el("span", {class: "source"}, e.source),
    e.status ? `${e.status}: ` : "", e.message)) : [lf.el("li", {class: "muted"}, "no error yet")]));
}

function renderKeys(s) {  // today's usage per API key name (only the caller's own without the admin scope)
  const rows = s.keys || [];
  document.getElementById("keys-section").hidden = !rows.length;
  document.querySelector("#keys tbody").replaceChildren(...rows.map((k) => lf.el("tr", {},
    lf.el("td", {}, k.key), lf.el("td", {}, k.requests), lf.el("td", {}, `${k.prompt_tokens} (${k.cached_tokens})`),
    lf.el("td", {}, k.completion_tokens), lf.el("td", {}, k.refused))));
}

async function poll() {
  try {
    const resp = await lf.call(`/v1/status?since=${seen.lastT}`);
    if (!resp.ok) throw new Error(`GET /v1/status answered ${resp.status}`);
    const s = await resp.json();
    lf.banner((s.warnings || []).join(" "));  // slow steps, an overloaded host (fleet/pace.py)
    merge(s.history);
    for (const render of [renderHeader, renderOverview, renderDevices, renderPlans, renderReplicas, renderKeys,
      renderRecent]) {
      render(s);
    }
    document.dispatchEvent(new CustomEvent("lf-status", {detail: s}));
  } catch (e) {
    const badge = document.getElementById("server-status");
    badge.textContent = e.message === "401" ? "needs a key" : "unreachable";
    badge.className = "badge error";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("key-input");
  lf.setKey(input.value.trim());
  input.value = "";
  input.placeholder = lf.key() ? "key set for this tab" : "paste the key once (kept in this tab only)";
  lf.banner("");
});
document.getElementById("key-forget").addEventListener("click", () => {
  lf.setKey("");
  document.getElementById("key-input").placeholder = "paste the key once (kept in this tab only)";
});
if (lf.key()) document.getElementById("key-input").placeholder = "key set for this tab";
poll();
