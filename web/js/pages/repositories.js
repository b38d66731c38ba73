import { ApiError, gql } from "../api.js";
import { isAdmin, navigate } from "../app.js";
import {
  askFirst, busy, chips, code, empty, errorBox, errorSlot, facts, failed, field, fill, h, invalid, later, link, liveList,
  replace, sending, status, table, time,
} from "../dom.js";

export const styles = "/ui/css/repositories.css";

const ROW = `id name status statusMessage invalidElementCount progress { seen stored } lastSyncedAt
  driver { __typename ... on HttpDriver { url } ... on LocalDriver { path } ... on ProviderDriver { providerId } }`;
const FULL = `${ROW} syncMode priority refreshIntervalSeconds nextRefreshAt createdAt`;
const ONE = `query Repository($id: ID!) { repository(id: $id) { ${FULL} } }`;

// A query over the socket after the subscriptions before it (started in
// order): no event falls between what it read and the first event.
function afterSubscribing(scope, query, variables) {
  return new Promise((resolve, reject) => {
    let data = null;
    scope.subscribe(query, variables, {
      next: (d) => (data = d),
      error: reject,
      complete: () => (data ? resolve(data) : reject(new ApiError("no answer over the socket", "BAD_RESPONSE"))),
    });
  });
}

function describe(d) {
  const kind = { HttpDriver: "http", LocalDriver: "local", ProviderDriver: "provider" }[d?.__typename] ?? "migration";
  return [kind, d?.url ?? d?.path ?? d?.providerId ?? ""];
}

function driverText(driver) {
  const [kind, where] = describe(driver);
  return h("span.repo-driver", h("span.badge.kind", kind), " ", code(where));
}

const syncOf = (r) => ({ status: r.status, message: r.statusMessage, seen: r.progress.seen, stored: r.progress.stored, invalid: r.invalidElementCount });

const LIST = `query Repositories { repositories(first: 500) { nodes { ${ROW} } } }`;
const SYNCS = `subscription RepositoryRows { serverEvents { __typename ... on RepositorySync { repositoryId status message seen stored invalid } } }`;

export async function list(view, _params, scope) {
  const body = h("div#repositories-body");
  view.append(h("div.toolbar", h("h1.grow", "Repositories"), isAdmin() ? h("a#add-repository.button", { href: "/repositories/new" }, "Add a repository") : null), body);
  const rows = new Map(); // id -> update(sync, lastSyncedAt)
  const load = () => fill(body, scope, async () => {
    const { nodes } = (await gql(LIST)).repositories;
    rows.clear();
    return nodes.length
      ? table(["Name", "Driver", "Status", "Seen / stored", "Invalid", "Last synced"], nodes.map(row), { id: "repositories" })
      : isAdmin() ? empty("No repositories yet.", link("/repositories/new", "Add one"), "to mirror elements from an http server, a directory on the server or a provider.") : empty("No repositories yet.");
  });

  function row(repo) {
    const [state, progress, bad, synced] = ["status", "progress", "invalid", "synced"].map((field) => h("td", { dataset: { field } }));
    const update = (s, lastSyncedAt) => {
      replace(state, status(s.status, s.message));
      if (s.seen != null) replace(progress, `${s.seen} / ${s.stored}`);
      if (s.invalid != null) replace(bad, String(s.invalid));
      if (lastSyncedAt !== undefined) replace(synced, time(lastSyncedAt));
    };
    update(syncOf(repo), repo.lastSyncedAt);
    rows.set(repo.id, update);
    return h("tr", { dataset: { id: repo.id } }, h("td", link(`/repositories/${repo.id}`, repo.name)), h("td", driverText(repo.driver)), state, progress, bad, synced);
  }

  await liveList(scope, SYNCS, load, (e) => {
    if (e.__typename !== "RepositorySync") return;
    const update = rows.get(e.repositoryId);
    if (!update) return false; // a repository added since
    update(e);
    // The event has no time: the row's last sync is read once it ended.
    // A reply read after a newer sync began (replies may cross) is left to that sync's events.
    if (e.status !== "SYNCING") gql(ONE, { id: e.repositoryId }).then(({ repository: r }) => scope.alive && r.status === e.status && update(syncOf(r), r.lastSyncedAt), () => {});
  });
}

const PROVIDERS = `query RepositoryProviders { providers(first: 500) { nodes { id name status features metadata { features } } } }`;
const WHERE = { http: "url", local: "path", provider: "providerId" };

// The driver is sent only if edited (the URL shown hides credentials).
function repositoryForm(id, repo, label, save) {
  const [kind, where] = repo ? describe(repo.driver) : ["http", ""];
  const options = (pairs, now) => pairs.map(([v, t]) => h("option", { value: v, selected: v === now }, t));
  const name = h("input", { name: "name", required: true, autocomplete: "off", value: repo?.name ?? "" });
  const driver = h("select", { name: "driver" },
    options([["http", "http: a static file server (nginx layout)"], ["local", "local: a directory on the server"], ["provider", "provider: one with the repository feature"]], kind));
  const url = h("input", { name: "url", type: "url", placeholder: "https://elements.example.com/repo", value: kind === "http" ? where : "" });
  const path = h("input", { name: "path", placeholder: "/srv/elements", value: kind === "local" ? where : "" });
  const provider = h("select", { name: "providerId" }, h("option", { value: "" }, "Loading providers…"));
  const noProvider = h("div");
  const mode = h("select", { name: "syncMode" }, options([["LAZY", "LAZY: a manifest is fetched when first needed"], ["COPY", "COPY: every manifest at sync time"]], repo?.syncMode ?? "LAZY"));
  const priority = h("input", { name: "priority", type: "number", step: 1, value: repo?.priority ?? 0 });
  const interval = h("input", { name: "refreshIntervalSeconds", type: "number", min: 0, step: 1, value: repo?.refreshIntervalSeconds ?? 3600 });
  const parts = {
    http: field("URL", url, "Where inventory.json is; credentials in it are not shown again."),
    local: field("Path", path, "Absolute path of a directory of YAML manifests."),
    provider: h("div", field("Provider", provider), noProvider),
  };
  const show = () => Object.entries(parts).forEach(([k, el]) => (el.hidden = k !== driver.value));
  driver.addEventListener("change", show);
  show();
  gql(PROVIDERS)
    .then(({ providers }) => {
      const able = providers.nodes.filter((p) => [...p.features, ...(p.metadata?.features ?? [])].includes("repository"));
      replace(provider, h("option", { value: "" }, able.length ? "Choose a provider" : "No provider has the repository feature"),
        able.map((p) => h("option", { value: p.id, selected: p.id === where }, `${p.name} (${p.status})`)));
      if (!able.length) replace(noProvider, empty("None offers repositories:", link("/providers/new", "add a provider"), "whose corbel-provider.yaml lists the repository feature."));
    })
    .catch((error) => replace(noProvider, errorBox(error)));

  const driverValue = () => {
    const v = driver.value;
    if (v === "provider" && !provider.value) throw invalid("Choose a provider with the repository feature.");
    const value = { http: url.value.trim(), local: path.value.trim(), provider: provider.value }[v];
    return kind === v && value === where ? null : { [v]: { [WHERE[v]]: value } };
  };
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, label);
  const onsubmit = sending(submit, slot, () => {
    const input = { name: name.value.trim(), syncMode: mode.value, priority: Number(priority.value), refreshIntervalSeconds: Number(interval.value) };
    const d = kind === "migration" ? null : driverValue();
    if (d) input.driver = d;
    return save(input);
  });
  return h("form.form", { id, onsubmit },
    field("Name", name),
    // A migration repository keeps its driver.
    kind === "migration" ? null : h("fieldset", h("legend", "Driver"), field("Kind", driver), Object.values(parts)),
    field("Sync mode", mode),
    field("Priority", priority, "Higher wins when several repositories offer a name."),
    field("Refresh interval (seconds)", interval),
    slot,
    h("div.toolbar", submit, repo ? null : link("/repositories", "Cancel")));
}

export function create(view) {
  const form = repositoryForm("repository-form", null, "Create repository", async (input) => {
    const { createRepository } = await gql(`mutation CreateRepository($i: CreateRepositoryInput!) { createRepository(input: $i) { id } }`, { i: input });
    navigate(`/repositories/${createRepository.id}`);
  });
  form.classList.add("card");
  view.append(h("h1", "Add a repository"), form);
  form.querySelector("input").focus();
}

const REFRESH = `mutation Refresh($id: ID!, $refetch: Boolean!) { refreshRepository(id: $id, refetchManifests: $refetch) { ${FULL} } }`;
const UPDATE = `mutation UpdateRepository($id: ID!, $i: UpdateRepositoryInput!) { updateRepository(id: $id, input: $i) { ${FULL} } }`;
const INVALID = `query Invalid($id: ID!) { repository(id: $id) {
  invalidElements(first: 200) { totalCount nodes { name version path message elementId } } } }`;
const ELEMENTS = `query RepoElements($id: ID!, $search: String) { repository(id: $id) {
  elements(first: 200, search: $search) { totalCount nodes { id name version installed } } } }`;
const EVENTS = `subscription RepositorySync($id: ID!) { repositoryEvents(id: $id) { status message seen stored invalid } }`;

export async function detail(view, { id }, scope) {
  const heading = h("h1", "Repository");
  const factsBox = h("div");
  const state = h("div#sync-status.toolbar");
  const progress = h("ul#sync-progress.sync-counts");
  const bar = h("span", { style: "width: 0%" });
  const refreshSlot = errorSlot();
  const refetch = h("input#refetch", { type: "checkbox" });
  const refresh = h("button#refresh", { type: "button" }, "Refresh");
  const invalidTitle = h("h2", "Invalid elements");
  const invalidBox = h("div");
  const settings = h("details#settings.card", h("summary", "Edit settings"));
  // Changes are the server admins'.
  const admin = isAdmin();
  const sync = h("section#sync.card", h("h2", "Sync"), state, progress,
    h("div.bar", { title: "stored and invalid, of seen" }, bar),
    admin && [h("div.toolbar", refresh, h("label.check", refetch, "Refetch every manifest")),
      h("small.hint", "Reads every manifest again, for sources that change one but not the inventory.")],
    refreshSlot);

  let heard = 0;
  let last = null;
  let current = null; // as last read

  function showSync(e) {
    replace(state, status(e.status, e.message));
    if (e.seen != null) {
      const item = (key, n) => h("li", { dataset: { field: key } }, h("strong", String(n)), ` ${key}`);
      replace(progress, item("seen", e.seen), item("stored", e.stored), item("invalid", e.invalid));
      const done = e.seen ? (100 * (e.stored + e.invalid)) / e.seen : e.status === "ACTIVE" ? 100 : 0;
      bar.style.width = `${Math.min(100, Math.round(done))}%`;
    }
    sync.dataset.state = e.status;
  }

  function draw(repo) {
    current = repo;
    replace(heading, repo.name);
    document.title = `${repo.name} · Corbel`;
    showSync(syncOf(repo));
    replace(factsBox, facts([
      ["Driver", driverText(repo.driver)],
      ["Sync mode", repo.syncMode],
      ["Priority", String(repo.priority)],
      ["Refresh interval", `${repo.refreshIntervalSeconds} s`],
      ["Last synced", time(repo.lastSyncedAt), "last-synced"],
      ["Next refresh", time(repo.nextRefreshAt)],
      ["Created", time(repo.createdAt)],
    ], { id: "repository-facts" }));
  }

  refresh.addEventListener("click", () =>
    busy(refresh, refreshSlot, async () => {
      const before = heard;
      const r = (await gql(REFRESH, { id, refetch: refetch.checked })).refreshRepository;
      refetch.checked = false;
      // Events heard since the click are newer than this answer.
      if (scope.alive && heard === before) draw(r);
    }));

  settings.addEventListener("toggle", () => {
    settings.querySelector("form")?.remove();
    if (!settings.open || !current) return;
    const was = current;
    settings.append(repositoryForm("repository-settings", was, "Save settings", async (input) => {
      for (const key of ["name", "syncMode", "priority", "refreshIntervalSeconds"]) if (input[key] === was[key]) delete input[key];
      const repo = (await gql(UPDATE, { id, i: input })).updateRepository;
      if (!scope.alive) return;
      draw(repo);
      settings.open = false;
    }));
  });

  const loadInvalid = () => fill(invalidBox, scope, async () => {
    const { nodes, totalCount } = (await gql(INVALID, { id })).repository.invalidElements;
    const rows = nodes.map((n) =>
      h("tr", { dataset: { path: n.path } },
        h("td", code(n.path)),
        h("td", n.elementId ? link(`/elements/${n.elementId}`, `${n.name} ${n.version}`) : [n.name, n.version].filter(Boolean).join(" ")),
        h("td", n.message)));
    invalidTitle.textContent = `Invalid elements (${totalCount})`;
    return [
      rows.length ? table(["Path", "Element", "What is wrong"], rows) : h("p.muted", "None in the last sync."),
      totalCount > rows.length ? h("p.muted", `and ${totalCount - rows.length} more`) : null,
    ];
  });

  const search = h("input#repository-element-search", { type: "search", placeholder: "Part of a name", "aria-label": "Search this repository's elements" });
  const found = h("div");
  const loadElements = () => fill(found, scope, async () => {
    const term = search.value.trim();
    const { nodes, totalCount } = (await gql(ELEMENTS, { id, search: term || null })).repository.elements;
    const installed = (e) => (e.installed ? h("span.badge.state-active", "installed") : null);
    return [
      nodes.length
        ? chips(nodes.map((e) => [{ name: e.name, version: e.version, installed: String(e.installed) }, link(`/elements/${e.id}`, `${e.name} ${e.version}`), installed(e)]))
        : empty(term ? "No element's name here contains that." : "No elements stored yet: a sync stores them."),
      totalCount > nodes.length ? h("p.muted", `${nodes.length} of ${totalCount}: search to narrow.`) : null,
    ];
  });
  search.addEventListener("input", later(scope, 200, loadElements));

  const del = h("button#delete-repository.danger", { type: "button" }, "Delete repository…");
  const confirm = askFirst(del, {
    question: "Delete this repository and the elements it stored?",
    yes: h("button#confirm-delete.danger", "Delete it and its elements"),
    act: async () => {
      await gql(`mutation DeleteRepository($id: ID!) { deleteRepository(id: $id) }`, { id });
      navigate("/repositories");
    },
  });

  replace(view,
    heading,
    sync,
    h("section.card", h("h2", "Facts"), factsBox),
    h("section#invalid-elements", invalidTitle, invalidBox),
    h("section#repository-elements",
      h("div.toolbar", h("h2.grow", "Elements"), link(`/elements?repositoryId=${encodeURIComponent(id)}`, "Open in Elements")),
      h("form", { role: "search", onsubmit: (e) => (e.preventDefault(), loadElements()) }, search),
      found),
    admin && [settings, h("section#danger", del, confirm)],
  );

  async function settled() {
    try {
      const { repository } = await gql(ONE, { id });
      if (scope.alive) draw(repository);
    } catch (error) {
      if (scope.alive) refreshSlot.show(error);
    }
    if (scope.alive) await Promise.all([loadInvalid(), loadElements()]);
  }

  scope.subscribe(EVENTS, { id }, {
    next: ({ repositoryEvents: e }) => {
      heard++;
      last = e;
      showSync(e);
      if (e.status !== "SYNCING") settled();
    },
    error: (error) => refreshSlot.show(error),
  });
  let repo;
  try {
    ({ repository: repo } = await afterSubscribing(scope, ONE, { id }));
  } catch (error) {
    return failed(view, "Repository", error, "/repositories", "All repositories");
  }
  // An event heard before this answer may be newer than it: applied again.
  const early = last;
  draw(repo);
  if (early && early.status !== repo.status) {
    showSync(early);
    if (early.status !== "SYNCING") return settled();
  }
  await Promise.all([loadInvalid(), loadElements()]);
}
