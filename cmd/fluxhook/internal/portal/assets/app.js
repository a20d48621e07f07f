"use strict";
// The portal: the page a tenant's people use to manage their webhook endpoints and see their
// deliveries, on fluxhook's management API (GET /v1/openapi.json is the contract of every call
// made here). No framework and no build step: the browser runs this file as it is.
//
// The session: a portal link carries its token in the fragment (#session=fhp_...). The page
// keeps it in sessionStorage (this tab only), takes it out of the address bar, and sends it as
// a bearer token on every request; no cookie is used. A 401 ends the page with one sentence.
//
// Safety: every value from the API reaches the page as text (textContent, createElement),
// never as HTML; links are built from ids, never from URLs the API returns.
(() => {
  const TOKEN_KEY = "fluxhook.portal.session";
  const TENANT_KEY = "fluxhook.portal.tenant";
  const EXPIRED = "This link has expired or is not valid: ask for a new one.";
  const PAGE = 50;

  const state = {
    token: "",
    me: null,
    tenant: "", // an operator's chosen tenant; "" is every tenant
    seq: 0, // the page shown; work started for an older page stops
    timers: new Set(),
    dead: false, // the session was refused: nothing more is shown
    secret: null, // {endpointID, secret, why}: shown once, on the endpoint's page
  };

  // ---- The DOM, built from text ----------------------------------------------------------

  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    setProps(el, props);
    return append(el, children);
  }

  const PROPERTIES = new Set(["value", "checked", "selected", "disabled", "hidden", "required", "open"]);

  function setProps(el, props) {
    if (!props) return;
    for (const [k, v] of Object.entries(props)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else if (PROPERTIES.has(k)) el[k] = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const SVGNS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return append(el, children);
  }

  function announce(text) {
    const el = document.getElementById("announce");
    el.textContent = "";
    // A change after a tick is what screen readers notice as new.
    setTimeout(() => { el.textContent = text; }, 50);
  }

  // ---- Formatting --------------------------------------------------------------------------

  const relative = typeof Intl !== "undefined" && Intl.RelativeTimeFormat
    ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }) : null;

  function ago(d) {
    if (!relative) return "";
    const s = (d.getTime() - Date.now()) / 1000;
    const a = Math.abs(s);
    if (a < 60) return relative.format(Math.round(s), "second");
    if (a < 3600) return relative.format(Math.round(s / 60), "minute");
    if (a < 86400) return relative.format(Math.round(s / 3600), "hour");
    return relative.format(Math.round(s / 86400), "day");
  }

  // when is a time in the browser's zone, its distance from now as its tooltip.
  function when(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    return h("time", { datetime: iso, title: ago(d) }, d.toLocaleString());
  }

  function num(n) {
    return n === null || n === undefined ? "—" : Number(n).toLocaleString();
  }

  function shortID(id) {
    return id.length > 12 ? id.slice(0, 8) + "…" : id;
  }

  function enc(s) { return encodeURIComponent(s); }

  function deliveryLink(id) {
    return h("a", { href: "#/deliveries/" + enc(id), class: "id", title: id, "aria-label": "delivery " + id }, shortID(id));
  }

  // localInput turns an RFC 3339 time into a datetime-local input's value, in the browser's
  // zone; isoFromLocal does the reverse.
  function localInput(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    if (isNaN(d)) return "";
    const p = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
  }

  function isoFromLocal(v) {
    if (!v) return "";
    const d = new Date(v);
    return isNaN(d) ? "" : d.toISOString();
  }

  const OUTCOMES = {
    delivered: ["Delivered", "ok"],
    failed: ["Failed, retried", "fail"],
    pending: ["Pending", ""],
    retrying: ["Retrying", "warn"],
    dead_lettered: ["Dead-lettered", "fail"],
  };

  function badge(status) {
    const [label, cls] = OUTCOMES[status] || [status, ""];
    return h("span", { class: "badge " + cls }, label);
  }

  // ---- The API -----------------------------------------------------------------------------

  class APIError extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field;
    }
  }

  // Refused ends whatever was under way once the session is refused (the page already says so).
  class Refused extends Error {}

  // apiURL resolves an API path against the page's own address (<base>/portal/), so that a
  // server behind a proxy under a path prefix works as one at the root.
  function apiURL(path, params) {
    const u = new URL(".." + path, location.href);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, String(v));
    }
    return u;
  }

  async function api(method, path, opts) {
    const { params, body } = opts || {};
    if (state.dead) throw new Refused();
    const init = {
      method,
      headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(apiURL(path, params), init);
    } catch (_) {
      throw new APIError(0, "network", "The server could not be reached. Check your connection and try again.");
    }
    if (resp.status === 401) {
      refuse();
      throw new Refused();
    }
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (!resp.ok) {
      const e = data && data.error;
      throw new APIError(resp.status, e ? e.code : "http", e && e.message ? e.message : `The server answered ${resp.status}.`, e && e.field);
    }
    return data;
  }

  // tenantParam is the ?tenant an operator's listings are narrowed by.
  function tenantParam() {
    return state.me && state.me.admin && state.tenant ? state.tenant : undefined;
  }

  // allEndpoints reads every endpoint in view, for the pages that pick one.
  async function allEndpoints() {
    const out = [];
    let cursor;
    for (let i = 0; i < 20; i++) {
      const page = await api("GET", "/v1/endpoints", { params: { limit: 500, cursor, tenant: tenantParam() } });
      out.push(...page.data);
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    return out;
  }

  function endpointName(ep) {
    return ep.description ? `${ep.description} (${ep.url})` : ep.url;
  }

  // errorBox shows what went wrong with the API's own message; a refused session shows nothing
  // more, as the page already says so.
  function showError(box, err) {
    if (err instanceof Refused || state.dead) return;
    let msg = err && err.message ? err.message : String(err);
    if (!(err instanceof APIError)) msg = "Something went wrong on this page: " + msg;
    box.replaceChildren(h("p", { class: "error", role: "alert" }, msg));
  }

  // ---- Timers that end with their page -----------------------------------------------------

  function later(ms, fn) {
    const id = setTimeout(() => { state.timers.delete(id); fn(); }, ms);
    state.timers.add(id);
  }

  function sleep(ms) {
    return new Promise((resolve) => later(ms, resolve));
  }

  function stopTimers() {
    for (const id of state.timers) clearTimeout(id);
    state.timers.clear();
  }

  // every runs fn every ms while its page is shown.
  function every(ctx, ms, fn) {
    const tick = async () => {
      if (!ctx.alive()) return;
      try { await fn(); } catch (_) { /* the page shows its own errors */ }
      if (ctx.alive()) later(ms, tick);
    };
    later(ms, tick);
  }

  // ---- The session -------------------------------------------------------------------------

  // takeToken reads a link's #session=, keeps it for this tab and removes it from the address
  // bar (and so from the history and anything copied from it).
  function takeToken() {
    const m = /^#session=([^&]+)/.exec(location.hash);
    if (m) {
      let token = m[1];
      try { token = decodeURIComponent(token); } catch (_) { /* kept as it is */ }
      history.replaceState(null, "", location.pathname + location.search + "#/endpoints");
      // Only a portal session belongs in a link: an API key pasted into one is refused, so
      // that long-lived keys are never kept in URLs and histories.
      if (!token.startsWith("fhp_")) return "";
      try {
        sessionStorage.setItem(TOKEN_KEY, token);
        sessionStorage.removeItem(TENANT_KEY);
      } catch (_) { /* storage may be off: the token lives in memory */ }
      return token;
    }
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (_) { return state.token; }
  }

  function refuse() {
    state.dead = true;
    state.me = null;
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* nothing kept */ }
    stopTimers();
    document.getElementById("top").hidden = true;
    document.getElementById("announce").textContent = "";
    document.title = "Link expired · Webhooks";
    const h1 = h("h1", { class: "refused", tabindex: "-1" }, EXPIRED);
    document.getElementById("main").replaceChildren(h1);
    h1.focus();
  }

  async function start() {
    stopTimers();
    state.dead = false;
    state.seq++;
    state.token = takeToken();
    if (!state.token) {
      refuse();
      return;
    }
    const main = document.getElementById("main");
    main.replaceChildren(h("p", { class: "loading" }, "Loading…"));
    try {
      state.me = await api("GET", "/v1/me");
    } catch (e) {
      showError(main, e);
      return;
    }
    state.tenant = "";
    if (state.me.admin) {
      try { state.tenant = sessionStorage.getItem(TENANT_KEY) || ""; } catch (_) { /* every tenant */ }
    }
    buildHeader();
    render();
  }

  function buildHeader() {
    const me = state.me;
    const items = [["endpoints", "Endpoints"], ["deliveries", "Deliveries"], ["dead-letters", "Dead letters"]];
    if (me.admin) items.push(["status", "Status"]);
    document.getElementById("nav").replaceChildren(
      ...items.map(([path, label]) => h("li", null, h("a", { href: "#/" + path, "data-section": path }, label))));
    const who = document.getElementById("who");
    who.replaceChildren();
    if (me.admin) {
      const select = h("select", { id: "tenant-select" }, h("option", { value: "" }, "All tenants"));
      select.addEventListener("change", () => {
        state.tenant = select.value;
        try { sessionStorage.setItem(TENANT_KEY, state.tenant); } catch (_) { /* memory only */ }
        announce(state.tenant ? `Showing tenant ${state.tenant}` : "Showing every tenant");
        render();
      });
      who.append(h("span", null, "Operator"), h("label", { for: "tenant-select" }, "Tenant"), select);
      loadTenants(select);
    } else {
      who.append(h("span", null, "Tenant ", h("strong", null, me.tenant === null ? "(none)" : me.tenant)));
    }
    if (me.expires_at) {
      who.append(h("span", null, "Link valid until ", when(me.expires_at)));
    }
    document.getElementById("top").hidden = false;
  }

  async function loadTenants(select) {
    try {
      let cursor;
      for (let i = 0; i < 20; i++) {
        const page = await api("GET", "/v1/tenants", { params: { limit: 500, cursor } });
        for (const t of page.data) select.append(h("option", { value: t, selected: t === state.tenant }, t));
        if (!page.next_cursor) break;
        cursor = page.next_cursor;
      }
      if (state.tenant && select.value !== state.tenant) {
        // A tenant chosen earlier that has no endpoints any more: still the filter in force.
        select.append(h("option", { value: state.tenant, selected: true }, state.tenant));
      }
    } catch (e) {
      if (!(e instanceof Refused)) select.title = "The tenants could not be listed: " + e.message;
    }
  }

  // ---- Routing -----------------------------------------------------------------------------

  function route() {
    let hash = location.hash.replace(/^#/, "");
    if (!hash.startsWith("/")) hash = "/endpoints";
    const q = hash.indexOf("?");
    const path = q >= 0 ? hash.slice(0, q) : hash;
    const params = new URLSearchParams(q >= 0 ? hash.slice(q + 1) : "");
    const parts = path.split("/").filter(Boolean).map((p) => {
      try { return decodeURIComponent(p); } catch (_) { return p; }
    });
    return { parts, params };
  }

  function go(hash) {
    if (location.hash === hash) render();
    else location.hash = hash;
  }

  function render() {
    if (state.dead || !state.me) return;
    stopTimers();
    const seq = ++state.seq;
    const { parts, params } = route();
    const section = parts[0] || "endpoints";
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.section === section) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const page = h("div", { class: "page" });
    document.getElementById("main").replaceChildren(page);
    const ctx = { seq, page, params, alive: () => seq === state.seq && !state.dead };
    let title = "Not found";
    const [, id, sub] = parts;
    if (section === "endpoints" && !id) title = endpointsPage(ctx);
    else if (section === "endpoints" && id === "new" && !sub) title = endpointFormPage(ctx, null);
    else if (section === "endpoints" && !sub) title = endpointPage(ctx, id);
    else if (section === "endpoints" && sub === "edit") title = endpointFormPage(ctx, id);
    else if (section === "deliveries" && !id) title = deliveriesPage(ctx);
    else if (section === "deliveries" && !sub) title = deliveryPage(ctx, id);
    else if (section === "dead-letters" && !id) title = deadLettersPage(ctx);
    else if (section === "status" && !id && state.me.admin) title = statusPage(ctx);
    else {
      page.append(heading("Page not found"), h("p", null, "There is nothing here. ", h("a", { href: "#/endpoints" }, "Go to your endpoints"), "."));
    }
    document.title = title + " · Webhooks";
    const h1 = page.querySelector("h1");
    if (h1) h1.focus();
  }

  function heading(text) {
    return h("h1", { tabindex: "-1" }, text);
  }

  // ---- Lists that page -----------------------------------------------------------------------

  // dataTable is a table whose cells carry their column's name, so that on a narrow screen each
  // row reads as a card of labelled values.
  function dataTable(caption, columns) {
    const tbody = h("tbody");
    const table = h("table", { class: "data stack" },
      h("caption", { class: "visually-hidden" }, caption),
      h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col" }, c.label)))),
      tbody);
    const el = h("div", { class: "table-wrap", role: "region", "aria-label": caption, tabindex: "0" }, table);
    return {
      el,
      tbody,
      add(rows) {
        for (const r of rows) {
          // One wrapper per cell: on a narrow screen the cell is a grid of its label and this.
          tbody.append(h("tr", null, columns.map((c) => h("td", { "data-label": c.label, class: c.class }, h("div", { class: "cell" }, c.cell(r))))));
        }
      },
      clear() { tbody.replaceChildren(); },
      get size() { return tbody.rows.length; },
    };
  }

  // pagedList fills table from load(cursor) page by page, with "Load more" while the API has a
  // next page, and empty (a sentence saying what to do) when there is nothing.
  function pagedList(ctx, { table, load, empty }) {
    const err = h("div");
    const more = h("button", { type: "button", class: "btn more", hidden: true }, "Load more");
    const emptyEl = h("p", { class: "empty", hidden: true }, empty);
    const loading = h("p", { class: "loading" }, "Loading…");
    const el = h("div", null, loading, emptyEl, table.el, more, err);
    table.el.hidden = true;
    let cursor = null;
    let pages = 0;
    let busy = false;
    async function fetchPage(reset) {
      if (busy) return;
      busy = true;
      more.disabled = true;
      try {
        const page = await load(reset ? undefined : cursor);
        if (!ctx.alive()) return;
        err.replaceChildren();
        if (reset) table.clear();
        const before = table.size;
        table.add(page.data);
        pages = reset ? 1 : pages + 1;
        cursor = page.next_cursor;
        more.hidden = !cursor;
        emptyEl.hidden = table.size > 0;
        table.el.hidden = table.size === 0;
        if (!reset && before > 0) {
          announce(`${page.data.length} more loaded`);
          if (!cursor) table.el.focus();
        }
      } catch (e) {
        showError(err, e);
      } finally {
        busy = false;
        more.disabled = false;
        loading.remove();
      }
    }
    more.addEventListener("click", () => fetchPage(false));
    return {
      el,
      load: () => fetchPage(true),
      // refresh reloads the first page unless the reader has loaded more or is inside the list.
      refresh: () => (pages <= 1 && !el.contains(document.activeElement) ? fetchPage(true) : null),
    };
  }

  // ---- Endpoints ---------------------------------------------------------------------------

  function health(ep) {
    if (!ep.enabled) {
      return [h("span", { class: "badge" }, "Disabled"), ep.disabled_reason ? h("span", { class: "desc" }, ep.disabled_reason) : null];
    }
    if (ep.failing_since) {
      return [h("span", { class: "badge fail" }, "Failing"), h("span", { class: "desc" }, "since ", when(ep.failing_since))];
    }
    if (ep.last_success_at) {
      return [h("span", { class: "badge ok" }, "Healthy"), h("span", { class: "desc" }, "last success ", when(ep.last_success_at))];
    }
    return h("span", { class: "badge" }, "No deliveries yet");
  }

  function eventTypes(ep) {
    return ep.event_types.length ? ep.event_types.join(", ") : "All events";
  }

  function endpointsPage(ctx) {
    const { page } = ctx;
    page.append(
      heading("Endpoints"),
      h("p", { class: "lead" }, "Where your webhooks are sent. Each endpoint has its own signing secret and receives the event types it asks for."),
      h("div", { class: "actions" }, h("a", { class: "btn btn-primary", href: "#/endpoints/new" }, "Add endpoint")));
    if (state.me.admin) {
      page.append(h("p", { class: "muted" }, state.tenant ? `Tenant ${state.tenant}.` : "Every tenant's endpoints."));
    }
    const columns = [
      { label: "Endpoint", cell: (ep) => [h("a", { href: "#/endpoints/" + enc(ep.id), class: "url" }, ep.url), ep.description ? h("span", { class: "desc" }, ep.description) : null] },
      { label: "Events", cell: eventTypes },
      { label: "Health", cell: health },
    ];
    if (state.me.admin && !state.tenant) columns.push({ label: "Tenant", cell: (ep) => (ep.tenant === null ? "—" : ep.tenant) });
    const table = dataTable("Endpoints", columns);
    const list = pagedList(ctx, {
      table,
      empty: "No endpoints yet: add one to start receiving webhooks.",
      load: (cursor) => api("GET", "/v1/endpoints", { params: { limit: PAGE, cursor, tenant: tenantParam() } }),
    });
    page.append(list.el);
    list.load();
    every(ctx, 10000, list.refresh);
    return "Endpoints";
  }

  function field(id, label, input, hint) {
    input.id = id;
    const err = h("p", { class: "field-error", id: id + "-error", hidden: true });
    const hintEl = hint ? h("p", { class: "hint", id: id + "-hint" }, hint) : null;
    input.setAttribute("aria-describedby", (hint ? id + "-hint " : "") + id + "-error");
    return { el: h("div", { class: "field" }, h("label", { for: id }, label), hintEl, input, err), input, err };
  }

  function options(values, current) {
    return values.map(([v, label]) => h("option", { value: v, selected: v === current }, label));
  }

  function parseTypes(text) {
    return text.split(/[\s,]+/).filter(Boolean);
  }

  // endpointFormPage adds an endpoint (id null) or edits one.
  function endpointFormPage(ctx, id) {
    const { page } = ctx;
    const editing = id !== null;
    const back = editing ? "#/endpoints/" + enc(id) : "#/endpoints";
    page.append(
      h("p", { class: "crumbs" }, h("a", { href: back }, editing ? "← Endpoint" : "← Endpoints")),
      heading(editing ? "Edit endpoint" : "Add an endpoint"));
    const body = h("div", null, h("p", { class: "loading" }, "Loading…"));
    page.append(body);
    const build = (ep, fixedTenant) => {
      const f = {
        url: field("ep-url", "URL", h("input", { type: "url", required: true, autocomplete: "off", spellcheck: "false", placeholder: "https://example.com/webhooks", value: ep ? ep.url : "" }),
          "The address fluxhook sends each event to, with a POST request."),
        description: field("ep-description", "Description (optional)", h("input", { type: "text", value: ep ? ep.description : "" }),
          "A name your team will recognise, such as “Billing service”."),
        event_types: field("ep-types", "Event types (optional)", h("input", { type: "text", spellcheck: "false", placeholder: "order.*, invoice.paid", value: ep ? ep.event_types.join(", ") : "" }),
          "Separate them with commas. order.* takes every type starting with “order.”. Leave empty to receive every event."),
        scheme: field("ep-scheme", "Signature scheme", h("select", null, options([
          ["fluxora", "Fluxora (x-fluxora-signature)"], ["standard", "Standard Webhooks (webhook-signature)"]], ep ? ep.scheme : "fluxora")),
        editing ? "Changing the scheme gives the endpoint a new secret, shown once." : "How each request is signed; your consumer verifies it with the endpoint's secret."),
        ordering: field("ep-ordering", "Ordering", h("select", null, options([
          ["none", "Any order (fastest)"], ["stream", "In order within each stream"]], ep ? ep.ordering : "none")),
        "“In order” sends one event of a stream at a time, each after the one before it has been delivered."),
      };
      if (!editing && state.me.admin && fixedTenant === "") {
        f.tenant = field("ep-tenant", "Tenant (optional)", h("input", { type: "text", spellcheck: "false" }),
          "The tenant whose events this endpoint receives; leave empty for events without a tenant.");
      }
      const errBox = h("div");
      const submit = h("button", { type: "submit", class: "btn btn-primary" }, editing ? "Save changes" : "Add endpoint");
      const form = h("form", { class: "stacked", novalidate: true },
        Object.values(f).map((x) => x.el), errBox,
        h("div", { class: "actions" }, submit, h("a", { class: "btn", href: back }, "Cancel")));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        errBox.replaceChildren();
        for (const x of Object.values(f)) {
          x.err.hidden = true;
          x.err.textContent = "";
          x.input.removeAttribute("aria-invalid");
        }
        const url = f.url.input.value.trim();
        if (!url) {
          fieldError(f.url, "Enter the URL to send events to.");
          return;
        }
        const values = {
          url,
          description: f.description.input.value.trim(),
          event_types: parseTypes(f.event_types.input.value),
          scheme: f.scheme.input.value,
          ordering: f.ordering.input.value,
        };
        let bodyOut = values;
        if (editing) {
          bodyOut = {};
          if (values.url !== ep.url) bodyOut.url = values.url;
          if (values.description !== ep.description) bodyOut.description = values.description;
          if (values.event_types.join(",") !== ep.event_types.join(",")) bodyOut.event_types = values.event_types;
          if (values.scheme !== ep.scheme) bodyOut.scheme = values.scheme;
          if (values.ordering !== ep.ordering) bodyOut.ordering = values.ordering;
          if (Object.keys(bodyOut).length === 0) {
            go(back);
            return;
          }
        } else if (fixedTenant) {
          bodyOut.tenant = fixedTenant;
        } else if (f.tenant && f.tenant.input.value.trim()) {
          bodyOut.tenant = f.tenant.input.value.trim();
        }
        submit.disabled = true;
        submit.textContent = "Saving…";
        try {
          const saved = editing
            ? await api("PATCH", "/v1/endpoints/" + enc(id), { body: bodyOut })
            : await api("POST", "/v1/endpoints", { body: bodyOut });
          if (saved.secret) {
            state.secret = { endpointID: saved.id, secret: saved.secret, why: editing ? "The endpoint has a new secret for its new scheme." : "The endpoint is ready." };
          }
          announce(editing ? "Endpoint saved" : "Endpoint added");
          go("#/endpoints/" + enc(saved.id));
        } catch (e) {
          if (!ctx.alive()) return;
          const target = e instanceof APIError && e.field && f[e.field];
          if (target) fieldError(target, e.message);
          else showError(errBox, e);
        } finally {
          submit.disabled = false;
          submit.textContent = editing ? "Save changes" : "Add endpoint";
        }
      });
      body.replaceChildren(form);
      f.url.input.focus();
    };
    if (editing) {
      api("GET", "/v1/endpoints/" + enc(id)).then((ep) => { if (ctx.alive()) build(ep, null); }, (e) => showError(body, e));
    } else {
      build(null, state.me.admin ? state.tenant : null);
    }
    return editing ? "Edit endpoint" : "Add an endpoint";
  }

  function fieldError(f, message) {
    f.err.textContent = message;
    f.err.hidden = false;
    f.input.setAttribute("aria-invalid", "true");
    f.input.focus();
  }

  function secretPanel(secret, why) {
    const code = h("code", { id: "secret-value", class: "secret" }, secret);
    const out = h("p", { role: "status", class: "hint" });
    const copy = h("button", { type: "button", class: "btn btn-primary", id: "copy-secret" }, "Copy");
    copy.addEventListener("click", () => copyText(code, out));
    return h("section", { class: "panel secret-panel", "aria-labelledby": "secret-heading" },
      h("h2", { id: "secret-heading" }, "Signing secret"),
      h("p", null, why, " The secret is shown only this once: copy it now and keep it where your webhook consumer verifies signatures."),
      h("div", { class: "secret-row" }, code, copy), out);
  }

  async function copyText(code, out) {
    const text = code.textContent;
    try {
      // Bounded: a browser may leave the write pending (a page without focus, a permission
      // never answered); the person then gets the selection instead of no answer at all.
      await Promise.race([navigator.clipboard.writeText(text),
        new Promise((_, reject) => setTimeout(() => reject(new Error("clipboard timeout")), 1500))]);
      out.textContent = "Copied to the clipboard.";
      return;
    } catch (_) { /* no clipboard here (an iframe without clipboard-write, an old browser) */ }
    const range = document.createRange();
    range.selectNodeContents(code);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    let copied = false;
    try { copied = document.execCommand("copy"); } catch (_) { copied = false; }
    out.textContent = copied ? "Copied to the clipboard." : "The secret is selected: press Ctrl+C (⌘C on a Mac) to copy it.";
  }

  function endpointPage(ctx, id) {
    const { page } = ctx;
    const title = heading("Endpoint");
    const subtitle = h("p", { class: "subtitle url" });
    const secretBox = h("div");
    const actions = h("div", { class: "actions" });
    const panelBox = h("div");
    const result = h("div", { role: "status", "aria-live": "polite" });
    const errBox = h("div");
    const details = h("div", null, h("p", { class: "loading" }, "Loading…"));
    const chartBox = h("div", null, h("p", { class: "loading" }, "Loading…"));
    const recent = h("div");
    page.append(h("p", { class: "crumbs" }, h("a", { href: "#/endpoints" }, "← Endpoints")), title, subtitle,
      secretBox, actions, panelBox, result, errBox, details,
      h("h2", { id: "chart-heading" }, "Last 24 hours"), chartBox,
      h("h2", null, "Recent deliveries"), recent);

    if (state.secret && state.secret.endpointID === id) {
      secretBox.append(secretPanel(state.secret.secret, state.secret.why));
      state.secret = null;
    }

    let ep = null;
    const button = (label, fn, cls) => {
      const b = h("button", { type: "button", class: "btn " + (cls || "") }, label);
      b.addEventListener("click", async () => {
        errBox.replaceChildren();
        b.disabled = true;
        try { await fn(b); } catch (e) { showError(errBox, e); } finally { b.disabled = false; }
      });
      return b;
    };

    const drawActions = () => {
      actions.replaceChildren(
        button("Send test event", () => sendTest(ctx, ep, result), "btn-primary"),
        h("a", { class: "btn", href: "#/endpoints/" + enc(id) + "/edit" }, "Edit"),
        button("Rotate secret", () => showRotate()),
        ep.enabled ? button("Disable", () => showDisable(), "btn-danger") : button("Enable", async () => {
          ep = await api("POST", `/v1/endpoints/${enc(id)}/enable`);
          result.replaceChildren(h("p", { class: "result ok" }, "The endpoint is enabled: new events are sent to it again."));
          draw();
        }));
    };

    const closePanel = (focusLabel) => {
      panelBox.replaceChildren();
      const b = [...actions.querySelectorAll("button")].find((x) => x.textContent === focusLabel);
      if (b) b.focus();
    };

    const showRotate = () => {
      const grace = field("rotate-grace", "The current secret", h("select", null, options([
        ["86400", "Keeps signing beside the new one for 24 hours"], ["3600", "Keeps signing beside the new one for 1 hour"],
        ["0", "Stops at once"]], "86400")),
      "During the overlap each request carries both signatures, so your consumer can switch without failing any.");
      const submitBtn = h("button", { type: "submit", class: "btn btn-primary" }, "Rotate now");
      const cancel = h("button", { type: "button", class: "btn" }, "Cancel");
      cancel.addEventListener("click", () => closePanel("Rotate secret"));
      const form = h("form", { class: "panel inline-form", "aria-labelledby": "rotate-h" },
        h("h2", { id: "rotate-h" }, "Rotate the secret"), grace.el, h("div", { class: "actions" }, submitBtn, cancel));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        submitBtn.disabled = true;
        try {
          const out = await api("POST", `/v1/endpoints/${enc(id)}/rotate-secret`, { body: { grace_seconds: Number(grace.input.value) } });
          panelBox.replaceChildren();
          secretBox.replaceChildren(secretPanel(out.secret, "The endpoint has a new secret."));
          ep = out;
          draw();
          secretBox.querySelector("#copy-secret").focus();
        } catch (e) {
          showError(errBox, e);
        } finally {
          submitBtn.disabled = false;
        }
      });
      panelBox.replaceChildren(form);
      grace.input.focus();
    };

    const showDisable = () => {
      const reason = field("disable-reason", "Reason (optional)", h("input", { type: "text" }), "Shown with the endpoint, so that your team knows why.");
      const submitBtn = h("button", { type: "submit", class: "btn btn-danger" }, "Disable endpoint");
      const cancel = h("button", { type: "button", class: "btn" }, "Cancel");
      cancel.addEventListener("click", () => closePanel("Disable"));
      const form = h("form", { class: "panel inline-form", "aria-labelledby": "disable-h" },
        h("h2", { id: "disable-h" }, "Disable this endpoint"),
        h("p", null, "No new events are sent to it until you enable it again."), reason.el, h("div", { class: "actions" }, submitBtn, cancel));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        submitBtn.disabled = true;
        try {
          const r = reason.input.value.trim();
          ep = await api("POST", `/v1/endpoints/${enc(id)}/disable`, r ? { body: { reason: r } } : {});
          panelBox.replaceChildren();
          result.replaceChildren(h("p", { class: "result" }, "The endpoint is disabled."));
          draw();
        } catch (e) {
          showError(errBox, e);
        } finally {
          submitBtn.disabled = false;
        }
      });
      panelBox.replaceChildren(form);
      reason.input.focus();
    };

    const draw = () => {
      drawActions();
      drawDetails();
    };

    const drawDetails = () => {
      title.textContent = ep.description || "Endpoint";
      subtitle.textContent = ep.url;
      document.title = (ep.description || ep.url) + " · Webhooks";
      const status = ep.enabled ? h("span", { class: "badge ok" }, "Enabled")
        : [h("span", { class: "badge" }, "Disabled"), ep.disabled_at ? [" since ", when(ep.disabled_at)] : null, ep.disabled_reason ? h("span", { class: "desc" }, ep.disabled_reason) : null];
      const facts = [
        ["URL", h("span", { class: "url" }, ep.url)],
        ["Status", status],
        ["Health", health(ep)],
        ["Event types", eventTypes(ep)],
        ["Signature scheme", ep.scheme === "standard" ? "Standard Webhooks" : "Fluxora"],
        ["Ordering", ep.ordering === "stream" ? "In order within each stream" : "Any order"],
        ["Last success", when(ep.last_success_at)],
        ["Failing since", when(ep.failing_since)],
        ["Created", when(ep.created_at)],
        ["Endpoint id", h("span", { class: "id" }, ep.id)],
      ];
      if (state.me.admin) facts.push(["Tenant", ep.tenant === null ? "—" : ep.tenant]);
      details.replaceChildren(h("h2", { class: "visually-hidden" }, "Details"),
        h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", null, k), h("dd", null, v)])),
        h("p", null, h("a", { href: "#/dead-letters?endpoint=" + enc(id) }, "This endpoint's dead letters, and recovery"), " · ",
          h("a", { href: "#/deliveries?endpoint=" + enc(id) }, "All its deliveries")));
    };

    let lastHealth = null;
    const drawChart = () => {
      const open = chartBox.querySelector("details[open]") !== null;
      chartBox.replaceChildren(hourlyChart(lastHealth.hours, chartBox.clientWidth, open),
        h("p", { class: "hint" }, "Circuit breaker: ", breakerText(lastHealth.breaker)));
    };
    const loadHealth = async () => {
      const hl = await api("GET", `/v1/endpoints/${enc(id)}/health`);
      if (!ctx.alive()) return;
      lastHealth = hl;
      if (!chartBox.contains(document.activeElement)) drawChart();
    };
    // The chart is drawn at the width it is shown at: drawn again when that changes.
    let drawnAt = 0;
    const onResize = () => {
      if (!ctx.alive()) {
        window.removeEventListener("resize", onResize);
        return;
      }
      if (lastHealth && Math.abs(chartBox.clientWidth - drawnAt) > 20 && !chartBox.contains(document.activeElement)) {
        drawnAt = chartBox.clientWidth;
        drawChart();
      }
    };
    window.addEventListener("resize", onResize);

    const recentTable = dataTable("Recent deliveries", deliveryColumns());
    const recentList = pagedList(ctx, {
      table: recentTable,
      empty: "No deliveries in the last 24 hours. Send a test event to try the endpoint.",
      load: (cursor) => api("GET", `/v1/endpoints/${enc(id)}/deliveries`, { params: { limit: 10, cursor } }),
    });
    recent.append(recentList.el);

    api("GET", "/v1/endpoints/" + enc(id)).then((e) => {
      if (!ctx.alive()) return;
      ep = e;
      draw();
      loadHealth().catch((err) => showError(chartBox, err));
      recentList.load();
      every(ctx, 5000, async () => {
        const fresh = await api("GET", "/v1/endpoints/" + enc(id));
        if (!ctx.alive()) return;
        const changed = fresh.enabled !== ep.enabled;
        ep = fresh;
        if (!details.contains(document.activeElement)) drawDetails();
        if (changed && !actions.contains(document.activeElement)) drawActions();
        await loadHealth();
        recentList.refresh();
      });
    }, (e) => {
      details.replaceChildren();
      chartBox.replaceChildren();
      showError(errBox, e);
    });
    return "Endpoint";
  }

  function breakerText(b) {
    switch (b.state) {
      case "closed": return "closed (requests flow)";
      case "open": return `open after ${b.consecutive_failures} failures in a row: requests wait before the next try`;
      case "half_open": return "half open (one trial request decides)";
      default: return "not reported here";
    }
  }

  // sendTest sends a webhook.test event and follows it until the endpoint answers.
  async function sendTest(ctx, ep, out) {
    out.replaceChildren(h("p", { class: "result" }, "Sending a test event…"));
    let t;
    try {
      t = await api("POST", `/v1/endpoints/${enc(ep.id)}/test`);
    } catch (e) {
      out.replaceChildren(); // the error is shown with the actions
      throw e;
    }
    const link = () => h("a", { href: "#/deliveries/" + enc(t.delivery_id) }, "See the delivery");
    const deadline = Date.now() + 60000;
    let wait = 250;
    while (ctx.alive()) {
      const d = await api("GET", "/v1/deliveries/" + enc(t.delivery_id));
      if (!ctx.alive()) return;
      const dst = d.destinations.find((x) => x.endpoint_id === ep.id) || d.destinations[0];
      const last = dst && dst.attempts.length ? dst.attempts[dst.attempts.length - 1] : null;
      const answer = (a) => (a.status_code ? `answered ${a.status_code}` : `did not answer (${a.error || "no response"})`)
        + (a.duration_ms !== null ? ` in ${a.duration_ms} ms` : "");
      if (dst && dst.state === "delivered" && last) {
        out.replaceChildren(h("p", { class: "result ok" }, `Test event delivered: the endpoint ${answer(last)}. `, link()));
        return;
      }
      if (dst && last && (dst.state === "dead_lettered" || last.outcome !== "delivered")) {
        const then = dst.state === "dead_lettered" ? "It was dead-lettered." : "fluxhook will retry it.";
        out.replaceChildren(h("p", { class: "result fail" }, `Test event failed: the endpoint ${answer(last)}. ${then} `, link()));
        return;
      }
      if (Date.now() > deadline) {
        out.replaceChildren(h("p", { class: "result" }, "The test event is queued but no dispatcher has sent it yet. ", link()));
        return;
      }
      out.replaceChildren(h("p", { class: "result" }, "Test event sent; waiting for the endpoint's answer…"));
      await sleep(wait);
      wait = Math.min(wait * 1.5, 2000);
    }
  }

  // hourlyChart draws the last day's outcomes per hour as stacked bars (succeeded below, failed
  // above), with a title and a description for screen readers and the numbers as a table.
  function hourlyChart(hours, width, open) {
    // Drawn at the width it is shown at (up to 640 px), so that its text keeps its size.
    const W = Math.round(Math.min(640, Math.max(280, width || 640))), H = 200, L = 36, R = 8, T = 10, B = 26;
    const n = Math.max(hours.length, 1);
    const slot = (W - L - R) / n;
    const peak = Math.max(1, ...hours.map((x) => x.succeeded + x.failed));
    const step = Math.pow(10, Math.floor(Math.log10(peak)));
    const top = Math.ceil(peak / step) * step;
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const ok = hours.reduce((a, x) => a + x.succeeded, 0);
    const failed = hours.reduce((a, x) => a + x.failed, 0);
    const hourLabel = (iso) => new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const desc = ok + failed === 0
      ? "No attempts in the last 24 hours."
      : `${ok} attempts succeeded and ${failed} failed in the last 24 hours; the busiest hour had ${peak}.`;
    const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": "chart-title chart-desc", focusable: "false" },
      svg("title", { id: "chart-title" }, "Attempts per hour over the last 24 hours"),
      svg("desc", { id: "chart-desc" }, desc));
    const ticks = Number.isInteger(top / 2) ? [0, top / 2, top] : [0, top];
    for (const v of ticks) {
      g.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }),
        svg("text", { class: "axis", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, v));
    }
    const last = hours.length - 1;
    const labelStep = W < 480 ? 12 : 6; // hours between labels: fewer on a narrow screen
    const axisLabel = (iso) => new Date(iso).toLocaleTimeString([], { hour: "numeric" });
    hours.forEach((x, i) => {
      const x0 = L + i * slot + slot * 0.15;
      const w = slot * 0.7;
      const bar = svg("g", null, svg("title", null, `${hourLabel(x.hour)}: ${x.succeeded} succeeded, ${x.failed} failed`));
      if (x.succeeded > 0) bar.append(svg("rect", { class: "bar-ok", x: x0, width: w, y: y(x.succeeded), height: y(0) - y(x.succeeded) }));
      if (x.failed > 0) bar.append(svg("rect", { class: "bar-fail", x: x0, width: w, y: y(x.succeeded + x.failed), height: y(x.succeeded) - y(x.succeeded + x.failed) }));
      g.append(bar);
      if (i % labelStep === 0) {
        // The first and the last label are anchored inside the chart, not centred past its edges.
        const anchor = i === 0 ? "start" : i === last ? "end" : "middle";
        const at = i === 0 ? x0 : i === last ? x0 + w : x0 + w / 2;
        g.append(svg("text", { class: "axis", x: at, y: H - 8, "text-anchor": anchor }, axisLabel(x.hour)));
      }
    });
    const rows = hours.map((x) => h("tr", null, h("th", { scope: "row" }, new Date(x.hour).toLocaleString([], { dateStyle: "short", timeStyle: "short" })),
      h("td", { class: "num" }, x.succeeded), h("td", { class: "num" }, x.failed)));
    return h("div", { class: "chart" },
      g,
      h("ul", { class: "legend", "aria-hidden": "true" },
        h("li", null, h("span", { class: "swatch ok" }), `Succeeded (${ok})`),
        h("li", null, h("span", { class: "swatch fail" }), `Failed (${failed})`)),
      h("details", { open }, h("summary", null, "Show the numbers"),
        h("div", { class: "table-wrap" }, h("table", { class: "data" },
          h("caption", { class: "visually-hidden" }, "Attempts per hour"),
          h("thead", null, h("tr", null, h("th", { scope: "col" }, "Hour"), h("th", { scope: "col" }, "Succeeded"), h("th", { scope: "col" }, "Failed"))),
          h("tbody", null, rows)))));
  }

  // ---- Deliveries --------------------------------------------------------------------------

  function deliveryColumns() {
    return [
      { label: "Time", class: "time", cell: (d) => (d.processed_at ? when(d.processed_at) : ["due ", when(d.next_attempt_at)]) },
      { label: "Event", cell: (d) => d.event_type },
      { label: "Delivery", cell: (d) => deliveryLink(d.delivery_id) },
      { label: "Attempt", class: "num", cell: (d) => d.attempt },
      { label: "Result", class: "time", cell: (d) => [badge(d.status), d.status_code ? " " + d.status_code : null] },
      { label: "Duration", class: "num", cell: (d) => (d.duration_ms === null ? "—" : `${d.duration_ms} ms`) },
      { label: "Error", cell: (d) => (d.error ? h("span", { class: "small" }, d.error) : "—") },
    ];
  }

  function deliveriesPage(ctx) {
    const { page, params } = ctx;
    const f = {
      endpoint: params.get("endpoint") || "",
      event_type: params.get("event_type") || "",
      status: params.get("status") || "",
      since: params.get("since") || "",
      until: params.get("until") || "",
    };
    page.append(heading("Deliveries"),
      h("p", { class: "lead" }, "Every event sent to your endpoints, and every attempt. Choose an endpoint to see its attempts and filter them by result."));

    const endpointSel = h("select", null, h("option", { value: "" }, "All endpoints (events)"));
    if (f.endpoint) endpointSel.append(h("option", { value: f.endpoint, selected: true }, f.endpoint));
    const statusSel = h("select", { disabled: !f.endpoint }, options([["", "Any result"], ["delivered", "Delivered"], ["failed", "Failed, retried"],
      ["pending", "Pending"], ["dead_lettered", "Dead-lettered"]], f.status));
    const fields = {
      endpoint: field("f-endpoint", "Endpoint", endpointSel),
      event_type: field("f-type", "Event type", h("input", { type: "text", spellcheck: "false", value: f.event_type, placeholder: "order.paid" })),
      status: field("f-status", "Result", statusSel, "Choose an endpoint first."),
      since: field("f-since", "From", h("input", { type: "datetime-local", value: localInput(f.since) }), "Default: 24 hours ago."),
      until: field("f-until", "To", h("input", { type: "datetime-local", value: localInput(f.until) })),
    };
    const statusHint = fields.status.el.querySelector(".hint");
    statusHint.hidden = Boolean(f.endpoint);
    endpointSel.addEventListener("change", () => {
      statusSel.disabled = !endpointSel.value;
      statusHint.hidden = Boolean(endpointSel.value);
    });
    const form = h("form", { class: "filter-form" },
      h("fieldset", null, h("legend", null, "Filter"),
        h("div", { class: "filters" }, Object.values(fields).map((x) => x.el)),
        h("div", { class: "actions" }, h("button", { type: "submit", class: "btn btn-primary" }, "Apply"),
          h("a", { class: "btn", href: "#/deliveries" }, "Clear"))));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      const put = (k, v) => { if (v) q.set(k, v); };
      put("endpoint", endpointSel.value);
      put("event_type", fields.event_type.input.value.trim());
      if (endpointSel.value) put("status", statusSel.value);
      put("since", isoFromLocal(fields.since.input.value));
      put("until", isoFromLocal(fields.until.input.value));
      const s = q.toString();
      go("#/deliveries" + (s ? "?" + s : ""));
    });
    page.append(form);

    allEndpoints().then((eps) => {
      if (!ctx.alive()) return;
      endpointSel.replaceChildren(h("option", { value: "" }, "All endpoints (events)"),
        ...eps.map((ep) => h("option", { value: ep.id, selected: ep.id === f.endpoint }, endpointName(ep))));
      if (f.endpoint && !eps.some((ep) => ep.id === f.endpoint)) endpointSel.append(h("option", { value: f.endpoint, selected: true }, f.endpoint));
    }, () => { /* the list below shows the error */ });

    let list;
    const common = { event_type: f.event_type, since: f.since, until: f.until };
    if (f.endpoint) {
      list = pagedList(ctx, {
        table: dataTable("Attempts", deliveryColumns()),
        empty: "No deliveries match these filters. Widen the time range, or send a test event from the endpoint's page.",
        load: (cursor) => api("GET", `/v1/endpoints/${enc(f.endpoint)}/deliveries`, { params: { ...common, limit: PAGE, cursor, status: f.status } }),
      });
    } else {
      const columns = [
        { label: "Time", class: "time", cell: (e) => when(e.enqueued_at) },
        { label: "Event", cell: (e) => e.event_type },
        { label: "Delivery", cell: (e) => deliveryLink(e.delivery_id) },
        { label: "Stream", cell: (e) => (e.stream_id === null ? "—" : e.stream_id) },
      ];
      if (state.me.admin && !state.tenant) columns.push({ label: "Tenant", cell: (e) => (e.tenant === null ? "—" : e.tenant) });
      list = pagedList(ctx, {
        table: dataTable("Events", columns),
        empty: "No events in this time range. Events your application sends appear here; open one to see where it went.",
        load: (cursor) => api("GET", "/v1/events", { params: { ...common, limit: PAGE, cursor, tenant: tenantParam() } }),
      });
    }
    page.append(h("h2", null, f.endpoint ? "Attempts" : "Events"), list.el);
    list.load();
    if (!f.until) every(ctx, 5000, list.refresh);
    return "Deliveries";
  }

  function deliveryPage(ctx, id) {
    const { page } = ctx;
    const title = heading("Delivery");
    const facts = h("div", null, h("p", { class: "loading" }, "Loading…"));
    const result = h("div", { role: "status", "aria-live": "polite" });
    const errBox = h("div");
    const dests = h("div");
    const payload = h("div");
    page.append(h("p", { class: "crumbs" }, h("a", { href: "#/deliveries" }, "← Deliveries")), title, facts, result, errBox, dests,
      h("h2", null, "Payload"), payload);
    const names = new Map();

    const nameOf = async (dst) => {
      if (dst.destination !== "endpoint") return null;
      if (!names.has(dst.endpoint_id)) {
        names.set(dst.endpoint_id, api("GET", "/v1/endpoints/" + enc(dst.endpoint_id)).catch(() => null));
      }
      return names.get(dst.endpoint_id);
    };

    const replay = async (dl, b) => {
      errBox.replaceChildren();
      b.disabled = true;
      try {
        await api("POST", `/v1/dead-letters/${dl.id}/replay`);
        result.replaceChildren(h("p", { class: "result ok" }, "Replayed: fluxhook sends the event again, with the same delivery id."));
        await load();
        follow();
      } catch (e) {
        showError(errBox, e);
        b.disabled = false;
      }
    };

    const attemptsTable = (dst) => {
      if (!dst.attempts.length) return h("p", { class: "muted" }, "No attempt yet.");
      const t = dataTable("Attempts", [
        { label: "#", class: "num", cell: (a) => a.attempt },
        { label: "Time", class: "time", cell: (a) => when(a.processed_at) },
        { label: "Result", cell: (a) => badge(a.outcome) },
        { label: "Status", class: "num", cell: (a) => (a.status_code === null ? "—" : a.status_code) },
        { label: "Duration", class: "num", cell: (a) => (a.duration_ms === null ? "—" : `${a.duration_ms} ms`) },
        { label: "Error", cell: (a) => (a.error ? h("span", { class: "small" }, a.error) : "—") },
        { label: "Response", cell: (a) => (a.response_excerpt === null ? h("span", { class: "muted" }, "not recorded")
            : a.response_excerpt === "" ? h("span", { class: "muted" }, "empty body")
            : h("pre", { class: "excerpt" }, a.response_excerpt)) },
      ]);
      t.add(dst.attempts);
      return t.el;
    };

    let busy = false;
    const load = async () => {
      if (busy) return null;
      busy = true;
      try {
        const d = await api("GET", "/v1/deliveries/" + enc(id));
        if (!ctx.alive()) return d;
        const eps = await Promise.all(d.destinations.map(nameOf));
        if (!ctx.alive()) return d;
        title.textContent = d.event_type;
        document.title = d.event_type + " · Webhooks";
        facts.replaceChildren(h("dl", { class: "facts" },
          [["Delivery id", h("span", { class: "id" }, d.delivery_id)], ["Event type", d.event_type],
            ["Stream", d.stream_id === null ? "—" : d.stream_id], ["Enqueued", when(d.enqueued_at)],
            state.me.admin ? ["Tenant", d.tenant === null ? "—" : d.tenant] : null]
            .filter(Boolean).map(([k, v]) => [h("dt", null, k), h("dd", null, v)])));
        const focused = document.activeElement;
        const keepFocus = dests.contains(focused) ? focused.id : null;
        dests.replaceChildren(...(d.destinations.length ? d.destinations.map((dst, i) => {
          const ep = eps[i];
          let to;
          if (dst.destination === "endpoint") {
            to = ep ? h("a", { href: "#/endpoints/" + enc(dst.endpoint_id), class: "url" }, ep.description || ep.url) : "a removed endpoint";
          } else if (dst.destination === "endpoint_url") {
            to = dst.origin ? h("span", { class: "url" }, dst.origin + " (the event's own URL)") : "the event's own URL";
          } else {
            to = dst.origin ? h("span", { class: "url" }, dst.origin) : "the default URL";
          }
          const stateLine = [badge(dst.state)];
          if ((dst.state === "retrying" || dst.state === "pending") && dst.next_attempt_at) stateLine.push(" next attempt ", when(dst.next_attempt_at));
          const dl = dst.dead_letter;
          let dlBox = null;
          if (dl) {
            const b = h("button", { type: "button", class: "btn btn-primary btn-small", id: "replay-" + dl.id }, dl.replayed_at ? "Replay again" : "Replay");
            b.addEventListener("click", () => replay(dl, b));
            dlBox = h("div", { class: "panel" },
              h("p", null, "Dead-lettered ", when(dl.failed_at), ": ", dl.reason, "."),
              dl.replayed_at ? h("p", null, "Replayed ", when(dl.replayed_at), ".") : null,
              dl.replayed_at ? null : b);
          }
          return h("section", { class: "destination", "aria-label": "Destination " + (i + 1) },
            h("h2", null, "To ", to),
            h("p", null, stateLine, dst.attempt_count ? ` · ${dst.attempt_count} attempt${dst.attempt_count === 1 ? "" : "s"}` : null),
            dlBox, attemptsTable(dst));
        }) : [h("p", { class: "empty" }, d.routed_at ? "No endpoint took this event: none matched its type." : "Waiting to be routed to your endpoints.")]));
        if (keepFocus) {
          const again = document.getElementById(keepFocus);
          if (again) again.focus();
        }
        return d;
      } finally {
        busy = false;
      }
    };

    // follow refreshes while a destination is still pending or retrying.
    const follow = () => {
      const tick = async () => {
        if (!ctx.alive()) return;
        try {
          const d = await load();
          if (d && d.destinations.some((x) => x.state === "pending" || x.state === "retrying")) later(1000, tick);
          else if (d && !d.routed_at) later(1000, tick);
        } catch (e) {
          showError(errBox, e);
        }
      };
      later(1000, tick);
    };

    load().then((d) => {
      if (d) follow();
    }, (e) => {
      facts.replaceChildren();
      showError(errBox, e);
    });
    api("GET", "/v1/events/" + enc(id)).then((ev) => {
      if (!ctx.alive()) return;
      payload.replaceChildren(h("pre", { class: "payload", tabindex: "0", "aria-label": "Payload" }, JSON.stringify(ev.payload, null, 2)));
    }, (e) => showError(payload, e));
    return "Delivery";
  }

  // ---- Dead letters ------------------------------------------------------------------------

  function deadLettersPage(ctx) {
    const { page, params } = ctx;
    const endpoint = params.get("endpoint") || "";
    const replayed = params.get("replayed") || "";
    page.append(heading("Dead letters"),
      h("p", { class: "lead" }, "Deliveries fluxhook gave up on after its retries. Once the endpoint is fixed, replay one, or recover all of an endpoint's since a time: each is sent again with the same delivery id."));

    const names = new Map();
    const result = h("div", { role: "status", "aria-live": "polite" });
    const errBox = h("div");

    // Recovery: every dead letter of one endpoint since a time, as a job with progress.
    const recEndpoint = h("select", { required: true }, h("option", { value: "" }, "Choose an endpoint"));
    const dayAgo = new Date(Date.now() - 86400000).toISOString();
    const recFields = {
      endpoint: field("rec-endpoint", "Endpoint", recEndpoint),
      since: field("rec-since", "Failed since", h("input", { type: "datetime-local", value: localInput(dayAgo), required: true })),
    };
    const recErr = h("div");
    const recOut = h("div", { role: "status", "aria-live": "polite" });
    const recGo = h("button", { type: "submit", class: "btn btn-primary" }, "Recover");
    const recForm = h("form", { class: "panel", "aria-labelledby": "recover-h", novalidate: true },
      h("h2", { id: "recover-h" }, "Recover an endpoint"),
      h("p", { class: "hint" }, "Replays every dead letter of the endpoint that failed since the time you choose. Running it twice replays nothing twice."),
      h("div", { class: "filters" }, recFields.endpoint.el, recFields.since.el),
      h("div", { class: "actions" }, recGo), recErr, recOut);
    recForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      recErr.replaceChildren();
      for (const x of Object.values(recFields)) {
        x.err.hidden = true;
        x.input.removeAttribute("aria-invalid");
      }
      if (!recEndpoint.value) {
        fieldError(recFields.endpoint, "Choose the endpoint to recover.");
        return;
      }
      const since = isoFromLocal(recFields.since.input.value);
      if (!since) {
        fieldError(recFields.since, "Enter the time to recover from.");
        return;
      }
      recGo.disabled = true;
      try {
        await recover(ctx, recEndpoint.value, since, recOut);
        list.load();
      } catch (e) {
        if (e instanceof APIError && e.field === "since") fieldError(recFields.since, e.message);
        else showError(recErr, e);
      } finally {
        recGo.disabled = false;
      }
    });

    const filterSel = h("select", null, h("option", { value: "" }, "All endpoints"));
    if (endpoint) filterSel.append(h("option", { value: endpoint, selected: true }, endpoint));
    const replayedSel = h("select", null, options([["", "All"], ["false", "Not replayed"], ["true", "Replayed"]], replayed));
    const filter = h("form", { class: "filter-form" },
      h("fieldset", null, h("legend", null, "Filter"),
        h("div", { class: "filters" }, field("dl-endpoint", "Endpoint", filterSel).el, field("dl-replayed", "Replayed", replayedSel).el),
        h("div", { class: "actions" }, h("button", { type: "submit", class: "btn btn-primary" }, "Apply"))));
    filter.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (filterSel.value) q.set("endpoint", filterSel.value);
      if (replayedSel.value) q.set("replayed", replayedSel.value);
      const s = q.toString();
      go("#/dead-letters" + (s ? "?" + s : ""));
    });

    const replay = async (d, b, force) => {
      errBox.replaceChildren();
      result.replaceChildren();
      b.disabled = true;
      try {
        const r = await api("POST", `/v1/dead-letters/${d.id}/replay`, force ? { body: { force: true } } : {});
        result.replaceChildren(h("p", { class: "result ok" }, `Replayed ${d.event_type}: it is being sent again. `,
          h("a", { href: "#/deliveries/" + enc(r.delivery_id) }, "Follow the delivery")));
        await list.load();
        const link = result.querySelector("a");
        if (link) link.focus();
      } catch (e) {
        showError(errBox, e);
        b.disabled = false;
      }
    };

    const columns = [
      { label: "Failed", class: "time", cell: (d) => when(d.failed_at) },
      { label: "Event", cell: (d) => [d.event_type, h("span", { class: "desc" }, deliveryLink(d.delivery_id))] },
      { label: "Endpoint", cell: (d) => {
        const ep = d.endpoint_id && names.get(d.endpoint_id);
        if (ep) return h("a", { href: "#/endpoints/" + enc(ep.id), class: "url" }, ep.description || ep.url);
        if (d.endpoint_id) return h("span", { class: "id" }, shortID(d.endpoint_id));
        return d.endpoint_url ? h("span", { class: "url" }, d.endpoint_url) : "the default URL";
      } },
      { label: "Attempts", class: "num", cell: (d) => d.attempts },
      { label: "Last answer", cell: (d) => [d.last_status === null ? "" : String(d.last_status), d.last_error ? h("span", { class: "desc" }, d.last_error) : null] },
      { label: "Reason", cell: (d) => h("span", { class: "small" }, d.reason) },
      { label: "Replay", cell: (d) => {
        const b = h("button", { type: "button", class: "btn btn-small " + (d.replayed_at ? "" : "btn-primary"), "aria-label": (d.replayed_at ? "Replay again " : "Replay ") + d.event_type + " " + d.delivery_id },
          d.replayed_at ? "Replay again" : "Replay");
        b.addEventListener("click", () => replay(d, b, Boolean(d.replayed_at)));
        return [d.replayed_at ? h("span", { class: "desc" }, "Replayed ", when(d.replayed_at)) : null, b];
      } },
    ];
    if (state.me.admin && !state.tenant) columns.splice(3, 0, { label: "Tenant", cell: (d) => (d.tenant === null ? "—" : d.tenant) });
    const list = pagedList(ctx, {
      table: dataTable("Dead letters", columns),
      empty: replayed === "false" ? "No dead letters waiting: every one has been replayed." : "No dead letters: every delivery arrived or is still being retried.",
      load: (cursor) => api("GET", "/v1/dead-letters", { params: { limit: PAGE, cursor, endpoint_id: endpoint, replayed, tenant: tenantParam() } }),
    });
    page.append(recForm, h("h2", null, "Dead letters"), filter, result, errBox, list.el);

    allEndpoints().then((eps) => {
      if (!ctx.alive()) return;
      for (const ep of eps) names.set(ep.id, ep);
      recEndpoint.replaceChildren(h("option", { value: "" }, "Choose an endpoint"),
        ...eps.map((ep) => h("option", { value: ep.id, selected: ep.id === endpoint }, endpointName(ep))));
      filterSel.replaceChildren(h("option", { value: "" }, "All endpoints"),
        ...eps.map((ep) => h("option", { value: ep.id, selected: ep.id === endpoint }, endpointName(ep))));
      list.load();
      every(ctx, 5000, list.refresh);
    }, (e) => showError(errBox, e));
    return "Dead letters";
  }

  async function recover(ctx, endpointID, since, out) {
    let r = await api("POST", `/v1/endpoints/${enc(endpointID)}/recover`, { body: { since } });
    const bar = h("progress", { max: 1, value: 0, "aria-label": "Recovery progress" });
    const text = h("p");
    out.replaceChildren(h("div", { class: "result" }, text, bar));
    for (;;) {
      bar.max = Math.max(r.total, 1);
      bar.value = r.total ? r.done : 0;
      if (r.state === "running") {
        text.textContent = `Recovering: ${r.done} of ${r.total} dead letters done…`;
      } else if (r.state === "done") {
        out.replaceChildren(h("p", { class: "result ok" }, r.total === 0
          ? "Nothing to recover: the endpoint has no dead letters since that time."
          : `Recovery finished: ${r.done} of ${r.total} done, ${r.replayed} replayed.`));
        return;
      } else {
        out.replaceChildren(h("p", { class: "result fail" }, `Recovery stopped after ${r.done} of ${r.total}: ${r.error || "unknown error"}. Start it again to resume.`));
        return;
      }
      await sleep(500);
      if (!ctx.alive()) return;
      r = await api("GET", "/v1/recoveries/" + enc(r.id));
    }
  }

  // ---- Operators' status overview ----------------------------------------------------------

  function statusPage(ctx) {
    const { page } = ctx;
    page.append(heading("Status"),
      h("p", { class: "lead" }, "The dispatchers' queue as fluxhook status reports it, across every tenant: the tenant chosen above does not narrow it. Updated every 5 seconds."));
    const body = h("div", null, h("p", { class: "loading" }, "Loading…"));
    page.append(body);
    const draw = (st) => {
      const card = (label, value) => h("div", { class: "card" }, h("dt", null, label), h("dd", null, value));
      const cards = h("dl", { class: "cards" },
        card("Backlog", num(st.backlog)),
        card("Oldest due", st.oldest_due_age_seconds ? `${Math.round(st.oldest_due_age_seconds)} s` : "—"),
        card("In flight", num(st.in_flight)),
        card("Retries pending", num(st.retries_pending)),
        card("Scheduled", num(st.scheduled)),
        card("Dead letters", num(st.dead_letters)),
        card("Not replayed", num(st.dead_letters_not_replayed)),
        card("Processed last hour", num(st.processed_last_hour)));
      const disp = dataTable("Dispatchers", [
        { label: "Instance", cell: (d) => h("span", { class: "id" }, d.instance_id) },
        { label: "Started", class: "time", cell: (d) => when(d.started_at) },
        { label: "Last seen", class: "time", cell: (d) => when(d.seen_at) },
        { label: "State", cell: (d) => (d.stale ? h("span", { class: "badge fail" }, "Stale") : h("span", { class: "badge ok" }, "Running")) },
      ]);
      disp.add(st.dispatchers || []);
      const parts = [h("h2", null, "Queue"), cards, h("h2", null, "Dispatchers"),
        (st.dispatchers || []).length ? disp.el : h("p", { class: "empty" }, "No dispatcher is running: start `fluxhook serve`.")];
      parts.push(h("h2", null, "Circuit breakers"));
      if (st.breakers === null) {
        parts.push(h("p", { class: "muted" }, st.breakers_note || "Breakers are reported with a shared Redis gate only."));
      } else if (!st.breakers.length) {
        parts.push(h("p", { class: "muted" }, "Every breaker is closed."));
      } else {
        const br = dataTable("Circuit breakers", [
          { label: "Endpoint", cell: (b) => h("span", { class: "url" }, b.endpoint) },
          { label: "State", cell: (b) => h("span", { class: "badge " + (b.state === "closed" ? "ok" : "fail") }, b.state) },
          { label: "Failures", class: "num", cell: (b) => b.consecutive_failures },
          { label: "Open since", cell: (b) => when(b.open_since) },
        ]);
        br.add(st.breakers);
        parts.push(br.el);
      }
      const trouble = (st.endpoints || []).filter((e) => !e.enabled || e.failing_since || e.pending > 0);
      parts.push(h("h2", null, "Endpoints needing attention"));
      if (!trouble.length) {
        parts.push(h("p", { class: "muted" }, "None: every endpoint is enabled, healthy and caught up."));
      } else {
        const et = dataTable("Endpoints needing attention", [
          { label: "Endpoint", cell: (e) => h("a", { href: "#/endpoints/" + enc(e.id), class: "url" }, e.url) },
          { label: "Tenant", cell: (e) => e.tenant || "—" },
          { label: "Pending", class: "num", cell: (e) => num(e.pending) },
          { label: "Health", cell: (e) => (!e.enabled ? ["Disabled ", e.disabled_reason] : e.failing_since ? ["Failing since ", when(e.failing_since)] : "Backlog") },
        ]);
        et.add(trouble);
        parts.push(et.el);
      }
      parts.push(h("p", { class: "hint" }, "As of ", when(st.database_time), "."));
      body.replaceChildren(...parts);
    };
    const load = async () => {
      try {
        const st = await api("GET", "/v1/status");
        if (ctx.alive()) draw(st);
      } catch (e) {
        showError(body, e);
      }
    };
    load();
    every(ctx, 5000, load);
    return "Status";
  }

  // ---- Start -------------------------------------------------------------------------------

  window.addEventListener("hashchange", () => {
    // A new link opened in this tab brings its own session.
    if (/^#session=/.test(location.hash)) start();
    else render();
  });
  document.getElementById("skip").addEventListener("click", (ev) => {
    ev.preventDefault();
    const target = document.querySelector("main h1") || document.getElementById("main");
    target.focus();
  });
  start();
})();
