// Small DOM helpers shared by every page: building elements, showing errors,
// states, times and empty lists. No framework: pages build nodes and replace them.

/**
 * `h("a", { href: "/x", class: "link", onclick: fn }, "text", child)`.
 * Attributes starting with `on` become listeners; `null`/`false` children and
 * attributes are skipped; arrays of children are flattened.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

/** An SVG element (attributes set as given). */
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces everything inside `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/**
 * An error where the user acted: its message and its code. `role=alert` so
 * screen readers say it; `data-code` so tests can find it.
 */
export function errorBox(error) {
  const code = error?.code ?? "ERROR";
  const details = error?.extensions?.dependents?.length
    ? h("p", {}, "Needed by: ", error.extensions.dependents.map((d) => d.name ?? d).join(", "))
    : null;
  return h(
    "div",
    { class: "error", role: "alert", dataset: { code } },
    h("strong", {}, code),
    " ",
    error?.message ?? String(error),
    details,
  );
}

/** A place for an operation's error: `slot.show(e)`, `slot.clear()`. */
export function errorSlot() {
  const el = h("div", { class: "error-slot", "aria-live": "polite" });
  el.show = (error) => replace(el, errorBox(error));
  el.clear = () => replace(el);
  return el;
}

/** A state (`CONNECTED`, `FAILED`, …) as a coloured badge. */
export function badge(state) {
  const s = state ?? "UNKNOWN";
  return h("span", { class: `badge state-${s.toLowerCase()}`, dataset: { state: s } }, s);
}

/** A time as the reader's local time, with the exact value on hover. */
export function time(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const d = new Date(iso);
  return h("time", { datetime: iso, title: iso }, d.toLocaleString());
}

/** What an empty list says, with what to do next. */
export function empty(text, ...action) {
  return h("p", { class: "empty" }, text, " ", ...action);
}

/** A link that the router follows without reloading. */
export function link(href, ...children) {
  return h("a", { href }, ...children);
}

/** JSON shown as indented text. */
export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

/** A labelled form field: `field("Name", h("input", {...}))`. */
export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, label),
    control,
    hint ? h("small", { class: "hint" }, hint) : null,
  );
}

/**
 * Runs `action` for a button or form: disables it meanwhile, shows the error
 * in `slot` (an `errorSlot()`), and returns what `action` returned or
 * `undefined` when it failed.
 */
export async function busy(control, slot, action) {
  control.disabled = true;
  control.setAttribute("aria-busy", "true");
  slot?.clear();
  try {
    return await action();
  } catch (error) {
    if (slot) slot.show(error);
    else throw error;
    return undefined;
  } finally {
    control.disabled = false;
    control.removeAttribute("aria-busy");
  }
}

/** Parses a JSON object typed by a user; names the field when it is not one. */
export function parseObject(text, name) {
  const trimmed = text.trim();
  if (!trimmed) return {};
  let value;
  try {
    value = JSON.parse(trimmed);
  } catch (e) {
    throw Object.assign(new Error(`${name}: not valid JSON (${e.message})`), { code: "VALIDATION" });
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw Object.assign(new Error(`${name}: must be a JSON object`), { code: "VALIDATION" });
  }
  return value;
}
