// Elements: a search (its terms in the URL, so reload and back keep them),
// and one element's page: its versions, the install plan drawn as a tree
// before installing, upgrade to a chosen version, uninstall, artifacts.

import { gql } from "../api.js";
import { navigate } from "../app.js";
import { badge, busy, empty, errorBox, errorSlot, field, h, json, replace, time } from "../dom.js";

export const styles = "/ui/css/elements.css";

export async function render(view, params, scope) {
  if (params.view === "detail") return detail(view, params.id, scope);
  return list(view, params.query, scope);
}

/** Compares versions (MAJOR.MINOR.PATCH[-suffix][+build]): a release beats its pre-releases. */
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

function installedMark(installed) {
  return installed ? h("span", { class: "badge state-active mark", dataset: { installed: "true" } }, "installed") : null;
}

// The search ---------------------------------------------------------------

async function list(view, query, scope) {
  const search = h("input", { type: "search", name: "search", value: query.get("search") ?? "", placeholder: "Part of a name" });
  const installed = h(
    "select",
    { name: "installed" },
    [["", "Installed or not"], ["true", "Installed"], ["false", "Not installed"]].map(([v, t]) => h("option", { value: v, selected: (query.get("installed") ?? "") === v }, t)),
  );
  const repository = h("select", { name: "repositoryId" }, h("option", { value: "" }, "Every repository"));
  const form = h(
    "form",
    {
      id: "element-search",
      role: "search",
      class: "toolbar",
      onsubmit: (event) => {
        event.preventDefault();
        const q = new URLSearchParams();
        if (search.value.trim()) q.set("search", search.value.trim());
        if (installed.value) q.set("installed", installed.value);
        if (repository.value) q.set("repositoryId", repository.value);
        const qs = q.toString();
        navigate(qs ? `/elements?${qs}` : "/elements");
      },
    },
    h("div", { class: "grow" }, field("Name contains", search)),
    field("State", installed),
    field("Repository", repository),
    h("button", { type: "submit" }, "Search"),
  );
  for (const select of [installed, repository]) select.addEventListener("change", () => form.requestSubmit());
  const results = h("div", { id: "element-results" });
  view.append(h("h1", {}, "Elements"), form, results);

  const filter = {
    search: query.get("search") || null,
    installed: { true: true, false: false }[query.get("installed")] ?? null,
    repositoryId: query.get("repositoryId") || null,
  };
  try {
    const data = await gql(
      `query Elements($f: ElementFilter) {
        repositories(first: 500) { nodes { id name } }
        elements(filter: $f, first: 500) { totalCount nodes { id name version installed repository { id name } } }
      }`,
      { f: filter },
    );
    if (!scope.alive) return;
    for (const r of data.repositories.nodes) repository.append(h("option", { value: r.id, selected: r.id === filter.repositoryId }, r.name));
    draw(results, data, filter);
  } catch (error) {
    replace(results, errorBox(error));
  }
}

function draw(results, data, filter) {
  const { nodes, totalCount } = data.elements;
  if (!nodes.length) {
    const filtered = filter.search || filter.installed !== null || filter.repositoryId;
    replace(
      results,
      filtered
        ? empty("No element matches.", h("a", { href: "/elements" }, "Clear the search"), " to see every element.")
        : data.repositories.nodes.length
          ? empty("No elements yet: a repository's sync stores them.", h("a", { href: "/repositories" }, "See the repositories."))
          : empty("No elements yet.", h("a", { href: "/repositories/new" }, "Add a repository"), " to mirror some."),
    );
    return;
  }
  const groups = new Map();
  for (const e of nodes) groups.set(e.name, [...(groups.get(e.name) ?? []), e]);
  replace(
    results,
    h("p", { class: "muted" }, `${groups.size} name(s), ${nodes.length} version(s)${totalCount > nodes.length ? ` of ${totalCount}: narrow the search to see the rest` : ""}.`),
    h(
      "table",
      { class: "list", id: "elements" },
      h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Versions"), h("th", {}, "Repository"))),
      h(
        "tbody",
        {},
        [...groups].map(([name, versions]) => {
          versions.sort(newestFirst);
          const repos = [...new Set(versions.map((v) => v.repository.name))];
          return h(
            "tr",
            { dataset: { name, installed: String(versions.some((v) => v.installed)) } },
            h("td", {}, h("a", { href: `/elements/${versions[0].id}` }, h("strong", {}, name))),
            h(
              "td",
              {},
              h(
                "ul",
                { class: "el-versions" },
                versions.map((v) =>
                  h(
                    "li",
                    {},
                    h("a", { href: `/elements/${v.id}`, dataset: { version: v.version, installed: String(v.installed) } }, v.version),
                    repos.length > 1 ? h("span", { class: "muted" }, ` (${v.repository.name})`) : null,
                    installedMark(v.installed),
                  ),
                ),
              ),
            ),
            h("td", {}, repos.join(", ")),
          );
        }),
      ),
    ),
  );
}

// One element --------------------------------------------------------------

const ELEMENT = `query Element($id: ID!) {
  element(id: $id) {
    id name version status statusMessage installed installedAt createdAt repository { id name }
    dependencies { id name version } dependents { id name version }
  }
}`;

async function detail(view, id, scope) {
  let data;
  try {
    const first = await gql(ELEMENT, { id });
    const versions = await gql(
      `query Versions($name: String!) { elements(filter: { name: $name }, first: 500) { nodes { id version installed repository { id name } } } }`,
      { name: first.element.name },
    );
    data = { element: first.element, versions: versions.elements.nodes.sort(newestFirst) };
  } catch (error) {
    view.append(h("h1", {}, "Element"), errorBox(error), h("p", {}, h("a", { href: "/elements" }, "Search the elements")));
    return;
  }
  if (!scope.alive) return;
  const { element: e, versions } = data;

  const actions = h("section", { class: "card", id: "actions" });
  const manifest = h("section", { id: "manifest" }, h("h2", {}, "Manifest"), h("p", { class: "muted" }, "Loading…"));
  const artifacts = h("section", { id: "artifacts" }, h("h2", {}, "Artifacts"));
  replace(
    view,
    h("h1", {}, e.name, " ", h("span", { class: "el-version" }, e.version)),
    h(
      "div",
      { class: "toolbar", id: "element-state", dataset: { installed: String(e.installed) } },
      badge(e.status),
      e.installed ? installedMark(true) : h("span", { class: "badge", dataset: { installed: "false" } }, "not installed"),
      e.statusMessage ? h("span", { class: "muted" }, e.statusMessage) : null,
    ),
    h(
      "section",
      { class: "card" },
      h(
        "dl",
        { class: "facts", id: "element-facts" },
        h("dt", {}, "Repository"),
        h("dd", {}, h("a", { href: `/repositories/${e.repository.id}` }, e.repository.name)),
        h("dt", {}, "Installed"),
        h("dd", {}, e.installed ? time(e.installedAt) : "no"),
        h("dt", {}, "Stored"),
        h("dd", {}, time(e.createdAt)),
      ),
    ),
    h(
      "section",
      { id: "versions" },
      h("h2", {}, `Versions of ${e.name}`),
      h(
        "ul",
        { class: "el-versions" },
        versions.map((v) =>
          h(
            "li",
            { dataset: { version: v.version, installed: String(v.installed) } },
            v.id === e.id
              ? h("strong", { "aria-current": "page" }, v.version)
              : h("a", { href: `/elements/${v.id}` }, v.version),
            v.repository.id !== e.repository.id ? h("span", { class: "muted" }, ` (${v.repository.name})`) : null,
            installedMark(v.installed),
          ),
        ),
      ),
    ),
    actions,
    e.installed ? related(e) : null,
    artifacts,
    manifest,
  );

  const reload = () => navigate(`/elements/${id}`, { replace: true });
  if (e.installed) installedActions(actions, e, versions);
  else installPreview(actions, e, versions, scope, reload);

  // In a LAZY repository this fetches the manifest; it may fail on its own.
  try {
    const { element } = await gql(`query Manifest($id: ID!) { element(id: $id) { manifest artifacts { urn category fileName url } } }`, { id });
    if (!scope.alive) return;
    replace(manifest, h("h2", {}, "Manifest"), json(element.manifest));
    replace(
      artifacts,
      h("h2", {}, "Artifacts"),
      element.artifacts.length
        ? h(
            "table",
            { class: "list" },
            h("thead", {}, h("tr", {}, h("th", {}, "File"), h("th", {}, "Category"), h("th", {}, "URN"))),
            h(
              "tbody",
              {},
              element.artifacts.map((a) =>
                h(
                  "tr",
                  { dataset: { urn: a.urn } },
                  // The browser sends the session cookie with the download.
                  h("td", {}, h("a", { href: a.url, download: a.fileName, "data-native": "" }, a.fileName)),
                  h("td", {}, a.category),
                  h("td", {}, h("code", {}, a.urn)),
                ),
              ),
            ),
          )
        : h("p", { class: "muted" }, "This element lists no artifacts."),
    );
  } catch (error) {
    replace(manifest, h("h2", {}, "Manifest"), errorBox(error));
    replace(artifacts, h("h2", {}, "Artifacts"), h("p", { class: "muted" }, "Listed with the manifest, which could not be read."));
  }
}

function related(e) {
  const names = (list, none) =>
    list.length
      ? h("ul", { class: "el-versions" }, list.map((d) => h("li", { dataset: { name: d.name } }, h("a", { href: `/elements/${d.id}` }, `${d.name} ${d.version}`))))
      : h("p", { class: "muted" }, none);
  return h(
    "section",
    { class: "card el-related" },
    h("div", { id: "dependencies" }, h("h2", {}, "Installed with it"), names(e.dependencies, "Nothing: it requires no other element.")),
    h("div", { id: "dependents" }, h("h2", {}, "Needed by"), names(e.dependents, "No installed element depends on it.")),
  );
}

function installedActions(actions, e, versions) {
  const others = versions.filter((v) => v.id !== e.id);
  const to = h(
    "select",
    { name: "toId", id: "upgrade-to" },
    others.map((v) => h("option", { value: v.id }, `${v.version}${v.repository.id !== e.repository.id ? ` (${v.repository.name})` : ""}${compareVersions(v.version, e.version) < 0 ? " — older" : ""}`)),
  );
  const upgradeSlot = errorSlot();
  const upgrade = h(
    "button",
    {
      type: "button",
      id: "upgrade",
      onclick: async () => {
        const done = await busy(upgrade, upgradeSlot, () =>
          gql(`mutation Upgrade($id: ID!, $to: ID!) { upgradeElement(id: $id, toId: $to) { id } }`, { id: e.id, to: to.value }),
        );
        if (done) navigate(`/elements/${done.upgradeElement.id}`);
      },
    },
    "Upgrade",
  );
  const uninstallSlot = errorSlot();
  const confirm = h(
    "button",
    {
      type: "button",
      class: "danger",
      id: "confirm-uninstall",
      hidden: true,
      onclick: async () => {
        const done = await busy(confirm, uninstallSlot, () => gql(`mutation Uninstall($id: ID!) { uninstallElement(id: $id) { id } }`, { id: e.id }));
        if (done) navigate(`/elements/${e.id}`, { replace: true });
      },
    },
    `Uninstall ${e.name} ${e.version}`,
  );
  const uninstall = h(
    "button",
    {
      type: "button",
      class: "danger",
      id: "uninstall",
      onclick: () => {
        confirm.hidden = !confirm.hidden;
        uninstall.textContent = confirm.hidden ? "Uninstall…" : "Keep it";
        uninstall.className = confirm.hidden ? "danger" : "secondary";
        uninstallSlot.clear();
      },
    },
    "Uninstall…",
  );
  replace(
    actions,
    h("h2", {}, "Upgrade"),
    others.length
      ? h("div", { class: "toolbar" }, h("label", { for: "upgrade-to" }, "To version"), to, upgrade)
      : h("p", { class: "muted" }, `No other version of ${e.name} is stored.`),
    upgradeSlot,
    h("h2", {}, "Uninstall"),
    h("div", { class: "toolbar" }, uninstall, confirm),
    uninstallSlot,
  );
}

// The install preview ------------------------------------------------------

const PLAN = `query Plan($id: ID!) {
  resolveElement(id: $id) { elements { alreadyInstalled element { id name version manifest } } }
}`;

async function installPreview(actions, e, versions, scope, reload) {
  const installed = versions.find((v) => v.installed);
  const slot = errorSlot();
  const install = h(
    "button",
    {
      type: "button",
      id: "install",
      disabled: true,
      onclick: async () => {
        const done = await busy(install, slot, () => gql(`mutation Install($id: ID!) { installElement(id: $id) { id } }`, { id: e.id }));
        if (done) reload();
      },
    },
    `Install ${e.name} ${e.version}`,
  );
  const preview = h("div", { id: "resolve-preview", "aria-busy": "true" }, h("p", { class: "muted" }, "Resolving…"));
  const upgradeSlot = errorSlot();
  const upgradeHere = installed
    ? h(
        "button",
        {
          type: "button",
          class: "secondary",
          id: "upgrade-here",
          onclick: async () => {
            const done = await busy(upgradeHere, upgradeSlot, () =>
              gql(`mutation Upgrade($id: ID!, $to: ID!) { upgradeElement(id: $id, toId: $to) { id } }`, { id: installed.id, to: e.id }),
            );
            if (done) reload();
          },
        },
        `Upgrade ${installed.version} to ${e.version}`,
      )
    : null;
  replace(
    actions,
    h("h2", {}, "Install"),
    installed
      ? h(
          "div",
          { class: "notice" },
          h("p", {}, h("a", { href: `/elements/${installed.id}` }, `${e.name} ${installed.version}`), " is installed; one version of a name is installed at a time."),
          upgradeHere,
          upgradeSlot,
        )
      : null,
    h("p", { class: "muted" }, "What installing it needs, dependencies under what requires them:"),
    preview,
    h("div", { class: "toolbar" }, install),
    slot,
  );
  try {
    const { resolveElement } = await gql(PLAN, { id: e.id });
    if (!scope.alive) return;
    const plan = resolveElement.elements;
    const adds = plan.filter((p) => !p.alreadyInstalled).length;
    replace(
      preview,
      planTree(plan, e.id),
      h("p", { class: "muted", id: "plan-summary" }, `${adds} to install, ${plan.length - adds} already installed, in this order: `, plan.map((p) => `${p.element.name} ${p.element.version}`).join(" → "), "."),
    );
    install.disabled = false;
  } catch (error) {
    replace(preview, errorBox(error), h("p", { class: "muted" }, "It cannot be installed until this is resolved."));
  } finally {
    preview.removeAttribute("aria-busy");
  }
}

/** What `requirements` says of each name: `{ name: constraints }`. */
function requirementsOf(manifest) {
  const r = manifest?.requirements;
  return r && typeof r === "object" && !Array.isArray(r) ? r : {};
}

const KEYS = { from_version: "≥", ">=": "≥", to_version: "<", "<": "<", version: "=", "==": "=", ">": ">", "<=": "≤" };
function constraintText(c) {
  const parts = Object.entries(c ?? {}).map(([k, v]) => `${KEYS[k] ?? k} ${v}`);
  return parts.length ? parts.join(", ") : "any version";
}

/**
 * The plan (install order) as a tree: the element at the root, and under each
 * element what its manifest requires, matched by name to the plan's elements.
 * A name required twice is drawn under each that requires it.
 */
export function planTree(plan, rootId) {
  const byName = new Map(plan.map((p) => [p.element.name, p]));
  const root = plan.find((p) => p.element.id === rootId) ?? plan[plan.length - 1];
  const node = (p, path, wanted) => {
    const { element: el, alreadyInstalled } = p;
    const kids = Object.entries(requirementsOf(el.manifest)).map(([name, c]) => {
      const child = byName.get(name);
      if (!child) return h("li", { class: "missing", dataset: { name } }, h("span", { class: "plan-node" }, name, " ", h("span", { class: "muted" }, `(${constraintText(c)}), not in the plan`)));
      if (path.includes(name)) return h("li", { dataset: { name } }, h("span", { class: "plan-node" }, `${name} — required again (a cycle)`));
      return node(child, [...path, name], c);
    });
    return h(
      "li",
      { dataset: { name: el.name, version: el.version, installed: String(alreadyInstalled), id: el.id } },
      h(
        "span",
        { class: "plan-node" },
        el.id === rootId ? h("strong", {}, `${el.name} ${el.version}`) : h("a", { href: `/elements/${el.id}` }, `${el.name} ${el.version}`),
        wanted !== undefined ? h("span", { class: "muted want", title: "what the element above asks for" }, `(${constraintText(wanted)})`) : null,
        " ",
        alreadyInstalled
          ? h("span", { class: "badge state-active mark" }, "already installed")
          : h("span", { class: "badge state-pending mark" }, "will be installed"),
      ),
      kids.length ? h("ul", {}, kids) : null,
    );
  };
  return h("ul", { class: "tree plan", id: "resolve-tree" }, node(root, [root.element.name], undefined));
}
