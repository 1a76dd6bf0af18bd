// rackflow dashboard: keeps the page live, localises times, and runs actions through the JSON API.
//
// - Refresh: every few seconds (and after an action) the page asks its own URL again with
//   `X-Rackflow-Fragment: 1` and swaps only the regions marked `data-live`, so scroll, focus and filter
//   inputs stay as they are. A hidden tab does not poll.
// - Tokens: when the server requires bearer tokens, the token is asked for once, kept in localStorage, and
//   sent as an `Authorization` header; never as a cookie, so another site cannot act with it (no CSRF).
//   Where the browser refuses storage, it is kept for the page's life only (asked for again on the next).
// - Times: every <time datetime> is shown in the browser's zone, with UTC on hover and "in 3h" where asked;
//   a schedule's times are shown in its own zone by the server, with the browser's beside ("beside").
// - Actions: buttons with `data-post` ask for confirmation, POST (or `data-method`) to the API and show its
//   error if refused; with `data-then` the browser goes there once it is done (after a delete), and with
//   `data-then-run` to the page of the run the answer names (a retry's new run). The page it goes to says
//   what was done (`data-done`): the notice is carried in the tab's sessionStorage, read once; where
//   storage is refused, a retry stays and links the new run instead, and a delete's notice is not said.
//   A dialog with fields stays open on an error, with what was typed and the reason in words.
//   A `data-idempotent` action (a trigger, a run's retry) carries a request id, kept for its URL until an
//   answer is heard: clicked again after its answer was lost (the server unreachable, or UNAVAILABLE), it
//   sends the same id, and the server answers the run the first click fired instead of firing again.
//   The id is kept in the tab's sessionStorage, so a reload keeps it (another tab has its own), for a day
//   at most (KEEP_UNANSWERED_MS); where storage is refused (a private window), in memory for the page's life.
//   The confirmation, and what the page says after, tell that the click sends the earlier request again.
// - Forms (create and edit) are forms.js's; a page with one is not refreshed while it is open. They send
//   the token through `window.rackflow.headers`, so one rule decides where it is kept.
(() => {
  "use strict";
  const TOKEN_KEY = "rackflow.token";
  const UNANSWERED_KEY = "rackflow.unanswered "; // + an idempotent action's URL, in sessionStorage
  const NOTICE_KEY = "rackflow.notice"; // what an action that went to another page did, said there once
  const NOTICE_MS = 60 * 1000; // a notice not read within this (a navigation that never finished) is dropped
  // How long an unanswered request id is sent again. The server remembers an id as long as it keeps the
  // run it fired (by default its newest 100 runs a schedule, or --run-retention, at least 1h), so an id
  // kept for ever could answer a click days later with an old run, firing nothing. A day covers a reload
  // and a return after a break; past it, a click is taken as a new intent and fires.
  const KEEP_UNANSWERED_MS = 24 * 60 * 60 * 1000;
  const body = document.body;
  const main = document.getElementById("main");
  const refreshMs = Math.max(1, Number(body.dataset.refresh || 5)) * 1000;
  const tokensRequired = body.dataset.tokens === "required";
  const live = document.getElementById("live");
  const flashBox = document.getElementById("flash");
  const errorBox = document.getElementById("error");
  const confirmDialog = document.getElementById("confirm");
  const tokenDialog = document.getElementById("token-dialog");
  const forget = document.getElementById("forget-token");
  const raw = new WeakMap(); // live region -> the HTML it was last filled with (before times were localised)
  // Storage may be refused (a private window, site data blocked): reading the property throws, or a
  // write does. Without it the token is asked for on each page and request ids live in memory.
  function storageArea(name) {
    try {
      const area = window[name];
      area.getItem(TOKEN_KEY);
      return area;
    } catch (exc) {
      return null;
    }
  }
  const tokenStore = storageArea("localStorage");
  function store(area, key, value) {
    if (!area) return;
    try {
      if (value === null) area.removeItem(key); else area.setItem(key, value);
    } catch (exc) { /* refused: memory only */ }
  }
  let token = (tokenStore && tokenStore.getItem(TOKEN_KEY)) || "";
  let busy = false;
  let again = false;

  // An idempotent action's request not yet answered, by the action's URL: { id, at } (when it was first
  // sent, ms). In the tab's sessionStorage, and in memory for when storage is refused.
  const unanswered = {
    session: storageArea("sessionStorage"),
    memory: new Map(),
    get(url) {
      let kept = null;
      try {
        kept = this.session && JSON.parse(this.session.getItem(UNANSWERED_KEY + url) || "null");
      } catch (exc) { kept = null; }
      kept = kept || this.memory.get(url) || null;
      const valid = kept && typeof kept.id === "string" && /^[A-Za-z0-9._:-]{1,64}$/.test(kept.id) &&
        Number.isFinite(kept.at) && Math.abs(Date.now() - kept.at) <= KEEP_UNANSWERED_MS;
      if (kept && !valid) this.delete(url); // too old (or not ours): a click now is a new request
      return valid ? kept : null;
    },
    set(url, kept) {
      this.memory.set(url, kept);
      store(this.session, UNANSWERED_KEY + url, JSON.stringify(kept));
    },
    delete(url) {
      this.memory.delete(url);
      store(this.session, UNANSWERED_KEY + url, null);
    },
  };

  // A notice for the page an action goes to: false where storage is refused (it would be lost).
  const notices = storageArea("sessionStorage");
  function carry(text, ms) {
    if (!notices) return false;
    try {
      notices.setItem(NOTICE_KEY, JSON.stringify({ text, ms, at: Date.now() }));
      return true;
    } catch (exc) { return false; }
  }
  function sayCarried() {
    if (!notices) return;
    let kept = null;
    try {
      kept = JSON.parse(notices.getItem(NOTICE_KEY) || "null");
      notices.removeItem(NOTICE_KEY);
    } catch (exc) { kept = null; }
    if (kept && typeof kept.text === "string" && Number.isFinite(kept.at) && Math.abs(Date.now() - kept.at) <= NOTICE_MS) {
      flash(kept.text, Number(kept.ms) || 6000);
    }
  }

  function headers(extra) {
    const result = Object.assign({}, extra);
    if (token) result.Authorization = "Bearer " + token;
    return result;
  }

  // --- times ------------------------------------------------------------------------------------------
  const pad = (n) => String(n).padStart(2, "0");
  const zoneName = (d) => {
    const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" })
      .formatToParts(d).find((p) => p.type === "timeZoneName");
    return part ? part.value : "";
  };
  function local(d, short) {
    const day = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    const clock = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    return short ? `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock}` : `${day} ${clock} ${zoneName(d)}`;
  }
  function relative(ms) {
    const future = ms > 0;
    const s = Math.round(Math.abs(ms) / 1000);
    const minutes = Math.round(s / 60);
    const hours = Math.round(s / 3600);
    let text;
    if (s < 45) text = `${s}s`;
    else if (minutes < 60) text = `${minutes}m`;
    else if (s < 86400) text = minutes % 60 ? `${Math.floor(minutes / 60)}h ${minutes % 60}m` : `${minutes / 60}h`;
    else text = hours % 24 ? `${Math.floor(hours / 24)}d ${hours % 24}h` : `${hours / 24}d`;
    return future ? `in ${text}` : `${text} ago`;
  }
  const viewerZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  // The same instant's wall clock in two zones: equal means the viewer reads the schedule's zone already.
  function sameClock(d, zone) {
    const clock = (tz) => new Intl.DateTimeFormat("en-US", { timeZone: tz, dateStyle: "short", timeStyle: "short" }).format(d);
    try { return clock(zone) === clock(viewerZone); } catch (exc) { return false; }
  }
  function renderTimes(root) {
    root.querySelectorAll("time[datetime]").forEach((el) => {
      const d = new Date(el.getAttribute("datetime"));
      if (Number.isNaN(d.getTime())) return;
      const mode = el.dataset.mode || "abs";
      const rel = relative(d.getTime() - Date.now());
      if (mode === "beside") {
        const yours = sameClock(d, el.dataset.zone) ? "" : `(yours: ${local(d, false)})`;
        el.textContent = [yours, el.dataset.rel === "both" ? `· ${rel}` : ""].filter(Boolean).join(" ");
        el.title = d.toISOString().replace(".000Z", "Z") + " (UTC)";
        return;
      }
      el.textContent = mode === "rel" ? rel : mode === "short" ? local(d, true)
        : mode === "both" ? `${local(d, false)} · ${rel}` : local(d, false);
      el.title = d.toISOString().replace(".000Z", "Z") + " (UTC)";
    });
  }

  // --- notices ----------------------------------------------------------------------------------------
  function showError(text) { errorBox.textContent = text; errorBox.hidden = false; }
  // `link` ({ href, text }), if given, follows the text as a link (a retry's run, where the page stays).
  function flash(text, ms = 6000, link = null) {
    errorBox.hidden = true;
    flashBox.textContent = text; flashBox.hidden = false;
    if (link) {
      const a = document.createElement("a");
      a.href = link.href; a.textContent = link.text; a.dataset.testid = "flash-link";
      flashBox.append(" ", a, ".");
    }
    clearTimeout(flash.timer);
    flash.timer = setTimeout(() => { flashBox.hidden = true; }, ms);
  }
  function setLive(ok, text) {
    live.textContent = text;
    live.classList.toggle("stale", !ok);
  }

  // --- token ------------------------------------------------------------------------------------------
  function askToken(message) {
    const error = document.getElementById("token-error");
    error.textContent = message || "";
    error.hidden = !message;
    if (!tokenDialog.open) tokenDialog.showModal();
    document.getElementById("token-input").focus();
  }
  tokenDialog.addEventListener("close", () => {
    const value = document.getElementById("token-input").value.trim();
    if (!value) return;
    token = value;
    store(tokenStore, TOKEN_KEY, token);
    document.getElementById("token-input").value = "";
    forget.hidden = false;
    refresh();
  });
  forget.hidden = !(tokensRequired && token);
  forget.addEventListener("click", () => {
    store(tokenStore, TOKEN_KEY, null);
    token = "";
    location.reload();
  });

  // --- live refresh -----------------------------------------------------------------------------------
  // The focused element is found again after a refresh by what it acts on or leads to (an action's URL and
  // method, a link's target, an id), never by its place: a row that ended or arrived moves the others, and
  // the third Cancel button would be another task's. Only what has none of those is found by its place.
  function focusKey(el) {
    const post = el.getAttribute("data-post");
    if (post) {
      const method = el.getAttribute("data-method");
      const byMethod = method ? `[data-method="${CSS.escape(method)}"]` : ":not([data-method])";
      return { selector: `[data-post="${CSS.escape(post)}"]${byMethod}`, byPlace: false };
    }
    for (const name of ["href", "id"]) {
      const value = el.getAttribute(name);
      if (value) return { selector: `[${name}="${CSS.escape(value)}"]`, byPlace: false };
    }
    const testid = el.dataset.testid;
    return testid ? { selector: `[data-testid="${CSS.escape(testid)}"]`, byPlace: true } : null;
  }
  function swap(region, fresh) {
    const focused = document.activeElement;
    const key = focused && region.contains(focused) ? focusKey(focused) : null;
    const index = key && key.byPlace ? Array.from(region.querySelectorAll(key.selector)).indexOf(focused) : 0;
    region.innerHTML = fresh.innerHTML;
    raw.set(region, fresh.innerHTML);
    renderTimes(region);
    if (key && index >= 0) {
      const again = region.querySelectorAll(key.selector)[index];
      if (again) again.focus({ preventScroll: true });
    }
  }
  function apply(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    const fresh = template.content;
    const current = main.querySelectorAll("[data-live]");
    const incoming = fresh.querySelectorAll("[data-live]");
    const sameShape = current.length > 0 && current.length === incoming.length &&
      Array.from(incoming).every((n) => main.querySelector(`[data-live="${n.dataset.live}"]`));
    if (main.hasAttribute("data-deferred") || !sameShape) {
      main.replaceChildren(fresh);
      main.removeAttribute("data-deferred");
      main.querySelectorAll("[data-live]").forEach((r) => raw.set(r, r.innerHTML));
      renderTimes(main);
      document.dispatchEvent(new Event("rackflow:page")); // forms.js sets up a form that came in this way
      return;
    }
    incoming.forEach((n) => {
      const region = main.querySelector(`[data-live="${n.dataset.live}"]`);
      if (raw.get(region) !== n.innerHTML) swap(region, n);
    });
  }
  async function refresh() {
    if (busy) { again = true; return; } // an action's result must not wait for the next tick
    if (confirmDialog.open || tokenDialog.open) return;
    // A form page (forms.js) is not refreshed: that would throw away what is being typed.
    if (main.querySelector("form[data-editor]") && !main.hasAttribute("data-deferred")) return;
    if (tokensRequired && !token) { askToken(); return; }
    busy = true;
    try {
      const response = await fetch(location.pathname + location.search, {
        headers: headers({ "X-Rackflow-Fragment": "1" }), cache: "no-store",
      });
      if (response.status === 401) {
        const data = await response.json().catch(() => ({}));
        setLive(false, "token needed");
        askToken(token ? data.message || "The token was refused." : "");
        return;
      }
      const html = await response.text();
      if (!response.ok && main.querySelector("form[data-filters]")) {
        // A filter the server refused (an unknown rack, say): keep the page and its form, say why.
        const template = document.createElement("template");
        template.innerHTML = html;
        const reason = template.content.querySelector("[data-testid=page-error] p");
        showError(reason ? reason.textContent : `${response.status} ${response.statusText}`);
      } else {
        apply(html);
      }
      const now = new Date();
      setLive(true, `live · ${pad(now.getHours())}:${pad(now.getMinutes())}:${pad(now.getSeconds())}`);
    } catch (exc) {
      setLive(false, "offline, retrying");
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  // --- filters ----------------------------------------------------------------------------------------
  function filterUrl(form) {
    const params = new URLSearchParams();
    new FormData(form).forEach((value, key) => { if (String(value).trim()) params.set(key, String(value).trim()); });
    const query = params.toString();
    return form.getAttribute("action") + (query ? `?${query}` : "");
  }
  function applyFilters(form) {
    history.replaceState(null, "", filterUrl(form));
    errorBox.hidden = true;
    refresh();
  }
  let typing;
  document.addEventListener("input", (event) => {
    const form = event.target.closest("form[data-filters]");
    if (!form || event.target.type !== "search") return;
    clearTimeout(typing);
    typing = setTimeout(() => applyFilters(form), 350);
  });
  document.addEventListener("change", (event) => {
    const form = event.target.closest("form[data-filters]");
    if (form && (event.target.tagName === "SELECT" || event.target.type === "text")) applyFilters(form);
  });
  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-filters]");
    if (!form) return;
    event.preventDefault();
    applyFilters(form);
  });
  document.addEventListener("keydown", (event) => {
    const tag = (event.target.tagName || "").toLowerCase();
    if (event.key !== "/" || ["input", "select", "textarea"].includes(tag) || event.metaKey || event.ctrlKey) return;
    const search = document.querySelector("form[data-filters] input[type=search]");
    if (search) { event.preventDefault(); search.focus(); search.select(); }
  });

  // --- actions ----------------------------------------------------------------------------------------
  // "for 2h", "90m", "1h30m" (Go durations) from now; or a time: RFC 3339, or "2026-12-24 06:00" in the
  // browser's zone. Returns RFC 3339 (UTC), or throws an Error whose message says what is accepted.
  const DURATION = /^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/;
  const UNIT_MS = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };
  function whenValue(label, raw) {
    const text = raw.trim().replace(/^(for|in)\s+/i, "").replace(/^(at|until)\s+/i, "");
    if (DURATION.test(text)) {
      let ms = 0;
      for (const [, n, , unit] of text.matchAll(/(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)/g)) ms += Number(n) * UNIT_MS[unit];
      if (ms <= 0) throw new Error(`${label}: "${raw}" is no time at all; give a duration such as 2h`);
      return new Date(Date.now() + ms).toISOString();
    }
    const local = /^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?$/.test(text);
    const zoned = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$/i.test(text);
    const d = local ? new Date(text.replace(" ", "T")) : zoned ? new Date(text) : null;
    if (!d || Number.isNaN(d.getTime())) {
      throw new Error(`${label}: "${raw}" is neither a duration (for 2h, 90m, 1h30m) nor a time ` +
        `(2026-12-24 06:00 in your zone, or 2026-12-24T06:00:00Z)`);
    }
    if (d.getTime() <= Date.now()) throw new Error(`${label}: ${local ? text : d.toISOString()} has passed; give a later time`);
    return d.toISOString();
  }
  function fieldValues(fields) {
    const values = {};
    fields.querySelectorAll("[name]").forEach((input) => {
      if (!input.value.trim()) return;
      const label = (input.closest("label")?.firstChild?.textContent || input.name).trim().split(",")[0];
      values[input.name] = input.dataset.when ? whenValue(label, input.value) : input.value;
    });
    return values;
  }
  // A request id the server accepts (letters, digits and . _ : -): random, from any page (crypto.randomUUID
  // needs a secure context, which a dashboard served over plain HTTP on a LAN address is not).
  function newRequestId() {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }
  // A refusal of a request sent again that names no firing (any but a trigger that fired and submitted no
  // task), or the answer of a server too old to say `replayed`, does not say whether the earlier request
  // had fired, so the page says which request it was.
  function sentAgain(kept) {
    return `This was your earlier request of ${local(new Date(kept.at), false)}, whose answer was lost, ` +
      "sent again: a request fires at most once, so if that one had reached the server, this is its run, " +
      "not a new one.";
  }
  // What a trigger's or a retry's answer says happened (`replayed`: it is the answer of an earlier request
  // with the same id, whose run it names, a trigger's as `run_id`, a retry's as the run itself), said
  // plainly: that request had already fired the run and nothing new was fired, or, for a click that sent
  // an unanswered request again, that this click fired it now. Nothing for a first click that fired.
  // A trigger's refusal that fired a run submitting no task names it alike (the error's `run_id`,
  // `fired_at`, `replayed`), and `did` says what that run did.
  function replayNote(data, kept, did = "") {
    if (typeof data.replayed !== "boolean") return kept ? sentAgain(kept) : "";
    const run = (data.run_id || data.id || {}).id || "";
    const at = data.fired_at ? ` at ${local(new Date(data.fired_at), false)}` : "";
    const earlier = kept ? `Your earlier request of ${local(new Date(kept.at), false)}` : "This request";
    if (data.replayed) return `${earlier} had already fired run ${run}${at}: ${did ? `${did}; ` : ""}nothing new was fired.`;
    return kept ? `${earlier} never reached the server: this click fired it now, as run ${run}${at}${did ? `; ${did}` : ""}.` : "";
  }
  async function post(button, values) {
    if (tokensRequired && !token) { askToken(); return { ok: false, message: "a token is needed" }; }
    const url = button.dataset.post;
    const idempotent = button.hasAttribute("data-idempotent");
    let resent = null; // the earlier request this click sends again, if its answer was not heard
    if (idempotent) {
      resent = unanswered.get(url);
      const request = resent || { id: newRequestId(), at: Date.now() };
      if (!resent) unanswered.set(url, request);
      values = { ...values, request_id: request.id };
    }
    try {
      const response = await fetch(url, {
        method: button.dataset.method || "POST",
        headers: headers({ "Content-Type": "application/json" }),
        body: JSON.stringify(values),
      });
      const data = await response.json().catch(() => ({}));
      // UNAVAILABLE (503) may have fired: the same id again is safe; any other answer was heard.
      if (response.status !== 503) unanswered.delete(url);
      if (response.status === 401) askToken(data.message);
      const what = button.textContent.trim();
      // The run the answer names: a retry's answer is the run (its `id`), a trigger's names it (`run_id`).
      const run = (data.run_id || data.id || {}).id || "";
      if (response.ok) return { ok: true, note: idempotent ? replayNote(data, resent) : "", run };
      const note = idempotent ? replayNote(data, resent, "it submitted no task") : "";
      return { ok: false, message: `${what} refused (${data.code || response.status}): ${data.message || response.statusText}${note ? ` ${note}` : ""}` };
    } catch (exc) {
      const again = idempotent ? "; trying again sends the same request, which fires at most once" : "";
      return { ok: false, message: `${button.textContent.trim()} failed: the server cannot be reached (${exc})${again}` };
    }
  }
  // Confirm, then act. A dialog with fields stays open until the action is done, so a refusal keeps what
  // was typed and says why inside it; one without fields closes and the refusal shows on the page.
  function act(button) {
    const fields = document.getElementById("confirm-fields");
    const error = document.getElementById("confirm-error");
    const form = confirmDialog.querySelector("form");
    document.getElementById("confirm-title").textContent = button.dataset.confirmTitle || "Are you sure?";
    const kept = button.hasAttribute("data-idempotent") ? unanswered.get(button.dataset.post) : null;
    document.getElementById("confirm-text").textContent = (button.dataset.confirmText || "") + (kept
      ? ` Your earlier request of ${local(new Date(kept.at), false)} went unanswered: Confirm sends it ` +
        "again, which fires at most once (the answer says whether it had already fired)."
      : "");
    fields.replaceChildren();
    error.hidden = true;
    const template = button.dataset.fields && document.getElementById(button.dataset.fields);
    if (template) fields.append(template.content.cloneNode(true));
    const keepOpen = Boolean(template);
    const ok = confirmDialog.querySelector("[data-testid=confirm-ok]");
    async function submitted(event) {
      event.preventDefault();
      let values;
      try {
        values = fieldValues(fields);
      } catch (exc) {
        error.textContent = exc.message; error.hidden = false;
        return;
      }
      ok.disabled = true; button.disabled = true;
      if (!keepOpen) confirmDialog.close("ok");
      const result = await post(button, values);
      ok.disabled = false; button.disabled = false;
      const done = button.dataset.done || "Done";
      const ms = result.note ? 20000 : 6000;
      const noted = result.note ? ` ${result.note}` : "";
      if (result.ok && button.dataset.then) {
        carry(done + (result.note ? `. ${result.note}` : ""), ms);
        location.assign(button.dataset.then); // what was acted on is gone (a delete): go where it was listed
        return;
      }
      const runPage = result.ok && button.hasAttribute("data-then-run") && result.run
        ? `/runs/${encodeURIComponent(result.run)}` : "";
      if (runPage && carry(`${done}: this page is the run it fired.${noted}`, ms)) {
        location.assign(runPage); // the operator follows what they started, not the run it superseded
        return;
      }
      if (result.ok) {
        if (confirmDialog.open) confirmDialog.close("ok");
        if (runPage) flash(`${done}.${noted} The run it fired:`, 20000, { href: runPage, text: result.run });
        else flash(done + (result.note ? `. ${result.note}` : ""), ms);
      } else if (keepOpen && confirmDialog.open) {
        error.textContent = result.message; error.hidden = false;
      } else {
        showError(result.message);
      }
      if (!confirmDialog.open) await refresh();
    }
    form.addEventListener("submit", submitted);
    confirmDialog.addEventListener("close", () => form.removeEventListener("submit", submitted), { once: true });
    confirmDialog.returnValue = "";
    confirmDialog.showModal();
    (fields.querySelector("input") || ok).focus();
  }
  // Cancel is not a submit button, so Enter in a field confirms rather than cancels.
  confirmDialog.querySelector("[data-testid=confirm-cancel]").addEventListener("click", () => confirmDialog.close("cancel"));
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-post]");
    if (button) { event.preventDefault(); act(button); }
  });

  // --- start ------------------------------------------------------------------------------------------
  main.querySelectorAll("[data-live]").forEach((r) => raw.set(r, r.innerHTML));
  renderTimes(document);
  sayCarried();
  if (main.hasAttribute("data-deferred")) refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, refreshMs);
  setInterval(() => renderTimes(document), 15000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  // forms.js sends its requests with these headers: the token this page holds, kept in storage or, where
  // the browser refuses storage, in this page's memory only, which forms.js cannot read on its own.
  window.rackflow = { refresh, headers };
})();
