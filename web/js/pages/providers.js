import { gql } from "../api.js";
import { isAdmin, navigate } from "../app.js";
import {
  badge, busy, chips, code, confirmBox, empty, errorBox, errorSlot, facts, failed, field, fill, h, json, jsonArea,
  later, link, liveList, muted, note, parseJson, replace, sending, shownOnce, status, table, time, nodeUsage,
} from "../dom.js";

export const styles = "/ui/css/providers.css";

const FIELDS = `id name gitUrl ref path config secretConfigKeys autoLoad status statusMessage resolvedCommit
  features resourceTypes restarts lastSeenAt createdAt metadata { name description version author runtime features resourceTypes }`;

const codes = (items, id, key) => chips(items.map((t) => [{ [key]: t }, code(t)]), { id });
const card = (id, title, ...body) => h("section.card", { id }, h("h2", title), ...body);

const LIST = `query Providers { providers(first: 100) {
  totalCount nodes { id name gitUrl ref path status statusMessage resourceTypes } } }`;
const SERVER_EVENTS = `subscription ProviderStatuses { serverEvents {
  __typename ... on ProviderStatusChanged { providerId status message }
  ... on ProviderCreated { providerId } ... on ProviderDeleted { providerId } } }`;

export async function list(view, _params, scope) {
  const body = h("div#providers");
  view.append(h("div.toolbar", h("h1.grow", "Providers"), isAdmin() ? h("a#add-provider.button", { href: "/providers/new" }, "Add a provider") : null), body);
  const cells = new Map(); // provider id -> its status cell
  const load = () => fill(body, scope, async () => providerTable((await gql(LIST)).providers, cells));
  await liveList(scope, SERVER_EVENTS, load, (e) => {
    if (e.__typename === "ProviderCreated" || e.__typename === "ProviderDeleted") return false;
    if (e.__typename !== "ProviderStatusChanged") return;
    const cell = cells.get(e.providerId);
    if (!cell) return false; // a provider made since
    replace(cell, status(e.status, e.message));
  });
}

function providerTable(providers, cells) {
  cells.clear();
  if (!providers.totalCount) {
    return Object.assign(isAdmin() ? empty("No providers yet.", link("/providers/new", "Add a provider"), "from a git repository to deploy resources with it.") : empty("No providers yet."), { id: "providers-empty" });
  }
  const rows = providers.nodes.map((p) => {
    const cell = h("td.status", status(p.status, p.statusMessage));
    cells.set(p.id, cell);
    return h("tr", { dataset: { id: p.id, name: p.name } },
      h("td", h("a.name", { href: `/providers/${p.id}` }, p.name)),
      cell,
      h("td.source", h("code.url", p.gitUrl), p.ref ? [" @ ", code(p.ref)] : null, p.path ? [" in ", code(p.path)] : null),
      h("td", p.resourceTypes.length ? codes(p.resourceTypes, null, "type") : muted()));
  });
  return [
    table(["Name", "Status", "Source", "Resource types"], rows, { id: "provider-list" }),
    providers.totalCount > rows.length ? note(`The first ${rows.length} of ${providers.totalCount}.`) : null,
  ];
}

const CREATE = `mutation CreateProvider($input: CreateProviderInput!) {
  createProvider(input: $input) { token provider { id name status } } }`;

const secretArea = (placeholder) => jsonArea({ name: "secretConfig", rows: 3, class: "secret-input", autocapitalize: "off", placeholder });

export function create(view) {
  const text = (name, attrs = {}) => h("input", { name, autocomplete: "off", spellcheck: "false", ...attrs });
  const name = text("name", { required: true, autofocus: true });
  const gitUrl = text("gitUrl", { required: true, placeholder: "https://git.example.com/providers/process.git" });
  const ref = text("ref", { placeholder: "main, v1.2.0 or a commit" });
  const path = text("path");
  const config = jsonArea({ name: "config", placeholder: '{ "capacity": 10 }' });
  const secret = secretArea('{ "password": "…" }');
  const autoLoad = h("input", { type: "checkbox", name: "autoLoad", checked: true });
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Create provider");

  const input = () => ({
    name: name.value.trim(),
    gitUrl: gitUrl.value.trim(),
    ref: ref.value.trim(),
    path: path.value.trim(),
    config: parseJson(config.value, "Configuration"),
    secretConfig: parseJson(secret.value, "Secret configuration"),
    autoLoad: autoLoad.checked,
  });
  const onsubmit = sending(submit, slot, () => gql(CREATE, { input: input() }), (made) => {
    secret.value = "";
    created(view, made.createProvider);
  });
  view.append(
    h("h1", "Add a provider"),
    h("form#provider-form.card.form", { onsubmit },
      field("Name", name),
      field("Git URL", gitUrl, "https, http, git, ssh, file or a local path, as this server allows."),
      h("div.pair", field("Ref", ref, "Tag, branch or commit; empty: the default branch."),
        field("Path", path, "Folder of corbel-provider.yaml; empty: the root.")),
      field("Configuration", config, "A JSON object of plain values, shown to anyone signed in."),
      field("Secret configuration", secret, "A JSON object, stored sealed and never shown again: only its key names are."),
      h("label.check", autoLoad, "Load it now and at every server start"),
      slot,
      h("div.toolbar", submit, h("a.button.secondary", { href: "/providers" }, "Cancel"))),
  );
}

function created(view, { token, provider }) {
  replace(view,
    h("h1", `Provider ${provider.name} created`),
    h("section#provider-created.card.form", { dataset: { id: provider.id } },
      h("p", provider.status === "UNLOADED" ? "Not loaded: load it from its page." : "Loading: open it to watch it connect."),
      tokenBox(token, "provider-token"),
      h("div.toolbar",
        h("a#open-provider.button", { href: `/providers/${provider.id}` }, `Open ${provider.name}`),
        h("a.button.secondary", { href: "/providers" }, "All providers"))));
}

const tokenBox = (token, id, ...more) =>
  shownOnce("Registration token, shown this once", token, id,
    h("p.hint", "Kept only hashed: copy it to run the provider outside Corbel (", code("CORBEL_PROVIDER_TOKEN"), ")."),
    ...more);

const PROVIDER = `query Provider($id: ID!) { provider(id: $id) { ${FIELDS} } }`;
const NODES = `query ProviderNodes($id: ID!) { provider(id: $id) { id nodes { name capacity used labels } } }`;
const LOGS = `query ProviderLogs($id: ID!) { provider(id: $id) { id logs(last: 200) { at stream line } } }`;
const EVENTS = `subscription ProviderEvents($id: ID!) { providerEvents(id: $id) { status message missed log { at stream line } } }`;
const LOAD = `mutation Load($id: ID!) { loadProvider(id: $id) { id } }`;
const UNLOAD = `mutation Unload($id: ID!) { unloadProvider(id: $id) { id } }`;
const ROTATE = `mutation Rotate($id: ID!) { rotateProviderToken(id: $id) { token } }`;
const DELETE = `mutation Delete($id: ID!) { deleteProvider(id: $id) }`;
const CONFIGURE = `mutation Configure($id: ID!, $config: JSON!, $secretConfig: JSON) {
  configureProvider(id: $id, config: $config, secretConfig: $secretConfig) { ${FIELDS} } }`;

export async function detail(view, { id }, scope) {
  let provider;
  try {
    provider = (await gql(PROVIDER, { id })).provider;
  } catch (error) {
    return failed(view, "Provider", error, "/providers", "All providers");
  }
  if (!scope.alive) return;

  // Actions, log and live status: server admins'.
  const admin = isAdmin();
  let state = provider.status;
  const buttons = admin ? actions(id, () => provider) : null;
  const badgeSlot = h("span#provider-status-slot");
  const message = h("p#provider-message.muted");
  const showStatus = (s, text) => {
    state = s;
    replace(badgeSlot, Object.assign(badge(s), { id: "provider-status" }));
    message.textContent = text ?? "";
    buttons?.setStatus(s);
  };
  showStatus(state, provider.statusMessage);
  const [factsBox, about, configView] = [h("div"), h("div"), h("div#provider-config")];
  const nodes = h("div#provider-nodes", { "aria-live": "polite" });
  const live = h("span#log-live.live", "connecting…");
  const logBox = h("div#provider-logs.log", { role: "log", tabindex: "0", "aria-label": "Provider log" });

  const draw = (p) => {
    provider = p;
    replace(factsBox, sourceFacts(p));
    replace(about, metadata(p));
    replace(configView, configuration(p));
  };
  draw(provider);

  // Nodes are asked while it is connected.
  let nodesAsked = false;
  async function loadNodes() {
    nodesAsked = true;
    try {
      const data = await gql(NODES, { id });
      if (scope.alive && state === "CONNECTED") drawNodes(nodes, data.provider.nodes);
    } catch (error) {
      if (scope.alive) replace(nodes, error.code === "PROVIDER_UNAVAILABLE" ? calm(`Not available now: ${error.message}`) : errorBox(error));
    }
  }
  const notConnected = () => {
    nodesAsked = false;
    replace(nodes, calm(`Nodes are asked of the provider while it is connected; it is ${state.toLowerCase()} now.`));
  };
  if (state === "CONNECTED") loadNodes();
  else notConnected();

  const refresh = later(scope, 150, () => gql(PROVIDER, { id }).then((d) => scope.alive && draw(d.provider), () => {}));

  // The last 200 lines, then each as it comes (held while the 200 load).
  let mode = "waiting";
  let held = [];
  const key = (l) => `${l.at}|${l.stream}|${l.line}`;
  function addLine(l) {
    const bottom = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 32;
    logBox.querySelector(".empty")?.remove();
    logBox.append(h("div.line", { dataset: { stream: l.stream } },
      h("span.stream", { title: l.at }, l.stream), h("span.text", l.line)));
    while (logBox.childElementCount > 2000) logBox.firstElementChild.remove();
    if (bottom) logBox.scrollTop = logBox.scrollHeight;
  }
  async function loadLogs() {
    mode = "loading";
    held = [];
    let lines = [];
    let failure = null;
    try {
      lines = (await gql(LOGS, { id })).provider.logs;
    } catch (error) {
      failure = error;
    }
    if (!scope.alive) return;
    const shown = new Set(lines.map(key));
    replace(logBox, failure ? errorBox(failure) : null);
    lines.concat(held.filter((l) => !shown.has(key(l)))).forEach(addLine);
    held = [];
    mode = "live";
    if (!logBox.childElementCount) logBox.append(empty("No output yet."));
    logBox.scrollTop = logBox.scrollHeight;
  }

  const setLive = (on, text) => {
    live.dataset.live = on ? "on" : "off";
    live.textContent = text;
  };
  if (admin) scope.subscribe(EVENTS, { id }, {
    next: ({ providerEvents: e }) => {
      if (e.status) {
        const was = state;
        showStatus(e.status, e.message);
        if (state === "CONNECTED" && (!nodesAsked || was !== "CONNECTED")) loadNodes();
        if (state !== "CONNECTED") notConnected();
        if (was !== state || mode === "waiting") refresh();
      }
      if (e.log) {
        if (mode === "live") addLine(e.log);
        else held.push(e.log);
      }
      // (Re)started or events missed: read the log again.
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

  const editor = admin && configEditor(id, () => provider, (p) => {
    draw(p);
    if (state === "CONNECTED") loadNodes();
  });
  replace(view,
    h("div.toolbar", h("h1", provider.name), badgeSlot),
    message,
    buttons,
    h("div.provider-grid", h("div.col", card("provider-facts", "Source", factsBox), card("provider-nodes-card", "Nodes", nodes)),
      h("div.col", card("provider-metadata", "Metadata", about), card("provider-config-card", "Configuration", configView, editor))),
    admin ? h("section.card.log-card", h("div.toolbar", h("h2.grow", "Log"), live), logBox) : note("The log and live status are for server admins.", { id: "provider-log-note" }),
  );
}

const calm = (text) => note(text, { dataset: { code: "PROVIDER_UNAVAILABLE" } });

function sourceFacts(p) {
  return facts([
    ["Git URL", code(p.gitUrl), "gitUrl"],
    ["Ref", p.ref ? code(p.ref) : muted("default branch"), "ref"],
    ["Path", p.path ? code(p.path) : muted("repository root"), "path"],
    ["Resolved commit", p.resolvedCommit ? code(p.resolvedCommit) : muted("not fetched yet"), "resolvedCommit"],
    ["Loads at start", p.autoLoad ? "yes" : "no", "autoLoad"],
    ["Restarts", String(p.restarts), "restarts"],
    ["Last seen", time(p.lastSeenAt), "lastSeenAt"],
    ["Created", time(p.createdAt), "createdAt"],
  ]);
}

function metadata(p) {
  const m = p.metadata;
  // As registered, else corbel-provider.yaml.
  const types = p.resourceTypes.length ? p.resourceTypes : m?.resourceTypes ?? [];
  const features = p.features.length ? p.features : m?.features ?? [];
  return [
    m ? facts([
      ["Name", m.name, "metaName"],
      ["Description", m.description || muted(), "description"],
      ["Version", code(m.version), "version"],
      ["Author", m.author || muted(), "author"],
      ["Runtime", m.runtime, "runtime"],
    ]) : note("Read from corbel-provider.yaml once fetched."),
    h("h3", "Features"),
    features.length ? codes(features, "provider-features", "feature") : note("None yet."),
    h("h3", "Resource types"),
    types.length ? codes(types, "resource-types", "type") : note("None yet."),
  ];
}

/** Each node's capacity by type, as used of total: `*` counts every type. */
function drawNodes(el, list) {
  if (!list.length) return replace(el, empty("The provider reports no nodes."));
  replace(el, list.map((n) => h("div.node", { dataset: { node: n.name } },
    h("div.node-head", h("strong", n.name),
      Object.entries(n.labels ?? {}).map(([k, v]) => h("span.label", `${k}=${v}`))),
    nodeUsage(n, { "aria-label": `Capacity of ${n.name}, used of total` }))));
}

function configuration(p) {
  const keys = p.secretConfigKeys;
  return [
    h("h3", "Plain values"),
    Object.keys(p.config ?? {}).length ? json(p.config) : note("None."),
    h("h3", "Secret values"),
    keys.length ? [codes(keys, "secret-keys", "key"), h("p.hint", "Only their names: the values are never shown.")] : note("None.", { id: "secret-keys" }),
  ];
}

function configEditor(id, current, saved) {
  const config = jsonArea({ name: "config", rows: 6 });
  const secret = secretArea("Empty keeps the secret values");
  const slot = errorSlot();
  const save = h("button", { type: "submit" }, "Save configuration");
  const open = h("button#edit-config.secondary", { type: "button" }, "Edit configuration");
  const close = () => {
    form.hidden = true;
    open.hidden = false;
    slot.clear();
    secret.value = "";
    open.focus();
  };
  const configure = () => gql(CONFIGURE, {
    id,
    config: parseJson(config.value, "Configuration"),
    secretConfig: secret.value.trim() ? parseJson(secret.value, "Secret configuration") : null,
  });
  const onsubmit = sending(save, slot, configure, (done) => {
    close();
    saved(done.configureProvider);
  });
  const form = h("form#config-form.form", { hidden: true, onsubmit },
    field("New plain values", config, "The whole JSON object; a connected provider must accept it."),
    field("New secret values", secret, "Empty keeps the secret values; a JSON object replaces them all."),
    slot,
    h("div.toolbar", save, h("button.secondary", { type: "button", onclick: close }, "Cancel")));
  open.addEventListener("click", () => {
    config.value = JSON.stringify(current().config ?? {}, null, 2);
    form.hidden = false;
    open.hidden = true;
    config.focus();
  });
  return h("div.config-edit", open, form);
}

function actions(id, current) {
  const panel = h("div.action-panel");
  const slots = { load: errorSlot({ id: "load-error" }), unload: errorSlot({ id: "unload-error" }) };
  const reset = () => {
    slots.load.clear();
    slots.unload.clear();
    replace(panel);
  };
  const button = (name, cls, label, onclick) => h("button", { type: "button", id: name, class: cls, onclick: (event) => (reset(), onclick(event.currentTarget)) }, label);
  const run = (name, cls, label, mutation) => button(name, cls, label, (b) => busy(b, slots[name], () => gql(mutation, { id })));
  const ask = (name, cls, label, question, yes, act) => button(name, cls, label, () => {
    replace(panel, confirmBox({ question: question(), yes, act, close: reset, slot: errorSlot({ id: `${name}-error` }) }));
    yes.focus();
  });

  const load = run("load", null, "Load", LOAD);
  const unload = run("unload", "secondary", "Unload", UNLOAD);
  const rotate = ask("rotate", "secondary", "Rotate token",
    () => "The old token stops working at once; a provider run outside Corbel will need the new one.",
    h("button#rotate-confirm", "Rotate token"),
    async () => {
      const { rotateProviderToken } = await gql(ROTATE, { id });
      replace(panel, tokenBox(rotateProviderToken.token, "rotated-token",
        h("div", h("button.secondary", { type: "button", onclick: reset }, "Done"))));
    });
  const remove = ask("delete", "danger", "Delete",
    () => `Delete ${current().name} with its configuration and log? Refused while it is loaded or holds resources.`,
    h("button#delete-confirm.danger", "Delete provider"),
    async () => {
      await gql(DELETE, { id });
      navigate("/providers");
    });
  const el = h("div.provider-actions",
    h("div.toolbar", { role: "group", "aria-label": "Actions" }, load, unload, rotate, remove), panel, h("div.action-errors", slots.load, slots.unload));
  el.setStatus = (s) => {
    const stopped = s === "UNLOADED" || s === "FAILED";
    load.classList.toggle("secondary", !stopped);
    unload.classList.toggle("secondary", stopped);
  };
  return el;
}
