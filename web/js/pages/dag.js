// A deployment's resources as a layered graph (SVG): each resource key one
// layer after the longest chain of its dependencies, ordered in its layer by
// the barycentre of its neighbours (fewer crossings), its replicas stacked in
// a group, edges from dependency to dependent. A node's state, and a deployed
// one's health, are written in its box as well as coloured.

import { svg } from "../dom.js";
import { drawLevels } from "./levels.js";

const W = 176; // a node's box
const H = 60;
const GAP_X = 72; // between layers
const GAP_Y = 10; // between replicas
const GAP_GROUP = 26; // between keys of a layer
const PAD = 18;
const MIN_SCALE = 0.6; // a wide graph is shrunk to fit its box down to this, then scrolls
const INSET = 8; // a group's frame around its replicas
const HEAD = 20; // a group's title
// Past this many nodes the graph is drawn by level, its rows virtualised
// (levels.js): one SVG group a node is no longer drawn in good time, and a
// graph that tall is no longer read as a picture anyway.
const LARGE = 400;

/** `web[0]`: a node as events name it. */
export const label = (n) => `${n.key}[${n.replica}]`;

/** Keys by layer (longest path from the roots), ordered to cross less. */
export function layers(resources, nodes) {
  const keys = [...new Set([...resources.map((r) => r.key), ...nodes.map((n) => n.key)])];
  const deps = new Map(keys.map((k) => [k, []]));
  for (const r of resources) deps.set(r.key, r.dependsOn.filter((d) => deps.has(d) && d !== r.key));
  const depth = new Map();
  const level = (k) => {
    if (!depth.has(k)) {
      depth.set(k, 0); // a cycle (the server refuses them) stops here
      depth.set(k, Math.max(-1, ...deps.get(k).map(level)) + 1);
    }
    return depth.get(k);
  };
  const out = [];
  for (const k of keys) (out[level(k)] ??= []).push(k);
  const layered = Array.from(out, (l) => l ?? []);
  const dependents = new Map(keys.map((k) => [k, []]));
  for (const [k, ds] of deps) for (const d of ds) dependents.get(d).push(k);
  const pos = new Map();
  const index = (l) => l.forEach((k, i) => pos.set(k, (i + 0.5) / l.length));
  const pass = (from, to, step, near) => {
    for (let i = from; step > 0 ? i < to : i > to; i += step) {
      const centre = new Map(layered[i].map((k) => {
        const ps = near.get(k).map((n) => pos.get(n));
        return [k, ps.length ? ps.reduce((a, b) => a + b, 0) / ps.length : pos.get(k)];
      }));
      layered[i].sort((a, b) => centre.get(a) - centre.get(b));
      index(layered[i]); // only this layer moved
    }
  };
  // Barycentre passes: down by dependencies, up by dependents, down again.
  layered.forEach(index);
  pass(1, layered.length, 1, deps);
  pass(layered.length - 2, -1, -1, dependents);
  pass(1, layered.length, 1, deps);
  return { layers: layered, deps };
}

const short = (text, max) => (text.length > max ? `${text.slice(0, max - 1)}…` : text);

/**
 * The graph as an `<svg>`: `resources` give the keys, types and edges,
 * `nodes` the boxes (rows by level past LARGE); `onSelect(label)` runs on click, Enter or Space.
 * Returns `{ el, set(label or key, state, health?) → drawn?, select(label) }`.
 */
export function drawDag(resources, nodes, onSelect) {
  const { layers: byLayer, deps } = layers(resources, nodes);
  const typeOf = new Map(resources.map((r) => [r.key, r.type]));
  if (nodes.length > LARGE) {
    for (const n of nodes) if (!typeOf.has(n.key)) typeOf.set(n.key, n.type);
    return drawLevels(byLayer, deps, typeOf, nodes, onSelect);
  }
  const replicas = new Map(byLayer.flat().map((k) => [k, []]));
  for (const n of [...nodes].sort((a, b) => a.replica - b.replica)) replicas.get(n.key).push(n);
  const grouped = (k) => replicas.get(k).length !== 1;
  const height = (k) => {
    const n = Math.max(1, replicas.get(k).length);
    return n * H + (n - 1) * GAP_Y + (grouped(k) ? HEAD + 2 * INSET : 0);
  };
  const columns = byLayer.map((l) => l.reduce((sum, k) => sum + height(k) + GAP_GROUP, -GAP_GROUP));
  const tallest = Math.max(H, ...columns);
  const boxes = new Map(); // key -> its box (a group's frame, or its one node)
  byLayer.forEach((l, i) => {
    let y = PAD + (tallest - columns[i]) / 2;
    for (const k of l) {
      const g = grouped(k) ? INSET : 0;
      boxes.set(k, { x: PAD + i * (W + GAP_X) - g, y, w: W + 2 * g, h: height(k) });
      y += height(k) + GAP_GROUP;
    }
  });
  // Group frames reach INSET past their column, inside PAD.
  const width = PAD * 2 + Math.max(1, byLayer.length) * (W + GAP_X) - GAP_X;
  const tall = tallest + 2 * PAD;
  const arrow = svg("marker", { id: "dag-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  const root = svg("svg", { width, height: tall, viewBox: `0 0 ${width} ${tall}`, role: "group", "aria-label": "Resources and their dependencies" },
    svg("defs", {}, arrow));
  root.style.minWidth = `${Math.round(width * MIN_SCALE)}px`; // fitted to its box, never smaller than this
  for (const [k, ds] of deps) {
    const to = boxes.get(k);
    for (const d of ds) {
      const from = boxes.get(d);
      const [x1, y1, x2, y2] = [from.x + from.w, from.y + from.h / 2, to.x - 2, to.y + to.h / 2];
      const dx = Math.max(24, (x2 - x1) / 2);
      const path = `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`;
      root.append(svg("path", { class: "edge", "data-from": d, "data-to": k, d: path, "marker-end": "url(#dag-arrow)" }));
    }
  }
  const drawn = new Map(); // label -> <g>
  let selected = null;
  for (const [k, box] of boxes) {
    const list = replicas.get(k);
    const type = typeOf.get(k) ?? list[0]?.type ?? "";
    if (grouped(k)) {
      root.append(svg("rect", { class: "group", x: box.x, y: box.y, width: box.w, height: box.h, rx: 8 }),
        svg("text", { class: "group-title", x: box.x + INSET, y: box.y + 14 }, list.length ? `${k} × ${list.length}` : k));
      if (!list.length) root.append(svg("text", { class: "t", x: box.x + 2 * INSET, y: box.y + HEAD + INSET + 34 }, "no node yet"));
    }
    list.forEach((n, i) => {
      const x = box.x + (grouped(k) ? INSET : 0);
      const y = box.y + (grouped(k) ? HEAD + INSET : 0) + i * (H + GAP_Y);
      const name = label(n);
      const g = svg("g", { class: "node", transform: `translate(${x},${y})`, tabindex: 0, role: "button", "aria-pressed": "false", "data-key": name, "data-resource": k },
        svg("title", {}, `${name} (${type})`),
        svg("rect", { class: "frame", width: W, height: H, rx: 6 }),
        svg("rect", { class: "accent", width: 6, height: H, rx: 3 }),
        svg("text", { class: "k", x: 16, y: 19 }, short(name, 22)),
        svg("text", { class: "t", x: 16, y: 35 }, short(type, 26)),
        svg("text", { class: "s", x: 16, y: 52 }),
        svg("text", { class: "hl", x: W - 8, y: 52, "text-anchor": "end" }));
      g.addEventListener("click", () => onSelect(name));
      g.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          onSelect(name);
        }
      });
      drawn.set(name, g);
      root.append(g);
      paint(g, n.state, n.health);
    });
  }
  return {
    el: root,
    set(name, state, health) {
      const targets = drawn.has(name) ? [drawn.get(name)] : [...drawn.values()].filter((g) => g.dataset.resource === name);
      for (const g of targets) paint(g, state, health ?? g.dataset.health);
      return targets.length > 0;
    },
    select(name) {
      selected?.setAttribute("aria-pressed", "false");
      selected = drawn.get(name) ?? null;
      selected?.setAttribute("aria-pressed", "true");
    },
    /** Draws it at `scale` of its size, its box scrolling; fitted to its box when `null`. */
    zoom(scale) {
      root.dataset.scale = scale == null ? "fit" : scale.toFixed(2);
      root.style.maxWidth = scale == null ? "" : "none";
      root.style.minWidth = scale == null ? `${Math.round(width * MIN_SCALE)}px` : "0";
      root.style.width = scale == null ? "" : `${Math.round(width * scale)}px`;
    },
    /** The scale it is drawn at now. */
    scale: () => root.getBoundingClientRect().width / width,
  };
}

// Health counts for a deployed node only (COMPLETE); it is written, not
// only coloured.
function paint(g, state, health = "UNKNOWN") {
  const shown = state === "COMPLETE" ? health : "";
  g.dataset.state = state;
  g.dataset.health = health;
  g.querySelector(".s").textContent = state.replace(/_/g, " ");
  g.querySelector(".hl").textContent = shown;
  g.setAttribute("aria-label", `${g.dataset.key}: ${state}${shown ? `, ${shown}` : ""}`);
}
