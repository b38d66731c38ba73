// Providers: the list (statuses live from `serverEvents`), the create form
// (the registration token shown once; secret values written, never read
// back), and one provider: status and log live from `providerEvents`, facts,
// metadata, nodes with their capacity, configuration, and its actions.

import { gql } from "../api.js";
import { navigate } from "../app.js";
import { badge, busy, empty, errorBox, errorSlot, field, h, json, parseObject, replace, time } from "../dom.js";

export const styles = "/ui/css/providers.css";

export function render(view, params, scope) {
  if (params.view === "create") return create(view);
  if (params.view === "detail") return detail(view, params.id, scope);
  return list(view, scope);
}

const FIELDS = `id name gitUrl ref path config secretConfigKeys autoLoad status statusMessage resolvedCommit
  features resourceTypes restarts lastSeenAt createdAt metadata { name description version author runtime features resourceTypes }`;

const muted = (text = "—") => h("span", { class: "muted" }, text);
const code = (text) => h("code", {}, text);
const chips = (items, id, key) => h("ul", { class: "chips", id }, items.map((t) => h("li", { dataset: { [key]: t } }, code(t))));
const card = (id, title, ...body) => h("section", { class: "card", id }, h("h2", {}, title), ...body);

// ---------------------------------------------------------------- the list

const LIST = `query Providers { providers(first: 100) {
  totalCount nodes { id name gitUrl ref path status statusMessage resourceTypes } } }`;
const SERVER_EVENTS = `subscription ProviderStatuses { serverEvents {
  __typename ... on ProviderStatusChanged { providerId status message } } }`;

async function list(view, scope) {
  const body = h("div", { id: "providers" });
  view.append(
    h("div", { class: "toolbar page-head" }, h("h1", { class: "grow" }, "Providers"),
      h("a", { class: "button", href: "/providers/new", id: "add-provider" }, "Add a provider")),
    h("p", { class: "muted" }, "Fetched from git, built and run by Corbel; statuses change here as they happen."),
    body,
  );

  const rows = new Map(); // id -> setStatus(status, message)
  let timer = null;
  const reload = () => {
    clearTimeout(timer);
    timer = setTimeout(load, 150);
  };
  scope.onDispose(() => clearTimeout(timer));
  const apply = (e) => (rows.has(e.providerId) ? rows.get(e.providerId)(e.status, e.message) : reload());

  async function load() {
    try {
      const { providers } = await gql(LIST);
      if (scope.alive) replace(body, table(providers, rows));
    } catch (error) {
      if (scope.alive) replace(body, errorBox(error));
    }
  }

  // Listening before reading: changes while the list loads are applied after,
  // in order. Once the subscription is live (`started`: it was sent after
  // the first read may have begun), after a reconnect, or after missed
  // events, the list is read again.
  let early = [];
  let stale = false;
  scope.subscribe(SERVER_EVENTS, {}, {
    next: ({ serverEvents: e }) => {
      if (e.__typename === "EventsMissed" || stale) {
        stale = false;
        reload();
      }
      if (e.__typename !== "ProviderStatusChanged") return;
      if (early) early.push(e);
      else apply(e);
    },
    reconnecting: () => (stale = true),
    started: reload,
  });
  await load();
  early.splice(0).forEach(apply);
  early = null;
}

function table(providers, rows) {
  rows.clear();
  if (!providers.totalCount) {
    const text = empty("No providers yet.", h("a", { href: "/providers/new" }, "Add a provider"),
      " from a git repository to deploy resources with it.");
    text.id = "providers-empty";
    return text;
  }
  return h("table", { class: "list", id: "provider-list" },
    h("thead", {}, h("tr", {}, ["Name", "Status", "Source", "Resource types"].map((t) => h("th", {}, t)))),
    h("tbody", {}, providers.nodes.map((p) => {
      const status = h("td", { class: "status" });
      const set = (state, message) => replace(status, badge(state), message ? h("div", { class: "muted small" }, message) : null);
      set(p.status, p.statusMessage);
      rows.set(p.id, set);
      return h("tr", { dataset: { id: p.id, name: p.name } },
        h("td", {}, h("a", { href: `/providers/${p.id}`, class: "name" }, p.name)),
        status,
        h("td", { class: "source" }, h("code", { class: "url" }, p.gitUrl), p.ref ? [" @ ", code(p.ref)] : null,
          p.path ? [" in ", code(p.path)] : null),
        h("td", {}, p.resourceTypes.length ? chips(p.resourceTypes, null, "type") : muted()));
    })),
    providers.totalCount > providers.nodes.length
      ? h("caption", { class: "muted" }, `The first ${providers.nodes.length} of ${providers.totalCount}.`) : null,
  );
}

// ---------------------------------------------------------------- creating

const CREATE = `mutation CreateProvider($input: CreateProviderInput!) {
  createProvider(input: $input) { token provider { id name status } } }`;

function create(view) {
  const text = (name, attrs = {}) => h("input", { name, autocomplete: "off", spellcheck: "false", ...attrs });
  const name = text("name", { required: true, autofocus: true });
  const gitUrl = text("gitUrl", { required: true, placeholder: "https://git.example.com/providers/process.git" });
  const ref = text("ref", { placeholder: "main, v1.2.0 or a commit" });
  const path = text("path");
  const config = h("textarea", { name: "config", rows: 4, spellcheck: "false", placeholder: '{ "capacity": 10 }' });
  const secret = secretInput("secretConfig", '{ "password": "…" }');
  const autoLoad = h("input", { type: "checkbox", name: "autoLoad", checked: true });
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Create provider");

  const onsubmit = async (event) => {
    event.preventDefault();
    const made = await busy(submit, slot, () => gql(CREATE, {
      input: {
        name: name.value.trim(),
        gitUrl: gitUrl.value.trim(),
        ref: ref.value.trim(),
        path: path.value.trim(),
        config: parseObject(config.value, "Configuration"),
        secretConfig: parseObject(secret.value, "Secret configuration"),
        autoLoad: autoLoad.checked,
      },
    }));
    if (!made) return;
    secret.value = "";
    created(view, made.createProvider);
  };
  view.append(
    h("h1", {}, "Add a provider"),
    h("form", { id: "provider-form", class: "card form", onsubmit },
      field("Name", name),
      field("Git URL", gitUrl, "https, http, git, ssh, file or a local path, as this server allows."),
      h("div", { class: "pair" },
        field("Ref", ref, "Tag, branch or commit; empty: the default branch."),
        field("Path", path, "Folder of corbel-provider.yaml; empty: the root.")),
      field("Configuration", config, "A JSON object of plain values, shown to anyone signed in."),
      field("Secret configuration", secret, "A JSON object, stored sealed and never shown again: only its key names are."),
      h("label", { class: "check" }, autoLoad, "Load it now and at every server start"),
      slot,
      h("div", { class: "toolbar" }, submit, h("a", { href: "/providers", class: "button secondary" }, "Cancel"))),
  );
}

/** Secret values are typed like a password and never filled in from the server. */
function secretInput(name, placeholder) {
  return h("textarea", { name, rows: 3, class: "secret-input", autocomplete: "off", autocapitalize: "off", spellcheck: "false", placeholder });
}

function created(view, { token, provider }) {
  replace(view,
    h("h1", {}, `Provider ${provider.name} created`),
    h("section", { class: "card form", id: "provider-created", dataset: { id: provider.id } },
      h("p", {}, provider.status === "UNLOADED" ? "It is not loaded: load it from its page." : "It is loading: open it to watch it connect."),
      tokenBox(token, "provider-token"),
      h("div", { class: "toolbar" },
        h("a", { class: "button", href: `/providers/${provider.id}`, id: "open-provider" }, `Open ${provider.name}`),
        h("a", { class: "button secondary", href: "/providers" }, "All providers"))),
  );
}

/** A registration token, shown this once (one click selects it all). */
function tokenBox(token, id, ...more) {
  return h("div", { class: "token-box", id: `${id}-box` },
    h("strong", {}, "Registration token, shown this once"),
    h("code", { class: "secret token", id }, token),
    h("p", { class: "hint" }, "Corbel keeps only its hash: copy it now to run this provider outside Corbel (as ",
      code("CORBEL_PROVIDER_TOKEN"), "). One Corbel loads itself needs nothing from you."),
    ...more);
}

// ---------------------------------------------------------------- one provider

const PROVIDER = `query Provider($id: ID!) { provider(id: $id) { ${FIELDS} } }`;
const NODES = `query ProviderNodes($id: ID!) { provider(id: $id) { id nodes { name capacity labels } } }`;
const LOGS = `query ProviderLogs($id: ID!) { provider(id: $id) { id logs(last: 200) { at stream line } } }`;
const EVENTS = `subscription ProviderEvents($id: ID!) { providerEvents(id: $id) { status message missed log { at stream line } } }`;
const LOAD = `mutation Load($id: ID!) { loadProvider(id: $id) { id } }`;
const UNLOAD = `mutation Unload($id: ID!) { unloadProvider(id: $id) { id } }`;
const ROTATE = `mutation Rotate($id: ID!) { rotateProviderToken(id: $id) { token } }`;
const DELETE = `mutation Delete($id: ID!) { deleteProvider(id: $id) }`;
const CONFIGURE = `mutation Configure($id: ID!, $config: JSON!, $secretConfig: JSON) {
  configureProvider(id: $id, config: $config, secretConfig: $secretConfig) { ${FIELDS} } }`;

async function detail(view, id, scope) {
  let provider;
  try {
    provider = (await gql(PROVIDER, { id })).provider;
  } catch (error) {
    view.append(h("h1", {}, "Provider"), errorBox(error), h("p", {}, h("a", { href: "/providers" }, "All providers")));
    return;
  }
  if (!scope.alive) return;

  let status = provider.status;
  const buttons = actions(id, () => provider);
  const badgeSlot = h("span", { id: "provider-status-slot" });
  const message = h("p", { id: "provider-message", class: "muted" });
  const showStatus = (s, text) => {
    status = s;
    const b = badge(s);
    b.id = "provider-status";
    replace(badgeSlot, b);
    message.textContent = text ?? "";
    buttons.setStatus(s);
  };
  showStatus(status, provider.statusMessage);
  const facts = h("div");
  const about = h("div");
  const configView = h("div", { id: "provider-config" });
  const nodes = h("div", { id: "provider-nodes", "aria-live": "polite" });
  const live = h("span", { class: "live", id: "log-live" }, "connecting…");
  const logBox = h("div", { class: "log", id: "provider-logs", role: "log", tabindex: "0", "aria-label": "Provider log" });

  const draw = (p) => {
    provider = p;
    drawFacts(facts, p);
    drawAbout(about, p);
    drawConfig(configView, p);
  };
  draw(provider);

  // Nodes are asked of the provider itself: only while it is connected.
  let nodesAsked = false;
  async function loadNodes() {
    nodesAsked = true;
    try {
      const data = await gql(NODES, { id });
      if (scope.alive && status === "CONNECTED") drawNodes(nodes, data.provider.nodes);
    } catch (error) {
      if (scope.alive) replace(nodes, error.code === "PROVIDER_UNAVAILABLE" ? calm(`Not available now: ${error.message}`) : errorBox(error));
    }
  }
  const notConnected = () => {
    nodesAsked = false;
    replace(nodes, calm(`Nodes are asked of the provider while it is connected; it is ${status.toLowerCase()} now.`));
  };
  if (status === "CONNECTED") loadNodes();
  else notConnected();

  // Facts (commit, metadata, restarts) change with the status: read again.
  let timer = null;
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(() => gql(PROVIDER, { id }).then((d) => scope.alive && draw(d.provider), () => {}), 150);
  };
  scope.onDispose(() => clearTimeout(timer));

  // The log: the last 200 lines, then each line as it comes. Lines arriving
  // while the 200 load are held, and added after without those they hold.
  let mode = "waiting";
  let held = [];
  const key = (l) => `${l.at}|${l.stream}|${l.line}`;
  function addLine(l) {
    const bottom = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 32;
    logBox.querySelector(".empty")?.remove();
    logBox.append(h("div", { class: "line", dataset: { stream: l.stream } },
      h("span", { class: "stream", title: l.at }, l.stream), h("span", { class: "text" }, l.line)));
    while (logBox.childElementCount > 2000) logBox.firstElementChild.remove();
    if (bottom) logBox.scrollTop = logBox.scrollHeight;
  }
  async function loadLogs() {
    mode = "loading";
    held = [];
    let lines = [];
    let failed = null;
    try {
      lines = (await gql(LOGS, { id })).provider.logs;
    } catch (error) {
      failed = error;
    }
    if (!scope.alive) return;
    const shown = new Set(lines.map(key));
    replace(logBox, failed ? errorBox(failed) : null);
    lines.concat(held.filter((l) => !shown.has(key(l)))).forEach(addLine);
    held = [];
    mode = "live";
    if (!logBox.childElementCount) logBox.append(h("p", { class: "empty" }, "No output yet."));
    logBox.scrollTop = logBox.scrollHeight;
  }

  const setLive = (on, text) => {
    live.dataset.live = on ? "on" : "off";
    live.textContent = text;
  };
  scope.subscribe(EVENTS, { id }, {
    next: ({ providerEvents: e }) => {
      if (e.status) {
        const was = status;
        showStatus(e.status, e.message);
        if (status === "CONNECTED" && (!nodesAsked || was !== "CONNECTED")) loadNodes();
        if (status !== "CONNECTED") notConnected();
        if (was !== status || mode === "waiting") refresh();
      }
      if (e.log) {
        if (mode === "live") addLine(e.log);
        else held.push(e.log);
      }
      // The first event (the status now) after starting or reconnecting, or
      // events missed: read the log again.
      if (mode === "waiting" || e.missed) {
        setLive(true, "live");
        loadLogs();
      }
    },
    error: (error) => setLive(false, `stopped: ${error.code}`),
    complete: () => setLive(false, "ended"),
    reconnecting: () => {
      mode = "waiting";
      setLive(false, "reconnecting…");
    },
  });

  const editor = configEditor(id, () => provider, (p) => {
    draw(p);
    if (status === "CONNECTED") loadNodes();
  });
  view.append(
    h("div", { class: "toolbar page-head" }, h("h1", {}, provider.name), badgeSlot),
    message,
    buttons,
    h("div", { class: "provider-grid" },
      h("div", { class: "col" }, card("provider-facts", "Source", facts), card("provider-nodes-card", "Nodes", nodes)),
      h("div", { class: "col" }, card("provider-metadata", "Metadata", about), card("provider-config-card", "Configuration", configView, editor))),
    h("section", { class: "card log-card" },
      h("div", { class: "toolbar" }, h("h2", { class: "grow" }, "Log"), live), logBox),
  );
}

const calm = (text) => h("p", { class: "muted", dataset: { code: "PROVIDER_UNAVAILABLE" } }, text);

function dl(rows) {
  return h("dl", { class: "facts" }, rows.map(([label, name, value]) => [h("dt", {}, label), h("dd", { dataset: { field: name } }, value)]));
}

function drawFacts(el, p) {
  replace(el, dl([
    ["Git URL", "gitUrl", code(p.gitUrl)],
    ["Ref", "ref", p.ref ? code(p.ref) : muted("default branch")],
    ["Path", "path", p.path ? code(p.path) : muted("repository root")],
    ["Resolved commit", "resolvedCommit", p.resolvedCommit ? code(p.resolvedCommit) : muted("not fetched yet")],
    ["Loads at start", "autoLoad", p.autoLoad ? "yes" : "no"],
    ["Restarts", "restarts", String(p.restarts)],
    ["Last seen", "lastSeenAt", time(p.lastSeenAt)],
    ["Created", "createdAt", time(p.createdAt)],
  ]));
}

function drawAbout(el, p) {
  const m = p.metadata;
  // Announced at registration; until then, what corbel-provider.yaml says.
  const types = p.resourceTypes.length ? p.resourceTypes : m?.resourceTypes ?? [];
  const features = p.features.length ? p.features : m?.features ?? [];
  replace(el,
    m ? dl([
      ["Name", "metaName", m.name],
      ["Description", "description", m.description || muted()],
      ["Version", "version", code(m.version)],
      ["Author", "author", m.author || muted()],
      ["Runtime", "runtime", m.runtime],
    ]) : h("p", { class: "muted" }, "Read from corbel-provider.yaml once fetched."),
    h("h3", {}, "Features"),
    features.length ? chips(features, "provider-features", "feature") : h("p", { class: "muted" }, "None yet."),
    h("h3", {}, "Resource types"),
    types.length ? chips(types, "resource-types", "type") : h("p", { class: "muted" }, "None yet."),
  );
}

function drawNodes(el, list) {
  if (!list.length) return replace(el, h("p", { class: "empty" }, "The provider reports no nodes."));
  // One scale for every bar: the largest count of any node.
  const top = Math.max(1, ...list.flatMap((n) => Object.values(n.capacity).map(Number).filter(Number.isFinite)));
  replace(el, list.map((n) => h("div", { class: "node", dataset: { node: n.name } },
    h("div", { class: "node-head" }, h("strong", {}, n.name),
      Object.entries(n.labels ?? {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`))),
    h("ul", { class: "capacity", "aria-label": `Capacity of ${n.name}` }, Object.entries(n.capacity).map(([type, count]) =>
      h("li", { class: "cap", dataset: { type, count: String(count) } },
        h("code", { class: "type" }, type === "*" ? "* (any type)" : type),
        h("span", { class: "bar", "aria-hidden": "true" }, h("span", { style: `width: ${Math.min(100, (Math.max(0, Number(count)) / top) * 100)}%` })),
        h("span", { class: "count" }, String(count))))))));
}

function drawConfig(el, p) {
  const keys = p.secretConfigKeys;
  replace(el,
    h("h3", {}, "Plain values"),
    Object.keys(p.config ?? {}).length ? json(p.config) : h("p", { class: "muted" }, "None."),
    h("h3", {}, "Secret values"),
    keys.length ? [chips(keys, "secret-keys", "key"), h("p", { class: "hint" }, "Only their names: the values are never shown.")]
      : h("p", { class: "muted", id: "secret-keys" }, "None."),
  );
}

function configEditor(id, current, saved) {
  const config = h("textarea", { name: "config", rows: 6, spellcheck: "false" });
  const secret = secretInput("secretConfig", "Empty keeps the secret values");
  const slot = errorSlot();
  const save = h("button", { type: "submit" }, "Save configuration");
  const open = h("button", { type: "button", class: "secondary", id: "edit-config" }, "Edit configuration");
  const close = () => {
    form.hidden = true;
    open.hidden = false;
    slot.clear();
    secret.value = "";
  };
  const onsubmit = async (event) => {
    event.preventDefault();
    const done = await busy(save, slot, () => gql(CONFIGURE, {
      id,
      config: parseObject(config.value, "Configuration"),
      secretConfig: secret.value.trim() ? parseObject(secret.value, "Secret configuration") : null,
    }));
    if (!done) return;
    close();
    open.focus();
    saved(done.configureProvider);
  };
  const form = h("form", { id: "config-form", hidden: true, onsubmit },
    field("New plain values", config, "The whole JSON object; a connected provider must accept it."),
    field("New secret values", secret, "Empty keeps the secret values; a JSON object replaces them all."),
    slot,
    h("div", { class: "toolbar" }, save, h("button", { type: "button", class: "secondary", onclick: () => (close(), open.focus()) }, "Cancel")));
  open.addEventListener("click", () => {
    config.value = JSON.stringify(current().config ?? {}, null, 2);
    form.hidden = false;
    open.hidden = true;
    config.focus();
  });
  return h("div", { class: "config-edit" }, open, form);
}

/** Load, Unload, Rotate token and Delete, each with its error below them. */
function actions(id, current) {
  const panel = h("div", { class: "action-panel" });
  const slots = {};
  const button = (name, label, cls, onclick) => {
    slots[name] = errorSlot();
    slots[name].id = `${name}-error`;
    return h("button", { type: "button", id: name, class: cls, onclick: (event) => {
      for (const s of Object.values(slots)) s.clear();
      replace(panel);
      onclick(event.currentTarget);
    } }, label);
  };
  const load = button("load", "Load", null, (b) => busy(b, slots.load, () => gql(LOAD, { id })));
  const unload = button("unload", "Unload", "secondary", (b) => busy(b, slots.unload, () => gql(UNLOAD, { id })));
  const rotate = button("rotate", "Rotate token", "secondary", () => confirmIn(panel,
    "The old token stops working at once; a provider run outside Corbel will need the new one.",
    h("button", { type: "button", id: "rotate-confirm" }, "Rotate token"),
    async (yes) => {
      const done = await busy(yes, slots.rotate, () => gql(ROTATE, { id }));
      if (done) replace(panel, tokenBox(done.rotateProviderToken.token, "rotated-token",
        h("div", {}, h("button", { type: "button", class: "secondary", onclick: () => replace(panel) }, "Done"))));
    }));
  const remove = button("delete", "Delete", "danger", () => confirmIn(panel,
    `Delete ${current().name} with its configuration and log? Refused while it is loaded or holds resources.`,
    h("button", { type: "button", id: "delete-confirm", class: "danger" }, "Delete provider"),
    async (yes) => {
      if (await busy(yes, slots.delete, () => gql(DELETE, { id }))) navigate("/providers");
    }));
  const el = h("div", { class: "actions" },
    h("div", { class: "toolbar", role: "group", "aria-label": "Actions" }, load, unload, rotate, remove),
    panel,
    h("div", { class: "action-errors" }, Object.values(slots)));
  // The likely next step stands out: Load while stopped, Unload while loaded.
  el.setStatus = (status) => {
    const stopped = status === "UNLOADED" || status === "FAILED";
    load.classList.toggle("secondary", !stopped);
    unload.classList.toggle("secondary", stopped);
  };
  return el;
}

/** Asks in the page (no dialog): the question, the button that does it, Cancel. */
function confirmIn(panel, question, yes, act) {
  yes.addEventListener("click", () => act(yes));
  replace(panel, h("div", { class: "confirm", role: "group", "aria-label": "Confirm" }, h("p", {}, question),
    h("div", { class: "toolbar" }, yes, h("button", { type: "button", class: "secondary", onclick: () => replace(panel) }, "Cancel"))));
  yes.focus();
}
