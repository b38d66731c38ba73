// A large deployment's graph by level (dag.js draws it so past LARGE nodes):
// each layer a column listing its keys, a key's header naming what it depends
// on, its replicas in rows below it. A column draws only the rows in its view
// and the columns in the box's (a virtualised list): a 10,000-node deployment
// is a few hundred elements, not 10,000 SVG groups. Every node's state is kept
// in a Map, so an update to a row not drawn shows when it scrolls in.

import { h } from "../dom.js";

const ROW = 26; // a row's height at scale 1, px
const HEAD = 2; // a key's header, in rows
const COLUMN = 280; // a column's width at scale 1, px
const GAP = 16; // between columns, and around them
const VIEW = 18; // rows a column shows before it scrolls
const OVER = 8; // rows drawn past each edge of a view, so a scroll shows no gap

const words = (s) => s.toLowerCase().replace(/_/g, " ");

/**
 * `byLayer` and `deps` as `layers()` gives them, `typeOf` key → type.
 * Returns what `drawDag` does: `{ el, set, select, zoom, scale }`.
 */
export function drawLevels(byLayer, deps, typeOf, nodes, onSelect) {
  const v = {
    known: new Map(), // label -> { key, state, health }: every node's, drawn or not
    byKey: new Map(byLayer.flat().map((k) => [k, []])), // key -> its labels by replica
    shown: new Map(), // label or key -> its drawn row or header
    tallies: new Map(byLayer.flat().map((k) => [k, new Map()])), // key -> state -> its nodes in it
    root: h("div.dag-levels", { role: "group", "aria-label": `Resources by level, ${nodes.length} nodes: each level's list scrolls` }),
    s: 1, // the scale
    selected: null,
    headers: (k) => header(k, v.byKey.get(k), typeOf.get(k), deps.get(k)),
  };
  for (const n of [...nodes].sort((a, b) => a.replica - b.replica)) {
    const name = `${n.key}[${n.replica}]`;
    v.known.set(name, { key: n.key, state: n.state, health: n.health ?? "UNKNOWN" });
    v.byKey.get(n.key).push(name);
    count(v.tallies.get(n.key), n.state, 1);
  }
  v.columns = byLayer.map((keys, i) => {
    const c = column(keys, i, v.byKey);
    c.view.addEventListener("scroll", () => draw(v, c), { passive: true });
    v.root.append(c.el);
    return c;
  });
  v.drawAll = () => v.columns.forEach((c) => draw(v, c));
  v.root.addEventListener("scroll", v.drawAll, { passive: true });
  new ResizeObserver(() => requestAnimationFrame(v.drawAll)).observe(v.root);
  const choose = (event) => act(v, event, onSelect);
  v.root.addEventListener("click", choose);
  v.root.addEventListener("keydown", choose);
  size(v);
  v.drawAll();
  const { known, byKey, shown, tallies } = v;
  return {
    el: v.root,
    set(name, state, health) {
      const names = known.has(name) ? [name] : byKey.get(name) ?? [];
      for (const x of names) {
        const n = known.get(x);
        count(tallies.get(n.key), n.state, -1);
        count(tallies.get(n.key), state, 1);
        n.state = state;
        n.health = health ?? n.health;
        if (shown.has(x)) paint(shown.get(x), n, x === v.selected);
      }
      const k = known.get(names[0])?.key;
      if (shown.has(k)) tally(shown.get(k), tallies.get(k));
      return names.length > 0;
    },
    /** Marks it chosen; a node not in view is scrolled to. */
    select(name) {
      const was = shown.get(v.selected);
      v.selected = name;
      if (was) paint(was, known.get(was.dataset.key), false);
      if (!known.has(name)) return;
      const c = v.columns.find((x) => x.items.includes(name));
      if (!shown.has(name)) reveal(v, c, c.items.indexOf(name));
      if (shown.has(name)) paint(shown.get(name), known.get(name), true);
    },
    /** Its rows and columns at `scale` of their size (1: fitted). */
    zoom(scale) {
      v.s = Math.max(0.5, scale ?? 1);
      v.root.dataset.scale = scale == null ? "fit" : v.s.toFixed(2);
      size(v);
      v.drawAll();
    },
    scale: () => v.s,
  };
}

// Sizes follow the scale; what is drawn is placed again.
function size(v) {
  const px = ROW * v.s;
  v.root.style.setProperty("--row", `${px}px`);
  v.root.style.fontSize = `${Math.round(13 * v.s)}px`;
  v.root.style.gap = v.root.style.padding = `${GAP * v.s}px`;
  for (const c of v.columns) {
    c.el.style.width = `${COLUMN * v.s}px`;
    c.rows.style.height = `${c.at.at(-1) * px}px`;
    c.view.style.height = `${Math.min(c.at.at(-1), VIEW) * px}px`;
    for (const [i, el] of c.drawn) el.style.top = `${c.at[i] * px}px`;
  }
}

// A column's rows in view (none when it is out of the box's); a focused one stays.
function draw(v, c) {
  const { root, known, shown } = v;
  const px = ROW * v.s;
  const left = (GAP + c.i * (COLUMN + GAP)) * v.s;
  const wide = root.clientWidth || innerWidth; // not laid out yet: the window's
  const seen = left < root.scrollLeft + wide && left + COLUMN * v.s > root.scrollLeft;
  const top = c.view.scrollTop / px;
  const from = seen ? firstAfter(c.at, top - OVER) : 0;
  const to = seen ? firstAfter(c.at, top + (c.view.clientHeight || VIEW * px) / px + OVER) : -1;
  for (const [i, el] of c.drawn) {
    if ((i < from || i > to) && el !== document.activeElement) {
      el.remove();
      c.drawn.delete(i);
      shown.delete(c.items[i]);
    }
  }
  for (let i = from; i <= to && i < c.items.length; i++) {
    if (c.drawn.has(i)) continue;
    const k = c.items[i];
    const el = known.has(k) ? row(k, known.get(k), k === v.selected) : tally(v.headers(k), v.tallies.get(k));
    el.dataset.i = i;
    el.style.top = `${c.at[i] * px}px`;
    c.drawn.set(i, el);
    shown.set(k, el);
    c.rows.append(el);
  }
}

// A click, Enter or Space chooses a row; the arrows move to the next row of its column.
function act(v, event, onSelect) {
  const el = event.target.closest?.(".row");
  if (!el) return;
  const down = event.key === "ArrowDown";
  if (event.type === "click" || event.key === "Enter" || event.key === " ") onSelect(el.dataset.key);
  else if (down || event.key === "ArrowUp") {
    const c = v.columns.find((x) => x.rows === el.parentElement);
    let j = Number(el.dataset.i);
    do j += down ? 1 : -1;
    while (j >= 0 && j < c.items.length && !v.known.has(c.items[j])); // past a key's header
    if (j < 0 || j >= c.items.length) return;
    reveal(v, c, j);
    c.drawn.get(j)?.focus();
  } else return;
  event.preventDefault();
}

// Scrolls item `i` of `c` into its column's view (and the column into the box's), then draws.
function reveal(v, c, i) {
  const px = ROW * v.s;
  const [top, bottom] = [c.at[i] * px, c.at[i + 1] * px];
  const view = c.view.clientHeight || VIEW * px;
  if (top < c.view.scrollTop) c.view.scrollTop = top - px * HEAD;
  else if (bottom > c.view.scrollTop + view) c.view.scrollTop = bottom - view;
  c.el.scrollIntoView?.({ block: "nearest", inline: "nearest" });
  v.drawAll();
}

function row(name, n, chosen) {
  const el = h("div.node.row", { tabindex: 0, role: "button", dataset: { key: name, resource: n.key } }, h("span.k", name), h("span.s"), h("span.hl"));
  paint(el, n, chosen);
  return el;
}

/** A layer's column: its keys, each followed by its replicas' labels (`items`), where each starts in rows (`at`). */
function column(keys, i, byKey) {
  const items = [];
  const at = [0];
  for (const k of keys) {
    items.push(k);
    at.push(at.at(-1) + HEAD);
    for (const name of byKey.get(k)) {
      items.push(name);
      at.push(at.at(-1) + 1);
    }
  }
  const count = items.length - keys.length;
  const rows = h("div.level-rows");
  const view = h("div.level-view", { role: "group", "aria-label": `Level ${i + 1}` }, rows);
  const el = h("section.level", h("h3", `Level ${i + 1} · ${count} node${count === 1 ? "" : "s"}`), view);
  return { i, items, at, rows, view, el, drawn: new Map() };
}

/** The first item ending below `row`, by a binary search of where items start. */
function firstAfter(at, row) {
  let [lo, hi] = [0, at.length - 1];
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (at[mid + 1] <= row) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** A key's header: its name and count, type, what it follows, and a tally by state. */
function header(k, labels, type, deps) {
  return h("div.level-key", { dataset: { resource: k } }, h("strong", labels.length === 1 ? k : `${k} × ${labels.length}`),
    h("span.t", [type, deps.length ? `after ${deps.join(", ")}` : null].filter(Boolean).join(" · ")),
    h("span.t.tally"));
}

// A key's nodes counted by state (`tallies`), drawn or not, kept as they change: a replay's
// 30,000 events do not count 10,000 nodes each.
function count(by, state, n) {
  const now = (by.get(state) ?? 0) + n;
  if (now) by.set(state, now);
  else by.delete(state);
}

function tally(el, by) {
  el.querySelector(".tally").textContent = by.size ? [...by].map(([st, n]) => `${n} ${words(st)}`).join(" · ") : "no node yet";
  return el;
}

// As dag.js paints a node: health counts for a deployed node only (COMPLETE), written too.
function paint(el, n, chosen) {
  const shown = n.state === "COMPLETE" ? n.health : "";
  el.dataset.state = n.state;
  el.dataset.health = n.health;
  el.querySelector(".s").textContent = n.state.replace(/_/g, " ");
  el.querySelector(".hl").textContent = shown;
  el.setAttribute("aria-pressed", String(chosen));
  el.setAttribute("aria-label", `${el.dataset.key}: ${n.state}${shown ? `, ${shown}` : ""}`);
}
