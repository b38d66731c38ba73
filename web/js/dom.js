// DOM helpers: every page shows errors, states, lists and confirmations one way.

/** `h("a#id.class", { href, onclick, dataset }, ...children)`; attributes optional, null/false ones and children skipped. */
export function h(tag, attrs, ...children) {
  if (attrs?.constructor !== Object) {
    children.unshift(attrs);
    attrs = {};
  }
  const [name, ...marks] = tag.split(/(?=[#.])/);
  const el = document.createElement(name);
  for (const mark of marks) {
    if (mark[0] === "#") el.id = mark.slice(1);
    else el.classList.add(mark.slice(1));
  }
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "class") el.classList.add(...String(value).split(" ").filter(Boolean));
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) if (value !== null && value !== undefined) el.setAttribute(key, String(value));
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) el.append(child instanceof Node ? child : String(child));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const link = (href, ...children) => h("a", { href }, ...children);
export const code = (text) => h("code", text);
export const muted = (text = "—") => h("span.muted", text);
export const note = (text, attrs) => h("p.muted", attrs, text);
export const json = (value) => h("pre.json", JSON.stringify(value, null, 2));

/** The page's own check, failing like the server's. */
export const invalid = (message) => Object.assign(new Error(message), { code: "VALIDATION" });

/** An error where the user acted (`role=alert`), its code, and the dependents a refusal names. */
export function errorBox(error) {
  const code = error?.code ?? "ERROR";
  const dependents = error?.extensions?.dependents ?? [];
  return h("div.error", { role: "alert", dataset: { code } }, h("strong", code), " ", error?.message ?? String(error),
    dependents.length ? h("p", "Needed by: ", dependents.map((d) => d.name ?? d).join(", ")) : null);
}

/** A place for an operation's error: `slot.show(e)`, `slot.clear()`. */
export function errorSlot(attrs = {}) {
  const el = h("div.error-slot", { "aria-live": "polite", ...attrs });
  el.show = (error) => replace(el, errorBox(error));
  el.clear = () => replace(el);
  return el;
}

/** Fills `el` with what `draw()` resolves to, or its error: the last fill only, not once the page was left. */
export async function fill(el, scope, draw) {
  const mine = (el.fills = (el.fills ?? 0) + 1);
  let content;
  try {
    content = await draw();
  } catch (error) {
    content = errorBox(error);
  }
  if (scope.alive && el.fills === mine) replace(el, content);
}

/** A page that could not be read: title, error, a way back. */
export const failed = (view, title, error, href, back) => replace(view, h("h1", title), errorBox(error), h("p", link(href, back)));

/** A state (`FAILED`…) as a coloured badge with the word. */
export function badge(state) {
  const s = state ?? "UNKNOWN";
  return h("span", { class: `badge state-${s.toLowerCase()}`, dataset: { state: s } }, s);
}

export const status = (state, message) => [badge(state), message ? h("small.hint", message) : null];

/** Local time; the exact value on hover. */
export const time = (iso) => (iso ? h("time", { datetime: iso, title: iso }, new Date(iso).toLocaleString()) : muted());

/** What an empty list says, parts spaced: `empty("None yet.", link(…), "to add one.")`. */
export function empty(...parts) {
  return h("p.empty", parts.map((part, i) => (i && !/^[.,:;]/.test(part.textContent ?? part) ? [" ", part] : part)));
}

/** `dl.facts` of `[term, value, data-field]` rows; null rows are left out. */
export function facts(rows, attrs = {}) {
  return h("dl.facts", attrs, rows.filter(Boolean).map(([term, value, field]) =>
    h("div", h("dt", term), h("dd", { dataset: field ? { field } : null }, value))));
}

/** `table.list`; `rows` are `<tr>`s, or a `<tbody>` filled later. */
export function table(heads, rows, attrs = {}) {
  const body = rows instanceof HTMLTableSectionElement ? rows : h("tbody", rows);
  return h("table.list", attrs, h("thead", h("tr", heads.map((t) => h("th", { scope: "col" }, t)))), body);
}

/** Small boxes, `[dataset, ...children]` each. */
export const chips = (items, attrs = {}) => h("ul.chips", attrs, items.map(([dataset, ...children]) => h("li", { dataset }, children)));

/** `[label, count, dataset]` rows as bars on one scale (`top`, or the largest). */
export function bars(rows, attrs = {}, top = Math.max(1, ...rows.map(([, n]) => Number(n)).filter(Number.isFinite))) {
  const width = (n) => Math.min(100, (100 * Math.max(0, Number(n) || 0)) / top);
  return h("ul.capacity", attrs, rows.map(([label, count, dataset]) =>
    h("li.cap", { dataset: { ...dataset, count: String(count) } }, code(label),
      h("span.bar", { "aria-hidden": "true" }, h("span", { style: `width: ${width(count)}%` })),
      h("span.count", String(count)))));
}

/** `[label, used, total, dataset]` rows as "used of total" bars, each on its own total. */
export function usedOf(rows, attrs = {}) {
  return h("ul.capacity", attrs, rows.map(([label, used, total, dataset]) => {
    const share = Math.min(100, (100 * Math.max(0, Number(used) || 0)) / Math.max(1, Number(total) || 0));
    return h("li.cap", { dataset: { ...dataset, count: String(total), used: String(used) }, title: `${used} of ${total} used` },
      code(label), h("span.bar", { "aria-hidden": "true" }, h("span", { style: `width: ${share}%` })), h("span.count", `${used} of ${total}`));
  }));
}

/** A provider node's capacity by type as `usedOf` bars: `*` counts every type. */
export const nodeUsage = (n, attrs = {}) => usedOf(Object.entries(n.capacity)
  .map(([type, total]) => [type === "*" ? "* (any type)" : type, Number(n.used?.[type] ?? 0), total, { node: n.name, type }]), attrs);

/** A secret shown this once (a token); a click selects it. */
export function shownOnce(heading, secret, id, ...more) {
  return h("div.token-box", { id: `${id}-box` }, h("strong", heading), h("code.secret.token", { id }, secret), ...more);
}

/** `field("Name", h("input"), "hint")`: a labelled field. */
export function field(label, control, hint) {
  control.id ||= `f-${Math.random().toString(36).slice(2, 9)}`;
  return h("div.field", h("label", { for: control.id }, label), control, hint ? h("small.hint", hint) : null);
}

export const jsonArea = (attrs) => h("textarea", { rows: 4, spellcheck: "false", autocomplete: "off", ...attrs });

/** JSON typed: an "object" (empty is `{}`) or a "list"; the error names the field. */
export function parseJson(text, name, type = "object") {
  if (!text.trim()) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw invalid(`${name}: not valid JSON (${e.message})`);
  }
  const list = Array.isArray(value);
  if (type === "list" ? !list : list || typeof value !== "object" || !value) throw invalid(`${name}: must be a JSON ${type === "list" ? "array" : "object"}`);
  return value;
}

/** Runs `action` for a button, disabled meanwhile: its result, or its error shown in `slot`. */
export async function busy(control, slot, action) {
  control.disabled = true;
  control.setAttribute("aria-busy", "true");
  slot?.clear();
  try {
    return await action();
  } catch (error) {
    if (!slot) throw error;
    slot.show(error);
  } finally {
    control.disabled = false;
    control.removeAttribute("aria-busy");
  }
}

/** A form's `onsubmit`: `busy(button, slot, action)`, then `done(result)`. */
export const sending = (button, slot, action, done) => async (event) => {
  event.preventDefault();
  const result = await busy(button, slot, action);
  if (result) await done?.(result);
};

/** Asks in the page: the question (or fields), `yes` (`act`), Cancel (`close`); `check()`: may `yes` be used. */
export function confirmBox({ question, yes, act, close, check, slot = errorSlot(), id, cancelId }) {
  const ready = () => check && (yes.disabled = !check());
  const onsubmit = async (event) => {
    await sending(yes, slot, act)(event);
    ready();
  };
  yes.type = "submit";
  const onkeydown = (event) => {
    if (event.key === "Escape" && close) {
      event.preventDefault();
      close();
    }
  };
  const box = h("form.confirm", { id, role: "group", "aria-label": "Confirm", oninput: ready, onsubmit, onkeydown },
    typeof question === "string" ? h("p", question) : question,
    h("div.toolbar", yes, h("button.secondary", { type: "button", id: cancelId, onclick: close }, "Cancel")),
    slot);
  ready();
  return box;
}

/** `button` opens a hidden `confirmBox` (its last error cleared), focus on its field or on Cancel; Escape or Cancel close it. */
export function askFirst(button, options) {
  // Kept here, not on the box: `slot` is every element's own attribute.
  const slot = options.slot ?? errorSlot();
  const box = confirmBox({ ...options, slot, close: () => ((box.hidden = true), button.focus()) });
  box.hidden = true;
  button.addEventListener("click", () => {
    box.hidden = false;
    slot.clear();
    box.querySelector("input, button.secondary").focus();
  });
  return box;
}

/** `askFirst` for what cannot be undone: `name()` must be typed first. */
export function typedConfirm(button, name, what, yes, act) {
  const typed = h("input", { id: `${button.id}-name`, autocomplete: "off" });
  return askFirst(button, { id: `${button.id}-form`, question: field(`Type “${name()}” to ${what}`, typed), yes, check: () => typed.value === name(), act });
}

/** Runs `fn` `ms` after the last call, unless the page was left. */
export function later(scope, ms, fn) {
  let timer = null;
  scope.onDispose(() => clearTimeout(timer));
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}

/**
 * A list live from `serverEvents`: `load()` draws it, `apply(event)` changes it
 * or returns `false` (read again). Events during the first read apply after it;
 * it is read again once subscribed, after a reconnect, after missed events.
 */
export async function liveList(scope, subscription, load, apply) {
  const reload = later(scope, 150, load);
  const use = (e) => apply(e) === false && reload();
  let early = [];
  let stale = false;
  scope.subscribe(subscription, {}, {
    next: ({ serverEvents: e }) => {
      if (e.__typename === "EventsMissed" || stale) {
        stale = false;
        reload();
      }
      if (early) early.push(e);
      else use(e);
    },
    reconnecting: () => (stale = true),
    started: reload,
  });
  await load();
  early.splice(0).forEach(use);
  early = null;
}
