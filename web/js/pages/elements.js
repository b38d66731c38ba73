import { gql } from "../api.js";
import { isAdmin, navigate } from "../app.js";
import {
  askFirst, badge, busy, chips, code, empty, errorBox, errorSlot, facts, failed, field, fill, h, json, link, muted, note, replace, table, time,
} from "../dom.js";

export const styles = "/ui/css/elements.css";

/** Semver order: a release beats its pre-releases. */
export function compareVersions(a, b) {
  const parse = (v) => {
    const [core, pre] = v.split("+")[0].split(/-(.*)/s);
    return { nums: core.split(".").map(Number), pre: pre ? pre.split(".") : [] };
  };
  const x = parse(a);
  const y = parse(b);
  for (let i = 0; i < 3; i++) if (x.nums[i] !== y.nums[i]) return (x.nums[i] ?? 0) - (y.nums[i] ?? 0);
  if (!x.pre.length || !y.pre.length) return y.pre.length - x.pre.length;
  for (let i = 0; i < Math.max(x.pre.length, y.pre.length); i++) {
    const p = x.pre[i];
    const q = y.pre[i];
    if (p === undefined) return -1;
    if (q === undefined) return 1;
    if (p === q) continue;
    const [m, n] = [/^\d+$/.test(p), /^\d+$/.test(q)];
    if (m && n) return Number(p) - Number(q);
    if (m !== n) return m ? -1 : 1;
    return p < q ? -1 : 1;
  }
  return 0;
}

const newestFirst = (a, b) => compareVersions(b.version, a.version);
const installedMark = (installed) => (installed ? h("span.badge.state-active.mark", { dataset: { installed: "true" } }, "installed") : null);
const UPGRADE = `mutation Upgrade($id: ID!, $to: ID!) { upgradeElement(id: $id, toId: $to) { id } }`;

function versionChips(versions, here, repository) {
  return chips(versions.map((v) => {
    const dataset = { version: v.version, installed: String(v.installed) };
    return [
      dataset,
      v.id === here ? h("strong", { "aria-current": "page" }, v.version) : h("a", { href: `/elements/${v.id}`, dataset }, v.version),
      v.repository.id !== repository ? muted(`(${v.repository.name})`) : null,
      installedMark(v.installed),
    ];
  }));
}

const SEARCH = `query Elements($f: ElementFilter) {
  repositories(first: 500) { nodes { id name } }
  elements(filter: $f, first: 500) { totalCount nodes { id name version installed repository { id name } } }
}`;

export async function list(view, { query }, scope) {
  const option = (value, text, selected) => h("option", { value, selected }, text);
  const search = h("input", { type: "search", name: "search", value: query.get("search") ?? "", placeholder: "Part of a name" });
  const installed = h("select", { name: "installed" },
    [["", "Installed or not"], ["true", "Installed"], ["false", "Not installed"]].map(([v, t]) => option(v, t, (query.get("installed") ?? "") === v)));
  const repository = h("select", { name: "repositoryId" }, option("", "Every repository"));
  const onsubmit = (event) => {
    event.preventDefault();
    const q = new URLSearchParams();
    if (search.value.trim()) q.set("search", search.value.trim());
    if (installed.value) q.set("installed", installed.value);
    if (repository.value) q.set("repositoryId", repository.value);
    navigate(q.size ? `/elements?${q}` : "/elements");
  };
  const form = h("form#element-search.toolbar", { role: "search", onsubmit },
    h("div.grow", field("Name contains", search)), field("State", installed), field("Repository", repository), h("button", { type: "submit" }, "Search"));
  for (const select of [installed, repository]) select.addEventListener("change", () => form.requestSubmit());
  const results = h("div#element-results");
  view.append(h("h1", "Elements"), form, results);

  const filter = {
    search: query.get("search") || null,
    installed: { true: true, false: false }[query.get("installed")] ?? null,
    repositoryId: query.get("repositoryId") || null,
  };
  await fill(results, scope, async () => {
    const data = await gql(SEARCH, { f: filter });
    for (const r of data.repositories.nodes) repository.append(option(r.id, r.name, r.id === filter.repositoryId));
    return found(data, filter);
  });
}

function found(data, filter) {
  const { nodes, totalCount } = data.elements;
  if (!nodes.length) {
    if (filter.search || filter.installed !== null || filter.repositoryId) return empty("No element matches.", link("/elements", "Clear the search"), "to see every element.");
    return data.repositories.nodes.length
      ? empty("No elements yet: a repository's sync stores them.", link("/repositories", "See the repositories."))
      : empty("No elements yet.", link("/repositories/new", "Add a repository"), "to mirror some.");
  }
  const groups = new Map();
  for (const e of nodes) groups.set(e.name, [...(groups.get(e.name) ?? []), e]);
  const rows = [...groups].map(([name, versions]) => {
    versions.sort(newestFirst);
    const repos = [...new Set(versions.map((v) => v.repository.name))];
    return h("tr", { dataset: { name, installed: String(versions.some((v) => v.installed)) } },
      h("td", link(`/elements/${versions[0].id}`, h("strong", name))),
      h("td", versionChips(versions, null, repos.length > 1 ? null : versions[0].repository.id)),
      h("td", repos.join(", ")));
  });
  return [
    note(`${groups.size} name(s), ${nodes.length} version(s)${totalCount > nodes.length ? ` of ${totalCount}: narrow the search to see the rest` : ""}.`),
    table(["Name", "Versions", "Repository"], rows, { id: "elements" }),
  ];
}

const ELEMENT = `query Element($id: ID!) {
  element(id: $id) {
    id name version status statusMessage installed installedAt createdAt repository { id name }
    dependencies { id name version } dependents { id name version }
  }
}`;
const VERSIONS = `query Versions($name: String!) {
  elements(filter: { name: $name }, first: 500) { nodes { id version installed repository { id name } } }
}`;
const MANIFEST = `query Manifest($id: ID!) { element(id: $id) { manifest artifacts { urn category fileName url } } }`;

export async function detail(view, { id }, scope) {
  let e;
  let versions;
  try {
    e = (await gql(ELEMENT, { id })).element;
    versions = (await gql(VERSIONS, { name: e.name })).elements.nodes.sort(newestFirst);
  } catch (error) {
    return failed(view, "Element", error, "/elements", "Search the elements");
  }
  if (!scope.alive) return;

  const actions = h("section#actions.card");
  const manifest = h("section#manifest", h("h2", "Manifest"), note("Loading…"));
  const artifacts = h("section#artifacts", h("h2", "Artifacts"));
  replace(view,
    h("h1", e.name, " ", h("span.el-version", e.version)),
    h("div#element-state.toolbar", { dataset: { installed: String(e.installed) } },
      badge(e.status),
      e.installed ? installedMark(true) : h("span.badge", { dataset: { installed: "false" } }, "not installed"),
      e.statusMessage ? muted(e.statusMessage) : null),
    h("section.card", facts([
      ["Repository", link(`/repositories/${e.repository.id}`, e.repository.name)],
      ["Installed", e.installed ? time(e.installedAt) : "no"],
      ["Stored", time(e.createdAt)],
    ], { id: "element-facts" })),
    h("section#versions", h("h2", `Versions of ${e.name}`), versionChips(versions, e.id, e.repository.id)),
    actions,
    e.installed ? related(e) : null,
    artifacts,
    manifest);

  // Changes are the server admins'.
  if (!isAdmin()) actions.hidden = true;
  else if (e.installed) installedActions(actions, e, versions);
  else installPreview(actions, e, versions, scope, () => navigate(`/elements/${id}`, { replace: true }));

  // A LAZY repository fetches the manifest now; that may fail.
  try {
    const { element } = await gql(MANIFEST, { id });
    if (!scope.alive) return;
    replace(manifest, h("h2", "Manifest"), json(element.manifest));
    const rows = element.artifacts.map((a) =>
      h("tr", { dataset: { urn: a.urn } },
        h("td", h("a", { href: a.url, download: a.fileName, "data-native": "" }, a.fileName)),
        h("td", a.category),
        h("td", code(a.urn))));
    replace(artifacts, h("h2", "Artifacts"), rows.length ? table(["File", "Category", "URN"], rows) : note("This element lists no artifacts."));
  } catch (error) {
    replace(manifest, h("h2", "Manifest"), errorBox(error));
    replace(artifacts, h("h2", "Artifacts"), note("Listed with the manifest, which could not be read."));
  }
}

function related(e) {
  const names = (list, nothing) => (list.length ? chips(list.map((d) => [{ name: d.name }, link(`/elements/${d.id}`, `${d.name} ${d.version}`)])) : note(nothing));
  return h("section.card.el-related",
    h("div#dependencies", h("h2", "Installed with it"), names(e.dependencies, "Nothing: it requires no other element.")),
    h("div#dependents", h("h2", "Needed by"), names(e.dependents, "No installed element depends on it.")));
}

function installedActions(actions, e, versions) {
  const others = versions.filter((v) => v.id !== e.id);
  const text = (v) => `${v.version}${v.repository.id !== e.repository.id ? ` (${v.repository.name})` : ""}${compareVersions(v.version, e.version) < 0 ? " — older" : ""}`;
  const to = h("select#upgrade-to", { name: "toId" }, others.map((v) => h("option", { value: v.id }, text(v))));
  const upgradeSlot = errorSlot();
  const upgrade = h("button#upgrade", { type: "button" }, "Upgrade");
  upgrade.onclick = async () => {
    const done = await busy(upgrade, upgradeSlot, () => gql(UPGRADE, { id: e.id, to: to.value }));
    if (done) navigate(`/elements/${done.upgradeElement.id}`);
  };
  const uninstall = h("button#uninstall.danger", { type: "button" }, "Uninstall…");
  const confirm = askFirst(uninstall, {
    question: `Uninstall ${e.name} ${e.version}? Refused while an installed element needs it.`,
    yes: h("button#confirm-uninstall.danger", `Uninstall ${e.name} ${e.version}`),
    act: async () => {
      await gql(`mutation Uninstall($id: ID!) { uninstallElement(id: $id) { id } }`, { id: e.id });
      navigate(`/elements/${e.id}`, { replace: true });
    },
  });
  replace(actions,
    h("h2", "Upgrade"),
    others.length ? h("div.toolbar", h("label", { for: "upgrade-to" }, "To version"), to, upgrade) : note(`No other version of ${e.name} is stored.`),
    upgradeSlot,
    h("h2", "Uninstall"),
    uninstall,
    confirm);
}

const PLAN = `query Plan($id: ID!) {
  resolveElement(id: $id) { elements { alreadyInstalled element { id name version manifest } } }
}`;

async function installPreview(actions, e, versions, scope, reload) {
  const installed = versions.find((v) => v.installed);
  const slot = errorSlot();
  const install = h("button#install", { type: "button", disabled: true }, `Install ${e.name} ${e.version}`);
  install.onclick = async () => {
    if (await busy(install, slot, () => gql(`mutation Install($id: ID!) { installElement(id: $id) { id } }`, { id: e.id }))) reload();
  };
  const preview = h("div#resolve-preview", { "aria-busy": "true" }, note("Resolving…"));
  let other = null; // another version installed: upgrade it
  if (installed) {
    const upgradeSlot = errorSlot();
    const upgrade = h("button#upgrade-here.secondary", { type: "button" }, `Upgrade ${installed.version} to ${e.version}`);
    upgrade.onclick = async () => {
      if (await busy(upgrade, upgradeSlot, () => gql(UPGRADE, { id: installed.id, to: e.id }))) reload();
    };
    other = h("div.notice",
      h("p", link(`/elements/${installed.id}`, `${e.name} ${installed.version}`), " is installed; one version of a name is installed at a time."), upgrade, upgradeSlot);
  }
  replace(actions, h("h2", "Install"), other, note("What installing it needs, dependencies under what requires them:"), preview, install, slot);
  try {
    const { resolveElement } = await gql(PLAN, { id: e.id });
    if (!scope.alive) return;
    const plan = resolveElement.elements;
    const adds = plan.filter((p) => !p.alreadyInstalled).length;
    const order = plan.map((p) => `${p.element.name} ${p.element.version}`).join(" → ");
    replace(preview, planTree(plan, e.id), note(`${adds} to install, ${plan.length - adds} already installed, in this order: ${order}.`, { id: "plan-summary" }));
    install.disabled = false;
  } catch (error) {
    replace(preview, errorBox(error), note("It cannot be installed until this is resolved."));
  } finally {
    preview.removeAttribute("aria-busy");
  }
}

function requirementsOf(manifest) {
  const r = manifest?.requirements;
  return r && typeof r === "object" && !Array.isArray(r) ? r : {};
}

const KEYS = { from_version: "≥", ">=": "≥", to_version: "<", "<": "<", version: "=", "==": "=", ">": ">", "<=": "≤" };
function constraintText(c) {
  const parts = Object.entries(c ?? {}).map(([k, v]) => `${KEYS[k] ?? k} ${v}`);
  return parts.length ? parts.join(", ") : "any version";
}

/** The plan as a tree: under each element what its manifest requires. */
export function planTree(plan, rootId) {
  const byName = new Map(plan.map((p) => [p.element.name, p]));
  const root = plan.find((p) => p.element.id === rootId) ?? plan[plan.length - 1];
  const node = (p, path, wanted) => {
    const { element: el, alreadyInstalled } = p;
    const kids = Object.entries(requirementsOf(el.manifest)).map(([name, c]) => {
      const child = byName.get(name);
      if (!child) return h("li.missing", { dataset: { name } }, h("span.plan-node", name, " ", muted(`(${constraintText(c)}), not in the plan`)));
      if (path.includes(name)) return h("li", { dataset: { name } }, h("span.plan-node", `${name} — required again (a cycle)`));
      return node(child, [...path, name], c);
    });
    const title = `${el.name} ${el.version}`;
    return h("li", { dataset: { name: el.name, version: el.version, installed: String(alreadyInstalled), id: el.id } },
      h("span.plan-node",
        el.id === rootId ? h("strong", title) : link(`/elements/${el.id}`, title),
        wanted !== undefined ? h("span.muted", { title: "what the element above asks for" }, `(${constraintText(wanted)})`) : null,
        " ",
        alreadyInstalled ? h("span.badge.state-active.mark", "already installed") : h("span.badge.state-pending.mark", "will be installed")),
      kids.length ? h("ul", kids) : null);
  };
  return h("ul#resolve-tree.tree.plan", node(root, [root.element.name], undefined));
}
