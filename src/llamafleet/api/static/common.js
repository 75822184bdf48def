// What the dashboard and the playground share: the API key, calls to the server, DOM building, numbers, sparklines.
// Everything that comes from the server is put into the page as text (textContent), never as HTML.
"use strict";

const KEY_STORE = "llamafleet.apiKey"; // sessionStorage: this tab only, gone when it closes; never in a URL

const lf = {
  key() { return sessionStorage.getItem(KEY_STORE) || ""; },
  setKey(key) { key ? sessionStorage.setItem(KEY_STORE, key) : sessionStorage.removeItem(KEY_STORE); },

  headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = lf.key();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  },

  // fetch with the key; a 401 shows the key banner and throws
  async call(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = lf.headers(opts.headers);
    const resp = await fetch(path, opts);
    if (resp.status === 401) {
      lf.banner(lf.key() ? "The server refused this API key; paste a valid one above."
                         : "This server needs an API key: paste it above (it stays in this tab only).");
      throw new Error("401");
    }
    return resp;
  },

  banner(text) {
    const b = document.getElementById("banner");
    b.textContent = text || "";
    b.hidden = !text;
  },

  // el("td", {class: "x"}, "text", child, ...)
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  },

  num(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    return Number(v).toLocaleString("en-US", {maximumFractionDigits: digits === undefined ? 1 : digits});
  },
  ms(seconds) { return seconds === null || seconds === undefined ? "–" : lf.num(seconds * 1000, 1) + " ms"; },
  pct(ratio) { return ratio === null || ratio === undefined ? "–" : lf.num(ratio * 100, 1) + " %"; },
  mib(m) { return m === null || m === undefined ? "?" : m >= 1024 ? lf.num(m / 1024, 1) + " GiB" : lf.num(m, 0) + " MiB"; },
  clock(t) { return new Date(t * 1000).toLocaleTimeString("en-GB"); },
  duration(s) {
    if (s < 90) return Math.round(s) + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return lf.num(s / 3600, 1) + " h";
  },

  // Draw values (null = no data: a gap) as a polyline in an <svg>; the scale starts at 0.
  sparkline(svg, values, max) {
    const w = svg.clientWidth || 96, h = svg.clientHeight || 24;
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.replaceChildren();
    const top = Math.max(max || 0, ...values.filter((v) => v !== null && v !== undefined), 1e-9);
    const step = values.length > 1 ? w / (values.length - 1) : w;
    let points = [];
    const flush = () => {
      if (points.length) {
        const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
        line.setAttribute("points", points.length === 1 ? points.concat([points[0]]).join(" ") : points.join(" "));
        svg.append(line);
      }
      points = [];
    };
    values.forEach((v, i) => {
      if (v === null || v === undefined) { flush(); return; }
      points.push(`${(i * step).toFixed(1)},${(h - 1 - (v / top) * (h - 2)).toFixed(1)}`);
    });
    flush();
    svg.dataset.last = values.length ? String(values[values.length - 1]) : "";
  },
};
