// rackflow dashboard forms: create and edit schedules, maintenance windows and operation budgets through
// the JSON API (docs/HTTP.md), as `application/json` from this origin (the CSRF guard refuses anything else),
// with the bearer token app.js holds (`window.rackflow.headers`).
//
// - Errors: the API names the field of its first error (`{"code", "message", "field"}`); the message is
//   shown next to the input whose `data-error-for` is the longest prefix of that field, or at the foot of
//   the form. Nothing the user typed is thrown away.
// - The schedule form validates as you type: each change (after a short pause) asks
//   `POST /previews/schedule` with the draft (`POST /api/v1/schedules:preview`'s answer, with each name in
//   it as the pages write it), and shows the next firings in the schedule's zone and the viewer's, with
//   each rack's decision (fire, skip for overlap, skip or defer for a window) and whether the firing would
//   await approval.
// - Its racks (or NVLink domains) are picked by name: the page lists none of them (a fleet has tens of
//   thousands); as a name is typed, `GET /names/{racks|nvl_domains}?contains=` answers at most 20 that
//   hold it (the name typed in full first), offered in a listbox (arrows, Enter, Escape, or a click). A
//   name that is no rack's (or domain's) is refused at once, beside the picker; the preview's check of
//   the racks on the server stays the final word. An answer that may not be all (`after`: 20 found, or a
//   text of one or two characters, which looks through `walk` names a request, found fewer or none) ends
//   the list with an option that asks on (`&after=`) and adds what it finds.
// - A resource form (`data-editor="resource"`: windows, budgets) sends its inputs under `data-wrapper` to
//   `data-url` with `data-method`, then goes to `data-then`.
(() => {
  "use strict";
  const PREVIEW_COUNT = 6;
  const TYPING_MS = 300;
  const PICK_MS = 120; // a pause in typing before the picker asks for names
  const DECISIONS = {
    fire: ["fires", "st-ok"],
    skip_overlap: ["skipped: its last task is still active", "st-skip"],
    skip_window: ["skipped: window closed", "st-skip"],
    defer: ["deferred to its window", "st-wait"],
    paused: ["paused", "st-skip"],
    missed: ["missed: past its start deadline", "st-stop"],
    skip_run: ["skipped: its previous run is still live", "st-skip"],
  };

  async function call(method, url, payload) {
    // app.js's headers carry the token wherever it keeps it (in memory where storage is refused).
    const headers = window.rackflow.headers({ "Content-Type": "application/json" });
    try {
      const response = await fetch(url, { method, headers, body: payload === undefined ? undefined : JSON.stringify(payload) });
      const data = await response.json().catch(() => ({}));
      return { ok: response.ok, status: response.status, data };
    } catch (exc) {
      return { ok: false, status: 0, data: { message: `the server cannot be reached (${exc})`, field: null } };
    }
  }

  // --- errors next to their fields ----------------------------------------------------------------------
  function normalise(field) {
    return String(field || "")
      .replace(/^draft\./, "")
      .replace(/^operation\.\w+\.target_spec/, "target_spec")
      .replace(/^desired_scope/, "target_spec")
      .replace(/^operation\.\w+\./, "operation.");
  }
  // The errors a save or a preview marked; not a picker's own refusal (`data-refused`), which stays marked
  // beside its text until the picker is typed in, whenever a preview lands.
  function clearErrors(form) {
    form.querySelectorAll("[data-error-for]").forEach((p) => { p.hidden = true; p.textContent = ""; });
    form.querySelectorAll("[aria-invalid]:not([data-refused])").forEach((el) => el.removeAttribute("aria-invalid"));
  }
  function showError(form, data, status) {
    clearErrors(form);
    const field = normalise(data.field);
    let best = null;
    form.querySelectorAll("[data-error-for]").forEach((p) => {
      const key = p.dataset.errorFor;
      const fits = key === "" || field === key || field.startsWith(key + ".") || field.startsWith(key + "[");
      if (fits && (!best || key.length > best.dataset.errorFor.length)) best = p;
    });
    if (!best) return;
    const code = data.code ? `${data.code}: ` : status ? `${status}: ` : "";
    best.textContent = best.dataset.errorFor ? data.message || "refused" : code + (data.message || "refused");
    best.hidden = false;
    const input = best.closest("label, fieldset")?.querySelector("input, select");
    if (input) input.setAttribute("aria-invalid", "true");
  }

  // --- the schedule form --------------------------------------------------------------------------------
  function scheduleDraft(form) {
    const el = form.elements;
    const value = (name) => (el[name] ? String(el[name].value).trim() : "");
    const schedule = {
      name: value("name"),
      spec: { type: value("spec_type"), spec: value("spec"), timezone: value("timezone") },
      overlap_policy: value("overlap_policy"),
      window_policy: value("window_policy"),
      start_deadline: value("start_deadline"),
      pause_after_failed_runs: /^\d+$/.test(value("pause_after_failed_runs")) ? Number(value("pause_after_failed_runs")) : value("pause_after_failed_runs") || 0,
    };
    if (el.rollout_on.checked) {
      const rollout = {};
      form.querySelectorAll("[data-rollout] input").forEach((input) => {
        const key = input.name.replace(/^rollout\./, "");
        const text = input.value.trim();
        if (text) rollout[key] = key === "bake_time" || !/^\d+$/.test(text) ? text : Number(text);
      });
      schedule.rollout = rollout;
    }
    if (el.retry_on.checked) {
      const retry = {};
      form.querySelectorAll("[data-retry] input").forEach((input) => {
        const key = input.name.replace(/^retry\./, "");
        const text = input.value.trim();
        const numeric = key === "max_attempts" || key === "multiplier";
        if (text) retry[key] = numeric && /^\d+(\.\d+)?$/.test(text) ? Number(text) : text;
      });
      schedule.retry = retry;
    }
    if (el.approval_on.checked) {
      const approvers = value("approval.min_approvers");
      schedule.approval = {
        required: true,
        timeout: value("approval.timeout"),
        min_approvers: /^\d+$/.test(approvers) ? Number(approvers) : approvers || 0,
      };
    }
    const kind = form.querySelector("[name=scope_kind]:checked").value;
    const types = Array.from(form.querySelectorAll("[name=component_types]:checked")).map((c) => c.value);
    const targets = Array.from(form.querySelectorAll(".chosen li")).map((li) =>
      types.length ? { name: li.dataset.name, component_types: types } : { name: li.dataset.name });
    const target = { [kind]: { targets } };
    const op = value("operation");
    const inner = { target_spec: target, description: value("description") };
    if (op === "upgrade_firmware") inner.target_version = value("target_version");
    if (op === "power_off" || op === "power_reset") inner.forced = el.forced.checked;
    return { schedule, operation: { [op]: inner }, target };
  }

  function zoneOk(zone) {
    try { new Intl.DateTimeFormat("en-US", { timeZone: zone }); return true; } catch (exc) { return false; }
  }
  function inZone(date, zone) {
    const text = new Intl.DateTimeFormat("sv-SE", {
      timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    }).format(date);
    const name = new Intl.DateTimeFormat("en-US", { timeZone: zone, timeZoneName: "short" })
      .formatToParts(date).find((p) => p.type === "timeZoneName");
    return `${text} ${name ? name.value : zone}`;
  }

  // `shown`: each rack's and window's name in the answer as the server writes it (`validation.shown`,
  // each character that would not show as itself escaped): the preview writes no name but from there.
  function renderPreview(form, panel, firings, shown) {
    const zone = form.elements.timezone.value.trim() || "UTC";
    const scheduleZone = zoneOk(zone) ? zone : "UTC";
    const viewer = Intl.DateTimeFormat().resolvedOptions().timeZone;
    panel.querySelector("[data-preview-zones]").textContent =
      scheduleZone === viewer ? `in ${scheduleZone}` : `in ${scheduleZone} · yours: ${viewer}`;
    const list = panel.querySelector("[data-preview-list]");
    list.replaceChildren();
    const status = panel.querySelector("[data-preview-status]");
    status.textContent = firings.length ? "" : "It would never fire (a one-time schedule in the past?).";
    status.hidden = firings.length > 0;
    firings.forEach((firing) => {
      const at = new Date(firing.at);
      const li = document.createElement("li");
      li.dataset.testid = "preview-firing";
      const when = document.createElement("div");
      when.className = "when";
      const own = document.createElement("strong");
      own.textContent = inZone(at, scheduleZone);
      when.append(own);
      if (inZone(at, viewer) !== own.textContent && scheduleZone !== viewer) {
        const yours = document.createElement("span");
        yours.className = "muted";
        yours.textContent = ` (yours: ${inZone(at, viewer)})`;
        when.append(yours);
      }
      li.append(when);
      if (firing.needs_approval) {
        li.dataset.needsApproval = "";
        const held = document.createElement("span");
        held.className = "badge st-wait";
        held.dataset.testid = "preview-needs-approval";
        held.textContent = "awaits approval";
        held.title = "Nothing starts until it is approved";
        when.append(" ", held);
      }
      const racks = document.createElement("ul");
      racks.className = "decisions";
      firing.scopes.forEach((scope) => {
        const [words, css] = DECISIONS[scope.decision] || [scope.decision, "st-skip"];
        const item = document.createElement("li");
        item.dataset.testid = "preview-decision";
        item.dataset.rack = scope.rack_name;
        item.dataset.decision = scope.decision;
        const badge = document.createElement("span");
        badge.className = `badge ${css}`;
        badge.textContent = shown[scope.rack_name];
        item.append(badge, " ", scope.window_name ? `${words} (${shown[scope.window_name]})` : words);
        if (scope.reason) item.title = scope.reason;
        racks.append(item);
      });
      li.append(racks);
      list.append(li);
    });
  }

  // --- the scope picker ---------------------------------------------------------------------------------
  // `later` asks for the preview again once a name is added.
  function setUpPicker(form, later) {
    const input = form.querySelector("[data-pick]");
    const list = form.querySelector("[data-pick-options]");
    const error = form.querySelector("[data-pick-error]");
    const chosen = form.querySelector(".chosen");
    let asked = 0;
    let timer = null;
    let active = -1;
    const kind = () => form.querySelector("[name=scope_kind]:checked").value;
    const noun = () => (kind() === "racks" ? "rack" : "NVLink domain");
    const options = () => Array.from(list.querySelectorAll("[role=option]"));

    function say(message) {
      error.textContent = message;
      error.hidden = !message;
      if (message) {
        input.setAttribute("aria-invalid", "true");
        input.dataset.refused = "";
      } else {
        input.removeAttribute("aria-invalid");
        delete input.dataset.refused;
      }
    }
    function close() {
      list.hidden = true;
      list.replaceChildren();
      input.setAttribute("aria-expanded", "false");
      input.removeAttribute("aria-activedescendant");
      active = -1;
    }
    function highlight(index) {
      const all = options();
      if (!all.length) return;
      active = (index + all.length) % all.length;
      all.forEach((option, i) => option.setAttribute("aria-selected", String(i === active)));
      input.setAttribute("aria-activedescendant", all[active].id);
      all[active].scrollIntoView({ block: "nearest" });
    }
    async function names(text, after = "") {
      const on = after ? `&after=${encodeURIComponent(after)}` : "";
      return call("GET", `/names/${kind()}?contains=${encodeURIComponent(text)}${on}`);
    }
    function option(id, testid) {
      const item = document.createElement("li");
      item.id = id;
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", "false");
      item.dataset.testid = testid;
      return item;
    }
    // `after`: the names after the last answer's, added to those offered (the option that asked for them).
    async function suggest(after = "") {
      const text = input.value.trim();
      const mine = ++asked;
      if (!text) { close(); return; }
      const result = await names(text, after);
      if (mine !== asked) return; // typed on meanwhile
      if (after) list.querySelectorAll("[data-more], .none").forEach((item) => item.remove());
      else close();
      if (!result.ok) { say(result.data.message || "refused"); return; }
      const found = result.data.names || [];
      const start = options().length;
      found.forEach((name, i) => {
        const item = option(`scope-option-${start + i}`, "scope-option");
        item.dataset.name = name;
        item.textContent = result.data.shown[i];
        list.append(item);
      });
      const more = result.data.after;
      if (!options().length) {
        const none = document.createElement("li");
        none.className = "none";
        none.dataset.testid = "scope-none";
        none.textContent = more
          ? `No ${noun()}'s name holds “${text}” among those looked through yet.`
          : `No ${noun()}'s name holds “${text}”.`;
        list.append(none);
      }
      if (more) {
        const item = option("scope-option-more", "scope-more");
        item.className = "more";
        item.dataset.more = more;
        const walk = result.data.walk;
        item.textContent = walk ? `Search the next ${walk.toLocaleString("en")} names…` : "More names…";
        list.append(item);
      }
      active = -1;
      input.removeAttribute("aria-activedescendant");
      list.hidden = false;
      input.setAttribute("aria-expanded", "true");
    }
    async function add(typed) {
      const name = typed.trim();
      if (!name) return;
      if (chosen.querySelector(`li[data-name="${CSS.escape(name)}"]`)) { say(`${name} is already in scope.`); return; }
      clearTimeout(timer);
      const result = await names(name);
      if (!result.ok) { say(result.data.message || "refused"); return; }
      // The server offers the name typed in full first when it is one (`names_holding`).
      if ((result.data.names || [])[0] !== name) {
        say(`No ${noun()} is named “${name}”: pick one of the names offered as you type.`);
        return;
      }
      const shown = result.data.shown[0];
      const li = document.createElement("li");
      li.dataset.name = name;
      const button = document.createElement("button");
      button.type = "button"; button.className = "link"; button.dataset.remove = "";
      button.setAttribute("aria-label", `Remove ${shown}`);
      button.textContent = "×";
      li.append(`${shown} `, button);
      chosen.append(li);
      ++asked; // a suggestion still on its way is not shown under the emptied input
      input.value = "";
      close();
      say("");
      later();
    }
    const picked = () => (active >= 0 ? options()[active] : null);
    // An option names a rack to add, or asks on for more (`data-more`: the name to ask after).
    function choose(chosenOption) {
      if (chosenOption && chosenOption.dataset.more) suggest(chosenOption.dataset.more);
      else add(chosenOption ? chosenOption.dataset.name : input.value);
    }

    input.addEventListener("input", () => {
      say("");
      clearTimeout(timer);
      timer = setTimeout(suggest, PICK_MS);
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        if (list.hidden) suggest();
        else highlight(active + (event.key === "ArrowDown" ? 1 : -1));
      } else if (event.key === "Enter") {
        event.preventDefault(); // adds the name (or asks on); it does not save the form
        choose(picked());
      } else if (event.key === "Escape" && !list.hidden) {
        event.preventDefault();
        close();
      }
    });
    // mousedown, not click: the input keeps its focus, and the list is not closed under the pointer.
    list.addEventListener("mousedown", (event) => {
      const clicked = event.target.closest("[role=option]");
      event.preventDefault();
      if (clicked) choose(clicked);
    });
    input.addEventListener("blur", close);
    form.querySelector("[data-add]").addEventListener("click", () => choose(picked()));
    return {
      // A target names one kind: racks or domains. The picker says which it looks up.
      kindChanged() {
        chosen.replaceChildren();
        input.value = "";
        close();
        say("");
        const what = kind() === "racks" ? "rack" : "NVLink domain";
        input.setAttribute("aria-label", `${what[0].toUpperCase()}${what.slice(1)} to add`);
        input.placeholder = `type part of a${what === "rack" ? "" : "n"} ${what}'s name`;
      },
    };
  }

  function setUpSchedule(form) {
    const panel = document.querySelector("[data-testid=form-preview]");
    const editing = form.dataset.id;
    let timer = null;
    let asked = 0;

    function showOps() {
      const op = form.elements.operation.value;
      form.querySelectorAll("[data-for-ops]").forEach((el) => { el.hidden = !el.dataset.forOps.split(" ").includes(op); });
      form.querySelector("[data-rollout]").hidden = !form.elements.rollout_on.checked;
      form.querySelector("[data-retry]").hidden = !form.elements.retry_on.checked;
      form.querySelector("[data-approval]").hidden = !form.elements.approval_on.checked;
    }
    // `saveRefused`: asked after a refused save, whose refusal the form keeps showing whatever the preview
    // answers (the preview's own refusal is then said in its panel alone).
    async function preview(saveRefused = false) {
      const mine = ++asked;
      const { schedule, operation } = scheduleDraft(form);
      const body = { draft: { schedule, operation }, count: PREVIEW_COUNT };
      if (editing) body.id = { id: editing };
      const result = await call("POST", "/previews/schedule", body);
      if (mine !== asked) return; // a newer draft was asked for meanwhile
      const status = panel.querySelector("[data-preview-status]");
      if (result.ok) {
        if (!saveRefused) clearErrors(form);
        renderPreview(form, panel, result.data.firings || [], result.data.shown || {});
      } else {
        if (!saveRefused) showError(form, result.data, result.status);
        panel.querySelector("[data-preview-list]").replaceChildren();
        status.hidden = false;
        status.textContent = "Fix the field marked in the form to see its firings.";
      }
    }
    function later() { clearTimeout(timer); timer = setTimeout(preview, TYPING_MS); }

    const picker = setUpPicker(form, later);
    // What is typed into the picker is no part of the draft: it previews once a name is added.
    const drafted = (event) => !event.target.matches("[data-pick]");
    form.addEventListener("input", (event) => { if (drafted(event)) later(); });
    form.addEventListener("change", (event) => { if (drafted(event)) { showOps(); later(); } });
    form.addEventListener("click", (event) => {
      const remove = event.target.closest("[data-remove]");
      if (remove) { remove.closest("li").remove(); later(); }
    });
    form.querySelectorAll("[name=scope_kind]").forEach((radio) => radio.addEventListener("change", picker.kindChanged));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      // The save answers for the draft now: a preview asked before it (the typing's pause, the blur's
      // change) would land after the save's answer and clear the refusal it shows. A refused save asks
      // for the draft's preview again, keeping its refusal.
      clearTimeout(timer);
      asked += 1;
      const save = form.querySelector("[data-testid=form-save]");
      save.disabled = true;
      const { schedule, operation, target } = scheduleDraft(form);
      let result;
      if (!editing) {
        result = await call("POST", "/api/v1/schedules", { schedule, operation });
      } else {
        // An edit is saved by two requests, the settings and then the racks, each committed on its own:
        // the draft is first checked whole (the preview validates both), so a refusal saves neither
        // rather than leaving the settings saved under an error the page shows for the racks.
        result = await call("POST", "/api/v1/schedules:preview", { id: { id: editing }, draft: { schedule, operation }, count: 1 });
        if (result.ok) {
          result = await call("PATCH", `/api/v1/schedules/${editing}`, { schedule: { ...schedule, rollout: schedule.rollout || null, retry: schedule.retry || null, approval: schedule.approval || null } });
        }
        if (result.ok) {
          result = await call("PUT", `/api/v1/schedules/${editing}/scopes`, { desired_scope: target });
          // Refused all the same (a rack deleted since the check): say that the settings were saved.
          if (!result.ok) result.data = { ...result.data, message: `Its settings were saved, but not its racks: ${result.data.message || "refused"}` };
        }
      }
      save.disabled = false;
      if (!result.ok) { showError(form, result.data, result.status); preview(true); return; }
      location.assign(`/schedules/${editing || encodeURIComponent(result.data.id.id)}`);
    });
    showOps();
    // A new form has no racks yet, which the server refuses: asked now, it would open with an error
    // beside fields nobody has touched. It previews from the first change on.
    if (editing || form.querySelector(".chosen li")) preview();
  }

  // --- windows and budgets ------------------------------------------------------------------------------
  function setPath(target, path, value) {
    const keys = path.split(".");
    let node = target;
    keys.slice(0, -1).forEach((key) => { node = node[key] = node[key] || {}; });
    node[keys[keys.length - 1]] = value;
  }
  function resourceBody(form) {
    const body = {};
    const when = form.querySelector("[name=when]:checked");
    form.querySelectorAll("[data-when]").forEach((group) => { group.hidden = when && group.dataset.when !== when.value; });
    form.querySelectorAll("input[name], select[name]").forEach((input) => {
      if (input.name === "when" || input.closest("[data-when]")?.hidden) return;
      const kind = input.dataset.kind || "text";
      const text = String(input.value).trim();
      if (kind === "checks") {
        if (!(input.name in body)) body[input.name] = [];
        if (input.checked) body[input.name].push(input.value);
      } else if (kind === "names") {
        body[input.name] = text.split(",").map((n) => n.trim()).filter(Boolean).map((name) => ({ name }));
      } else if (kind === "int") {
        if (text) body[input.name] = /^\d+$/.test(text) ? Number(text) : text;
      } else {
        setPath(body, input.name, text);
      }
    });
    return body;
  }
  function setUpResource(form) {
    form.addEventListener("change", () => resourceBody(form));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const save = form.querySelector("[data-testid=form-save]");
      save.disabled = true;
      const result = await call(form.dataset.method, form.dataset.url, { [form.dataset.wrapper]: resourceBody(form) });
      save.disabled = false;
      if (!result.ok) { showError(form, result.data, result.status); return; }
      location.assign(form.dataset.then);
    });
    resourceBody(form);
  }

  function setUp() {
    document.querySelectorAll("form[data-editor]:not([data-ready])").forEach((form) => {
      form.dataset.ready = "1";
      if (form.dataset.editor === "schedule") setUpSchedule(form);
      else setUpResource(form);
    });
  }
  document.addEventListener("rackflow:page", setUp);
  setUp();
})();
