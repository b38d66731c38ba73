// The shell: who is signed in and may do what, the navigation, the router.
// Pages (`pages/`, loaded when first visited) export `list`, `create`,
// `detail` (`(main, params, scope)`) or `render`.

import { gql, onUnauthenticated, subscribe } from "./api.js";
import { errorBox, h, link, muted, replace } from "./dom.js";

// A section's list (`/x`), new one (`/x/new`, not elements) and detail
// (`/x/:id`); src/web.rs answers the same paths.
const pages = new Map([["", "overview"], ["sign-in", "signin"], ["account", "account"], ["audit", "audit"]]);
const sections = ["providers", "repositories", "elements", "blueprints", "deployments", "projects", "users"];

const nav = () => [["/", "Overview"], ...sections.filter((s) => s !== "users" || isAdmin()).map((s) => [`/${s}`, s[0].toUpperCase() + s.slice(1)]),
  ...(isAdmin() ? [["/audit", "Audit"]] : [])];

/** The signed-in user (`{ id, username, role, memberships }`) or null, read again at each page. */
export let me = null;

const RANKS = ["VIEWER", "DEPLOYER", "DEVELOPER", "ADMIN"];
export const isAdmin = () => me?.role === "ADMIN";
/** Whether a project role (or null) allows what `need` does. */
export const allows = (role, need) => RANKS.indexOf(role) >= RANKS.indexOf(need);
const membership = (id) => me?.memberships.find((m) => m.project.id === id);
/** The user's role in a project (a server admin's is ADMIN), or null. */
export const roleIn = (id) => membership(id)?.role ?? null;
export const projectLink = (id) => (membership(id) ? link(`/projects/${id}`, membership(id).project.name) : muted());
/** The projects (`{ id, name }`) where the role allows `need`. */
export const projectsFor = (need) => (me?.memberships ?? []).filter((m) => allows(m.role, need)).map((m) => m.project);

function match(path) {
  const [first = "", id, ...more] = path.split("/").filter(Boolean);
  if (more.length) return null;
  if (!id) return pages.has(first) ? { module: pages.get(first) } : sections.includes(first) ? { module: first, view: "list" } : null;
  if (!sections.includes(first)) return null;
  return id === "new" && first !== "elements" ? { module: first, view: "create" } : { module: first, view: "detail", id: decodeURIComponent(id) };
}

/** Goes to `path` without reloading. */
export function navigate(path, { replace: replaceState = false } = {}) {
  if (replaceState) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  show();
}

// Everything a page started (subscriptions, timers) ends when it is left.
let scope = null;
class Scope {
  constructor() {
    this.alive = true;
    this.cleanups = [];
  }
  onDispose(fn) {
    this.cleanups.push(fn);
  }
  subscribe(query, variables, sink) {
    const stop = subscribe(query, variables, sink);
    this.onDispose(stop);
    return stop;
  }
  dispose() {
    this.alive = false;
    for (const fn of this.cleanups.splice(0)) fn();
  }
}

const header = document.getElementById("top");
const main = document.getElementById("main");

function drawHeader() {
  const here = location.pathname;
  const current = (href) => ((href === "/" ? here === "/" : here === href || here.startsWith(`${href}/`)) ? "page" : null);
  replace(header,
    h("a.brand", { href: "/" }, "Corbel"),
    me ? h("nav", { "aria-label": "Main" }, nav().map(([href, label]) => h("a", { href, "aria-current": current(href) }, label))) : null,
    h("div.who", h("a", { href: "/graphql", "data-native": "" }, "GraphQL"), me ? [
      h("a#signed-in-as", { href: "/account", "aria-current": current("/account") }, me.username),
      h("button#sign-out.link", { type: "button", onclick: signOut }, "Sign out"),
    ] : null));
}

async function signOut() {
  try {
    await gql("mutation { logout }");
  } catch {
  }
  me = null;
  navigate("/sign-in");
}

// A role changed shows at the next page. Only a session that ended signs out.
let fresh = false; // just read (at start, at sign-in)
async function loadMe() {
  fresh = true;
  try {
    me = (await gql("query Me { me { id username role hasPassword memberships { role project { id name } } } }")).me;
  } catch (error) {
    if (!me || error.code === "UNAUTHENTICATED") me = null;
  }
}

/** After `login`: reads who, goes to `next`. */
export async function signedIn(next) {
  await loadMe();
  navigate(next && next.startsWith("/") && !next.startsWith("//") ? next : "/", { replace: true });
}

async function show() {
  scope?.dispose();
  scope = new Scope();
  const mine = scope;
  const route = match(location.pathname);
  if (me && !fresh) await loadMe();
  fresh = false;
  if (!mine.alive) return;
  if (!me && route?.module !== "signin") {
    const next = location.pathname + location.search;
    history.replaceState(null, "", `/sign-in?next=${encodeURIComponent(next)}`);
    return show();
  }
  drawHeader();
  main.setAttribute("aria-busy", "true");
  if (!route) {
    replace(main, h("h1", "Not found"), h("p", "No page at ", h("code", location.pathname), ". ", link("/", "Go to the overview.")));
    main.removeAttribute("aria-busy");
    return;
  }
  try {
    const page = await import(`./pages/${route.module}.js`);
    if (!mine.alive) return;
    if (page.styles) stylesheet(page.styles);
    const view = replace(main, h("div.page")).firstChild;
    await page[route.view ?? "render"](view, { id: route.id, query: new URLSearchParams(location.search) }, mine);
  } catch (error) {
    if (mine.alive) replace(main, h("h1", "Something went wrong"), errorBox(error));
  } finally {
    if (mine.alive) {
      main.removeAttribute("aria-busy");
      document.body.dataset.ready = route?.module ?? "none";
      // The first page is drawn and its controls work (benches/console.rs).
      if (!performance.getEntriesByName("console-ready").length) performance.mark("console-ready");
      const heading = main.querySelector("h1");
      document.title = heading ? `${heading.textContent} · Corbel` : "Corbel";
    }
  }
}

/** A page's stylesheet (`export const styles`), added once. */
function stylesheet(href) {
  if (document.querySelector(`link[href="${href}"]`)) return;
  document.head.append(h("link", { rel: "stylesheet", href }));
}

// The router follows links (not modified clicks, not `data-native`).
document.addEventListener("click", (event) => {
  const a = event.target.closest("a[href]");
  if (!a || a.hasAttribute("data-native") || a.target || a.hasAttribute("download")) return;
  if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith("/graphql") || url.pathname.startsWith("/artifacts/")) return;
  event.preventDefault();
  navigate(url.pathname + url.search + url.hash);
});
window.addEventListener("popstate", show);

// A session that ends (expired, revoked, disabled) leads to sign-in.
onUnauthenticated(() => {
  if (!me) return;
  me = null;
  navigate(`/sign-in?next=${encodeURIComponent(location.pathname + location.search)}`, { replace: true });
});

await loadMe();
show();
