// radixrt's live page: polls /dashboard/stats and /debug/radix_tree (same origin, the API key
// in the cookie /dashboard?api_key=KEY set) and draws them with plain SVG. No library.
"use strict";

const POLL_MS = 2000;
const RECENT_BUCKETS = 12; // the headline rates: the last minute of 5-second buckets
const TREE_DEPTH = 6;
const TREE_LIMIT = 150;
const TREE_ROW = 36; // pixels per tree level
const HOT_ROWS = 10;
const TIER_HUE = { device: 215, host: 140, disk: 30 };
const SVG = "http://www.w3.org/2000/svg";

const byId = (id) => document.getElementById(id);

function setText(id, value) {
  const el = byId(id);
  if (el) el.textContent = value;
}

function fmt(x, digits = 0) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits,
                                             minimumFractionDigits: digits });
}

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function rows(table, head, body) {
  // table: an element; head: column names; body: arrays of cells (strings or [text, class])
  table.replaceChildren();
  const tr = document.createElement("tr");
  for (const h of head) {
    const th = document.createElement("th");
    th.textContent = h;
    tr.append(th);
  }
  table.append(tr);
  for (const cells of body) {
    const row = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (Array.isArray(cell)) {
        td.textContent = cell[0];
        td.className = cell[1];
      } else {
        td.textContent = cell;
      }
      row.append(td);
    }
    table.append(row);
  }
}

async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  if (!response.ok) {
    let message = "HTTP " + response.status;
    try {
      const body = await response.json();
      message += ": " + ((body.error && body.error.message) || body.detail || "");
    } catch (e) { /* not JSON */ }
    throw new Error(url + " " + message);
  }
  return response.json();
}

// --- the figures ---------------------------------------------------------------------------

function sparkline(id, values, maxId, slots) {
  // the last `slots` buckets, the ones before the server's history as zeros (none finished)
  const svg = byId(id);
  svg.replaceChildren();
  const padded = Array(Math.max(slots - values.length, 0)).fill(0).concat(values);
  const top = Math.max(...padded, 1e-9);
  const n = padded.length;
  const points = padded.map((v, i) => `${(i / Math.max(n - 1, 1)) * 300},${58 - (v / top) * 54}`);
  svg.append(svgEl("polyline", { points: points.join(" ") }));
  setText(maxId, "max " + fmt(top, top < 10 ? 1 : 0));
}

function sum(buckets, key) {
  return buckets.reduce((acc, b) => acc + b[key], 0);
}

function renderStats(stats) {
  const info = stats.info;
  const history = stats.history;
  const span = history.bucket_s;
  const buckets = history.buckets;
  const recent = buckets.slice(-RECENT_BUCKETS);
  const seconds = Math.max(recent.length * span, span);
  setText("model", stats.model);
  setText("bucket-s", span);
  setText("running", fmt(info.running));
  setText("waiting", fmt(info.waiting));
  setText("swapped", fmt(info.swapped));
  setText("request-rate", fmt(sum(recent, "requests") / seconds, 2));
  setText("token-rate", fmt(sum(recent, "generated_tokens") / seconds, 1));
  setText("hit-rate", fmt(100 * info.cache_hit_rate, 1) + " %");
  const ttftN = sum(recent, "ttft_count");
  const tpotN = sum(recent, "tpot_count");
  setText("ttft", ttftN ? fmt(1000 * sum(recent, "ttft_sum") / ttftN) + " ms" : "–");
  setText("tpot", tpotN ? fmt(1000 * sum(recent, "tpot_sum") / tpotN, 1) + " ms" : "–");
  setText("requests-total", fmt(sum(buckets, "requests")));
  setText("generated-total", fmt(info.generated_tokens));
  setText("preemptions", fmt(info.preemptions));
  const drafted = info.spec_drafted_tokens || 0;
  setText("spec-accept", drafted
    ? fmt(100 * info.spec_accepted_tokens / drafted, 1) + " %"
    : (info.speculative_algorithm ? "0 drafted" : "off"));

  const slots = history.window;
  sparkline("chart-tokens", buckets.map((b) => b.generated_tokens / span), "max-tokens", slots);
  sparkline("chart-requests", buckets.map((b) => b.requests / span), "max-requests", slots);
  sparkline("chart-ttft", buckets.map((b) => b.ttft_count ? 1000 * b.ttft_sum / b.ttft_count : 0),
            "max-ttft", slots);
  sparkline("chart-tpot", buckets.map((b) => b.tpot_count ? 1000 * b.tpot_sum / b.tpot_count : 0),
            "max-tpot", slots);
  renderPool(info);
  renderTenants(info, buckets);
}

function renderPool(info) {
  const total = info.kv_total || 1;
  const parts = [["private", info.kv_private], ["locked", info.kv_locked],
                 ["evictable", info.kv_evictable], ["free", info.kv_free]];
  const bar = byId("kv-bar");
  bar.replaceChildren();
  const legend = byId("kv-legend");
  legend.replaceChildren();
  for (const [name, tokens] of parts) {
    const div = document.createElement("div");
    div.className = "kv-" + name;
    div.style.width = (100 * tokens / total) + "%";
    div.title = `${name}: ${tokens} tokens`;
    bar.append(div);
    const item = document.createElement("span");
    item.id = "kv-" + name;
    item.dataset.tokens = tokens;
    item.innerHTML = `<i class="kv-${name}"></i>`;
    item.append(`${name} ${fmt(tokens)} tokens`);
    legend.append(item);
  }
  const tiers = info.kv_tiers || {};
  const body = [["device", fmt(info.kv_total), fmt(info.kv_total - info.kv_free), "–"]];
  for (const name of ["host", "disk"]) {
    const t = tiers[name];
    if (t) body.push([name, fmt(t.tokens), fmt(t.cached_tokens), fmt(t.hit_tokens)]);
  }
  rows(byId("tiers"), ["tier", "tokens", "in use", "tokens served from it"], body);
}

function renderTenants(info, buckets) {
  const running = info.running_by_tenant || {};
  const weights = info.tenant_weights || {};
  const finished = {};
  const priorities = {};
  for (const b of buckets) {
    for (const [t, n] of Object.entries(b.by_tenant)) finished[t] = (finished[t] || 0) + n;
    for (const [p, n] of Object.entries(b.by_priority)) priorities[p] = (priorities[p] || 0) + n;
  }
  const names = [...new Set([...Object.keys(running), ...Object.keys(weights),
                             ...Object.keys(finished)])].sort();
  const totalRunning = Object.values(running).reduce((a, n) => a + n, 0) || 1;
  rows(byId("tenants"), ["tenant", "running", "share of running", "weight", "finished"],
       names.map((t) => [t || "(none)", fmt(running[t] || 0),
                         fmt(100 * (running[t] || 0) / totalRunning, 0) + " %",
                         fmt(weights[t] === undefined ? 1 : weights[t], 2),
                         fmt(finished[t] || 0)]));
  rows(byId("priorities"), ["priority", "finished"],
       Object.keys(priorities).sort((a, b) => a - b).map((p) => [p, fmt(priorities[p])]));
}

// --- the radix tree: an icicle ---------------------------------------------------------------

function renderTree(view) {
  const svg = byId("tree");
  const width = Math.max(svg.clientWidth || 1000, 300);
  const nodes = view.nodes;
  const depth = nodes.reduce((d, n) => Math.max(d, n.depth), 0);
  const height = (depth + 1) * TREE_ROW;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.style.height = height + "px";
  svg.replaceChildren();
  const maxHits = nodes.reduce((m, n) => Math.max(m, n.hits), 1);
  const x = new Map(); // id -> [x0, x1]
  const used = new Map(); // id -> width given to its children so far
  const rootsTotal = nodes.filter((n) => n.parent < 0)
    .reduce((a, n) => a + n.subtree_tokens, 0) || 1;
  let rootX = 0;
  for (const n of nodes) { // parents come before children
    let x0;
    let w;
    if (n.parent < 0) {
      w = width * n.subtree_tokens / rootsTotal;
      x0 = rootX;
      rootX += w;
    } else {
      const [p0, p1] = x.get(n.parent);
      const parent = nodes[n.parent];
      const start = p0 + (used.get(n.parent) || 0);
      w = (p1 - p0) * n.subtree_tokens / Math.max(parent.subtree_tokens, 1);
      x0 = start;
      used.set(n.parent, (used.get(n.parent) || 0) + w);
    }
    x.set(n.id, [x0, x0 + w]);
    const g = svgEl("g", { class: "node" });
    Object.assign(g.dataset, { id: n.id, depth: n.depth, tokens: n.tokens,
                               subtreeTokens: n.subtree_tokens, hits: n.hits, tier: n.tier,
                               locks: n.locks, namespace: n.namespace });
    const light = 88 - 48 * (n.hits / maxHits);
    const fill = n.depth === 0 ? "#c9ced8" : `hsl(${TIER_HUE[n.tier] || 0}, 60%, ${light}%)`;
    g.append(svgEl("rect", { x: x0, y: n.depth * TREE_ROW, width: Math.max(w, 0.5),
                             height: TREE_ROW - 2, fill }));
    const label = n.depth === 0 ? n.namespace
      : `${n.tokens} tok · ${n.hits} hits` + (n.text ? " · " + n.text : "");
    const title = svgEl("title");
    title.textContent = n.depth === 0
      ? `namespace ${n.namespace}: ${n.subtree_tokens} tokens cached`
      : `${n.tokens} tokens (${n.subtree_tokens} with what is below), ${n.hits} hits, ` +
        `tier ${n.tier}, ${n.locks} locks, ${n.children} children, idle ${n.idle_s} s` +
        (n.text ? `\n${n.text}` : "");
    g.append(title);
    if (w > 40) {
      const text = svgEl("text", { x: x0 + 4, y: n.depth * TREE_ROW + TREE_ROW / 2 + 4 });
      text.textContent = label.slice(0, Math.floor(w / 6.5));
      g.append(text);
    }
    svg.append(g);
  }
  setText("tree-summary", `${nodes.length} nodes shown of ${view.scanned} walked` +
          (view.complete ? "" : " (the tree is larger: sizes count what was walked)") +
          `; cached tokens: device ${fmt(view.cached_tokens.device)}` +
          (view.cached_tokens.host ? `, host ${fmt(view.cached_tokens.host)}` : "") +
          (view.cached_tokens.disk ? `, disk ${fmt(view.cached_tokens.disk)}` : "") + ".");
  const hot = nodes.filter((n) => n.depth > 0)
    .sort((a, b) => b.hits - a.hits || b.subtree_tokens - a.subtree_tokens)
    .slice(0, HOT_ROWS);
  rows(byId("hot-nodes"), ["hits", "tokens", "below", "tier", "locks", "idle s", "namespace",
                           "first words"],
       hot.map((n) => [fmt(n.hits), fmt(n.tokens), fmt(n.subtree_tokens - n.tokens), n.tier,
                       fmt(n.locks), fmt(n.idle_s, 1), n.namespace,
                       [n.text === null ? "(hidden: --dashboard-show-text)" : n.text, "text"]]));
}

// --- the loop ----------------------------------------------------------------------------------

async function refresh() {
  try {
    const [stats, tree] = await Promise.all([
      getJSON("/dashboard/stats"),
      getJSON(`/debug/radix_tree?depth=${TREE_DEPTH}&limit=${TREE_LIMIT}`),
    ]);
    renderStats(stats);
    renderTree(tree);
    const status = byId("status");
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "status";
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    const status = byId("status");
    status.textContent = String(err.message || err);
    status.className = "status error";
  }
}

refresh();
setInterval(refresh, POLL_MS);
