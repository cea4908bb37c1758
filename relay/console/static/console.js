// The xds-relay console: polls /console/data once a second and draws it.
//
// Every string that comes from the relay (node ids, peers, NACK messages,
// resource names, versions) reaches the page as text: through el()'s text
// nodes or textContent, never parsed as markup. The page's Content-Security-Policy
// runs this file and nothing else.
"use strict";

(() => {
  const POLL_MS = 1000;
  const STATES = ["nacked", "stale", "not_sent", "synced"];
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  const view = {
    query: { q: "", state: "", sort: "worst", order: "asc", offset: 0, limit: 50 },
    points: [],          // chart rows, oldest first (fields: history.fields)
    fields: null,
    capacity: 600,
    timer: null,
    inFlight: false,
    signedOut: false,
  };

  // An element with attributes and children; strings become text nodes.
  function el(tag, attributes, ...children) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") element.className = value;
      else if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
      else element.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function svg(tag, attributes) {
    const element = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      element.setAttribute(key, String(value));
    }
    return element;
  }

  const label = (sync) => String(sync || "unknown").replace("_", " ").toUpperCase();
  const stateClass = (sync) => "state state-" + (STATES.includes(sync) ? sync : "stale");
  const number = (n) => Number(n).toLocaleString("en-US");

  function ago(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "-";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s ago";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m ago";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h ago";
  }

  function showError(text) {
    $("error").textContent = text || "";
  }

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      body = null;
    }
    return { status: response.status, body };
  }

  // -- signing in ------------------------------------------------------------------

  function showLogin() {
    view.signedOut = true;
    $("main").hidden = true;
    $("client-page").hidden = true;
    $("logout").hidden = true;
    $("ready").hidden = true;
    $("why").textContent = "";
    $("updated").textContent = "";
    $("login").hidden = false;
    $("token").focus();
  }

  async function signIn(event) {
    event.preventDefault();
    const body = new URLSearchParams({ token: $("token").value });
    const response = await fetch("/console/login", {
      method: "POST", body, credentials: "same-origin",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
    });
    $("token").value = "";
    if (!response.ok) {
      let message = "sign-in failed (" + response.status + ")";
      try {
        message = (await response.json()).error || message;
      } catch (error) { /* the status says it */ }
      $("login-error").textContent = message;
      return;
    }
    $("login-error").textContent = "";
    $("login").hidden = true;
    view.signedOut = false;
    $("logout").hidden = false;
    route();
  }

  async function signOut() {
    await fetch("/console/logout", { method: "POST", credentials: "same-origin" });
    view.points = [];
    showLogin();
  }

  // -- polling ---------------------------------------------------------------------------

  function schedule(delay) {
    clearTimeout(view.timer);
    view.timer = setTimeout(refresh, delay === undefined ? POLL_MS : delay);
  }

  async function refresh() {
    if (view.signedOut) return;
    if (document.hidden || view.inFlight) {
      schedule();
      return;
    }
    view.inFlight = true;
    try {
      if (clientKey()) await refreshClient();
      else await refreshMain();
    } catch (error) {
      showError("cannot reach the relay: " + error);
    } finally {
      view.inFlight = false;
    }
    if (!view.signedOut) schedule();
  }

  function dataURL() {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(view.query)) {
      if (value !== "" && value !== null) params.set(key, String(value));
    }
    const last = view.points.length ? view.points[view.points.length - 1][0] : null;
    if (last !== null) params.set("since", String(last));
    return "/console/data?" + params.toString();
  }

  async function refreshMain() {
    const { status, body } = await getJSON(dataURL());
    if (status === 401) return showLogin();
    if (status !== 200 || !body) {
      showError("the relay answered " + status + (body && body.error ? ": " + body.error : ""));
      return;
    }
    showError("");
    $("main").hidden = false;
    $("client-page").hidden = true;
    renderReady(body.ready, body.now);
    renderOrigins(body.origins, body.now);
    renderCache(body.cache, body.snapshot, body.now);
    takePoints(body.history);
    renderCharts();
    renderClients(body.clients, body.now);
  }

  // -- the top line, origins, cache ------------------------------------------------------

  function renderReady(ready, now) {
    const badge = $("ready");
    badge.hidden = false;
    badge.textContent = ready.ready ? "READY" : "NOT READY";
    badge.className = "badge " + (ready.ready ? "ok" : "bad");
    $("why").textContent = ready.why || "";
    $("updated").textContent = "updated " + new Date(now * 1000).toLocaleTimeString();
  }

  function table(headings, rows, attributes) {
    return el("table", attributes || {},
      el("thead", null, el("tr", null, headings.map((h) => el("th", null, h)))),
      el("tbody", null, rows));
  }

  function renderOrigins(origins, now) {
    const box = $("origins");
    if (origins === null || origins === undefined) {
      box.replaceChildren(el("p", { class: "muted" },
        "This relay does not report its origins; readiness above says whether it is synced."));
      return;
    }
    if (!origins.length) {
      box.replaceChildren(el("p", { class: "muted" }, "No origin: the relay serves files."));
      return;
    }
    const rows = origins.map((o) => {
      const since = typeof o.since === "number" ? o.since : o.connected_since;
      return el("tr", null,
        el("td", null, o.origin || "-"),
        el("td", { title: (o.servers || []).join(", ") }, o.server || "-",
          o.fallback ? el("span", { class: "tag" }, "fallback") : null),
        el("td", null, o.connected
          ? el("span", { class: "state state-synced" }, "CONNECTED")
          : el("span", { class: "state state-nacked" }, "DISCONNECTED"),
          typeof since === "number" ? " " + ago(now - since).replace(" ago", "") : ""),
        el("td", { class: "number" }, number(o.reconnects || 0)),
        el("td", null, (o.last_response || []).map((r) =>
          el("div", { class: "nowrap" }, r.type + ": " + ago(now - r.at)))));
    });
    box.replaceChildren(table(
      ["Origin", "Server", "Connection", "Reconnects", "Last response"], rows));
  }

  function renderCache(cache, snapshot, now) {
    const rows = (cache || []).map((t) => el("tr", null,
      el("td", { title: t.type_url }, t.type),
      el("td", { class: "number" }, number(t.names)),
      el("td", { class: "number" }, number(t.variants)),
      el("td", null, t.synced ? "yes" : "no"),
      el("td", null, t.complete ? "yes" : "no"),
      el("td", null, t.errors ? el("span", { class: "state state-nacked" }, "errors") : "-")));
    $("cache").replaceChildren(rows.length
      ? table(["Type", "Names", "Variants", "Synced", "Complete", "Origin errors"], rows)
      : el("p", { class: "muted" }, "Nothing cached yet."));
    let text = "No snapshot store.";
    if (snapshot && snapshot.length) {
      text = snapshot.map((s) => {
        let line = "Snapshot" + (snapshot.length > 1 ? " of " + s.origin : "") + ": " + s.store +
          ", " + number(s.pending) + " names to write";
        const restored = s.restored;
        if (restored) {
          line += "; restored " + number(restored.resources) + " resources of " +
            number(restored.types) + " types at start";
          if (restored.written_at) line += " (written " + ago(now - restored.written_at) + ")";
        }
        return line + ".";
      }).join(" ");
    }
    $("snapshot").textContent = text;
  }

  // -- charts -------------------------------------------------------------------------------

  const CHARTS = [
    { title: "Clients", series: [["clients", 1]], unit: "" },
    { title: "Pushes / s", series: [["pushes_per_s", 1]], unit: "/s" },
    { title: "NACKs / s", series: [["nacks_per_s", 1]], unit: "/s" },
    { title: "Push latency: mean, p99 \u2264", series: [["latency_mean", 1000], ["latency_p99", 1000]], unit: " ms" },
    { title: "Loop lag: mean, max \u2264", series: [["lag_mean", 1000], ["lag_max", 1000]], unit: " ms" },
    { title: "Resident memory", series: [["rss", 1 / 1048576]], unit: " MiB" },
  ];

  function takePoints(history) {
    if (!history) return;
    view.fields = history.fields;
    view.capacity = history.capacity;
    view.points = view.points.concat(history.points);
    if (view.points.length > view.capacity) {
      view.points = view.points.slice(view.points.length - view.capacity);
    }
  }

  function value(raw, scale) {
    if (raw === null || raw === undefined) return null;
    if (raw === "inf") return Infinity;
    return raw * scale;
  }

  function renderCharts() {
    const box = $("charts");
    if (!view.fields) return;
    const at = view.fields.indexOf("at");
    const charts = CHARTS.map((chart) => {
      const W = 300, H = 80;
      const columns = chart.series.map(([field, scale]) => {
        const index = view.fields.indexOf(field);
        return view.points.map((p) => [p[at], value(p[index], scale)]);
      });
      const finite = columns.flat().map((p) => p[1]).filter((v) => v !== null && isFinite(v));
      const top = Math.max(1e-9, ...finite) * 1.1;
      const first = view.points.length ? view.points[0][at] : 0;
      const last = view.points.length ? view.points[view.points.length - 1][at] : 1;
      const span = Math.max(1, last - first);
      const graphic = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
        class: "chart", role: "img", "aria-label": chart.title });
      graphic.append(svg("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis" }));
      let drawn = 0;
      columns.forEach((column, i) => {
        const points = column.filter((p) => p[1] !== null)
          .map((p) => [((p[0] - first) / span) * W, H - (Math.min(p[1], top) / top) * (H - 4)]);
        drawn = Math.max(drawn, points.length);
        graphic.append(svg("polyline", {
          points: points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "),
          class: "series series-" + i }));
      });
      const latest = columns.map((column) => {
        const known = column.filter((p) => p[1] !== null);
        if (!known.length) return "-";
        const v = known[known.length - 1][1];
        return (isFinite(v) ? (v >= 100 ? Math.round(v) : Number(v.toPrecision(3))) : "beyond") + chart.unit;
      });
      const figure = el("figure", { class: "chart-box", "data-points": drawn },
        el("figcaption", null, el("span", null, chart.title),
          el("span", { class: "latest" }, latest.join(" / "))),
        graphic,
        el("div", { class: "scale muted" }, "max " + (finite.length ? Number((top / 1.1).toPrecision(3)) : 0) + chart.unit));
      return figure;
    });
    box.replaceChildren(...charts);
  }

  // -- the client list ------------------------------------------------------------------------

  function clientHref(row) {
    const params = new URLSearchParams({ node: row.node_id, peer: row.peer });
    if (row.worker !== undefined) params.set("worker", String(row.worker));
    return "#client?" + params.toString();
  }

  function renderClients(clients, now) {
    const query = view.query;
    const chips = [el("button", { type: "button", class: "chip" + (query.state === "" ? " active" : ""),
      onclick: () => setQuery({ state: "", offset: 0 }) }, "All " + number(clients.total))];
    for (const state of STATES) {
      chips.push(el("button", {
        type: "button", class: "chip " + stateClass(state) + (query.state === state ? " active" : ""),
        "data-state": state, onclick: () => setQuery({ state, offset: 0 }),
      }, label(state) + " " + number(clients.states[state] || 0)));
    }
    $("states").replaceChildren(...chips);
    $("type-states").textContent = (clients.types || []).map((t) =>
      t.type + ": " + STATES.filter((s) => t.states[s]).map((s) =>
        number(t.states[s]) + " " + label(s)).join(", ")).join(" · ");
    const workers = clients.rows.some((row) => row.worker !== undefined) || !!clients.workers;
    for (const cell of document.querySelectorAll(".worker-column")) cell.hidden = !workers;
    const rows = clients.rows.map((row) => el("tr", { class: "row-" + row.worst },
      el("td", null, el("span", { class: stateClass(row.worst) }, label(row.worst))),
      el("td", { class: "node" }, el("a", { href: clientHref(row) }, row.node_id || "(no node id)")),
      el("td", null, row.peer),
      el("td", null, row.protocol),
      workers ? el("td", { class: "number" }, row.worker === undefined ? "-" : row.worker) : null,
      el("td", null, row.types.map(([type, typeUrl, sync]) =>
        el("span", { class: stateClass(sync) + " small", title: typeUrl }, type + " " + label(sync)))),
      el("td", { class: "nack" }, row.nack
        ? [el("b", null, row.nack.type + ": "), row.nack.message + (row.nack.cut ? " ..." : "")]
        : "-")));
    $("clients").tBodies[0].replaceChildren(...rows);
    const from = clients.matched ? clients.offset + 1 : 0;
    const to = clients.offset + clients.rows.length;
    $("page").textContent = number(from) + "-" + number(to) + " of " + number(clients.matched);
    $("matched").textContent = (clients.matched !== clients.total
      ? number(clients.matched) + " of " + number(clients.total) + " match; " : "") +
      "list built " + ago(now - clients.built_at) +
      (clients.workers ? "; workers answering: " + clients.workers.filter((w) => w.answered).length +
        " of " + clients.workers.length : "");
    $("prev").disabled = clients.offset === 0;
    $("next").disabled = to >= clients.matched;
    for (const button of document.querySelectorAll("#clients th button")) {
      const sorted = button.dataset.sort === query.sort;
      button.className = sorted ? "sorted " + query.order : "";
      button.parentElement.setAttribute("aria-sort",
        sorted ? (query.order === "asc" ? "ascending" : "descending") : "none");
    }
  }

  function setQuery(change) {
    Object.assign(view.query, change);
    schedule(0);
  }

  // -- a client's page ---------------------------------------------------------------------------

  function clientKey() {
    const hash = location.hash;
    if (!hash.startsWith("#client?")) return null;
    return new URLSearchParams(hash.slice("#client?".length));
  }

  async function refreshClient() {
    const key = clientKey();
    const { status, body } = await getJSON("/console/client?" + key.toString());
    if (status === 401) return showLogin();
    $("main").hidden = true;
    $("client-page").hidden = false;
    const box = $("client");
    if (status === 404) {
      box.replaceChildren(el("h2", null, key.get("node") || "(no node id)"),
        el("p", { class: "muted" }, "Not connected now (from " + (key.get("peer") || "-") + ")."));
      return;
    }
    if (status !== 200 || !body) {
      showError("the relay answered " + status + (body && body.error ? ": " + body.error : ""));
      return;
    }
    showError("");
    if (box.dataset.key === key.toString() && box.querySelector("pre.resource")) {
      // a resource is open: keep the page still while it is read
      return;
    }
    box.dataset.key = key.toString();
    box.replaceChildren(...body.streams.map((stream) => renderStream(stream, body.now)));
  }

  // Timestamps /clients may carry, as the page names them.
  const MOMENTS = { connected_since: "Connected", acked_at: "Last ACK", nacked_at: "Last NACK",
    last_poll: "Last poll" };

  function moments(record, now) {
    const facts = [];
    for (const [key, value] of Object.entries(record)) {
      if ((key in MOMENTS || key.endsWith("_since") || key.endsWith("_at")) &&
          typeof value === "number") {
        facts.push([MOMENTS[key] || key.replace(/_/g, " "), ago(now - value)]);
      }
    }
    return facts;
  }

  function renderStream(stream, now) {
    const facts = [["Peer", stream.peer], ["Protocol", stream.protocol],
      ["Service", stream.service]];
    if (stream.worker !== undefined) facts.push(["Worker", stream.worker]);
    facts.push(...moments(stream, now));
    return el("article", { class: "stream" },
      el("h2", { class: "node" }, stream.node_id || "(no node id)"),
      el("dl", null, facts.map(([k, v]) => [el("dt", null, k), el("dd", null, v)])),
      stream.types.length ? stream.types.map((type) => renderType(type, now))
        : el("p", { class: "muted" }, "No type subscribed yet."));
  }

  function renderType(type, now) {
    const subscribed = [];
    if (type.wildcard) subscribed.push("* (wildcard)");
    if (type.subscribed_count) {
      subscribed.push(number(type.subscribed_count) + " name" + (type.subscribed_count === 1 ? "" : "s") +
        ": " + type.subscribed.join(", ") + (type.subscribed_count > type.subscribed.length ? ", ..." : ""));
    }
    const nack = type.last_nack;
    const nackBlock = nack
      ? el("div", { class: "last-nack" },
        el("div", null, "Last NACK: nonce " + nack.nonce +
          (nack.version !== undefined ? ", version " + nack.version : "") +
          (nack.versions ? ", rejected " + Object.entries(nack.versions).map(([n, v]) => n + " " + v).join(", ") : "")),
        el("pre", { class: "message" }, nack.message))
      : el("div", null, "Last NACK: none");
    const rows = type.resources.map((r) => el("tr", { class: "resource-" + r.status },
      el("td", null, r.name),
      el("td", null, el("span", { class: r.status === "acked" ? "state state-synced small" : "state state-stale small" }, r.status)),
      el("td", null, r.held || "-"),
      el("td", null, r.cached === null ? "(not cached)" : (r.cached || "-")),
      el("td", null, [r.alias_of ? "alias of " + r.alias_of : "", r.error ? "origin error: " + r.error : ""].filter(Boolean).join("; ")),
      el("td", null, r.cached ? el("button", { type: "button", class: "link",
        onclick: (event) => showResource(event.target, type.type_url, r.alias_of || r.name) }, "view") : "")));
    return el("section", { class: "type" },
      el("h3", null, type.type + " ", el("span", { class: stateClass(type.sync) }, label(type.sync)),
        el("span", { class: "muted small-text" }, " " + type.type_url)),
      el("div", null, "Subscribed: " + (subscribed.join(" + ") || "nothing")),
      el("div", null, "ACKed: " + (type.acked === null || type.acked === undefined ? "nothing yet" : type.acked)),
      el("div", null, "In flight: " + (type.in_flight || "-")),
      moments(type, now).map(([name, when]) => el("div", null, name + ": " + when)),
      nackBlock,
      rows.length ? table(["Resource", "Status", "Held", "Cached", "", ""], rows, { class: "resources" }) : null,
      type.resource_count > type.resources.length
        ? el("p", { class: "muted" }, number(type.resource_count - type.resources.length) + " more not listed")
        : null);
  }

  async function showResource(button, typeUrl, name) {
    const cell = button.parentElement;
    const open = cell.querySelector("pre.resource");
    if (open) {
      open.remove();
      return;
    }
    const params = new URLSearchParams({ type: typeUrl, name });
    const { status, body } = await getJSON("/console/resource?" + params.toString());
    if (status === 401) return showLogin();
    cell.append(el("pre", { class: "resource" },
      status === 200 ? JSON.stringify(body, null, 2) : "the relay answered " + status));
  }

  // -- wiring ------------------------------------------------------------------------------------

  function route() {
    if (view.signedOut) return;
    $("client").replaceChildren();
    delete $("client").dataset.key;
    schedule(0);
  }

  async function start() {
    $("login-form").addEventListener("submit", signIn);
    $("logout").addEventListener("click", signOut);
    let typing = null;
    $("search").addEventListener("input", (event) => {
      clearTimeout(typing);
      typing = setTimeout(() => setQuery({ q: event.target.value, offset: 0 }), 200);
    });
    for (const button of document.querySelectorAll("#clients th button")) {
      button.addEventListener("click", () => {
        const sort = button.dataset.sort;
        const order = view.query.sort === sort && view.query.order === "asc" ? "desc" : "asc";
        setQuery({ sort, order, offset: 0 });
      });
    }
    $("prev").addEventListener("click", () =>
      setQuery({ offset: Math.max(0, view.query.offset - view.query.limit) }));
    $("next").addEventListener("click", () => setQuery({ offset: view.query.offset + view.query.limit }));
    window.addEventListener("hashchange", route);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) schedule(0); });
    const { status, body } = await getJSON("/console/session");
    if (status !== 200 || !body) {
      showError("the relay answered " + status);
      return;
    }
    if (body.token_required && !body.signed_in) return showLogin();
    $("logout").hidden = !body.token_required;
    route();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
