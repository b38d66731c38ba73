// Repositories: the list (rows updated in place from `serverEvents`), the
// form that adds one, and one repository's page: its sync live from
// `repositoryEvents`, refresh, invalid elements, its elements, settings, delete.

import { ApiError, gql } from "../api.js";
import { navigate } from "../app.js";
import { badge, busy, empty, errorBox, errorSlot, field, h, replace, time } from "../dom.js";

export const styles = "/ui/css/repositories.css";

const ROW = `id name status statusMessage invalidElementCount progress { seen stored } lastSyncedAt
  driver { __typename ... on HttpDriver { url } ... on LocalDriver { path } ... on ProviderDriver { providerId } }`;
const FULL = `${ROW} syncMode priority refreshIntervalSeconds nextRefreshAt createdAt`;
const ONE = `query Repository($id: ID!) { repository(id: $id) { ${FULL} } }`;

export async function render(view, params, scope) {
  if (params.view === "create") return create(view);
  if (params.view === "detail") return detail(view, params.id, scope);
  return list(view, scope);
}

/**
 * A query answered over the page's socket after the subscriptions opened
 * before it: the server starts them in the order it got them, so no event
 * falls between what the query read and the first event heard (over HTTP
 * the query could be answered before the subscription exists).
 */
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

/** `[kind, where]` of a driver. */
function describe(d) {
  const kind = { HttpDriver: "http", LocalDriver: "local", ProviderDriver: "provider" }[d?.__typename] ?? "migration";
  return [kind, d?.url ?? d?.path ?? d?.providerId ?? ""];
}

function driverText(driver) {
  const [kind, where] = describe(driver);
  return h("span", { class: "repo-driver" }, h("span", { class: "badge kind" }, kind), " ", h("code", {}, where));
}

/** What a sync event says, from a repository read. */
const syncOf = (r) => ({ status: r.status, message: r.statusMessage, seen: r.progress.seen, stored: r.progress.stored, invalid: r.invalidElementCount });

// The list ----------------------------------------------------------------

async function list(view, scope) {
  const body = h("div", { id: "repositories-body" });
  view.append(
    h("div", { class: "toolbar" }, h("h1", { class: "grow" }, "Repositories"), h("a", { class: "button", href: "/repositories/new", id: "add-repository" }, "Add a repository")),
    body,
  );
  const rows = new Map();
  const QUERY = `query Repositories { repositories(first: 500) { nodes { ${ROW} } } }`;

  async function load(viaSocket) {
    try {
      const { repositories } = viaSocket ? await afterSubscribing(scope, QUERY, {}) : await gql(QUERY);
      if (scope.alive) draw(repositories.nodes);
    } catch (error) {
      if (scope.alive) replace(body, errorBox(error));
    }
  }

  function draw(nodes) {
    rows.clear();
    if (!nodes.length) {
      replace(body, empty("No repositories yet.", h("a", { href: "/repositories/new" }, "Add one"), " to mirror elements from an http server, a directory on the server or a provider."));
      return;
    }
    for (const repo of nodes) rows.set(repo.id, row(repo));
    replace(
      body,
      h(
        "table",
        { class: "list", id: "repositories" },
        h("thead", {}, h("tr", {}, ["Name", "Driver", "Status", "Seen / stored", "Invalid", "Last synced"].map((t) => h("th", {}, t)))),
        h("tbody", {}, [...rows.values()].map((r) => r.tr)),
      ),
    );
  }

  function row(repo) {
    const cells = ["status", "progress", "invalid", "synced"].map((field) => h("td", { dataset: { field } }));
    const [status, progress, invalid, synced] = cells;
    const tr = h("tr", { dataset: { id: repo.id } }, h("td", {}, h("a", { href: `/repositories/${repo.id}` }, repo.name)), h("td", {}, driverText(repo.driver)), cells);
    const update = (s, lastSyncedAt) => {
      replace(status, badge(s.status), s.message ? h("small", { class: "hint" }, s.message) : null);
      if (s.seen != null) replace(progress, `${s.seen} / ${s.stored}`);
      if (s.invalid != null) replace(invalid, String(s.invalid));
      if (lastSyncedAt !== undefined) replace(synced, time(lastSyncedAt));
    };
    update(syncOf(repo), repo.lastSyncedAt);
    return { tr, update };
  }

  let reload = null;
  scope.subscribe(`subscription RepositoryRows { serverEvents { __typename ... on RepositorySync { repositoryId status message seen stored invalid } } }`, {}, {
    next: async ({ serverEvents: e }) => {
      const r = rows.get(e.repositoryId);
      if (e.__typename === "EventsMissed" || (e.__typename === "RepositorySync" && !r)) {
        clearTimeout(reload);
        reload = setTimeout(load, 100);
      }
      if (!r) return;
      r.update(e);
      if (e.status === "SYNCING") return;
      // The event has no time: the row's last sync is read once it ended.
      try {
        const { repository } = await gql(ONE, { id: e.repositoryId });
        if (scope.alive) r.update(syncOf(repository), repository.lastSyncedAt);
      } catch {
        // The row keeps what the event said.
      }
    },
  });
  scope.onDispose(() => clearTimeout(reload));
  await load(true);
}

// The form, for adding one and for its settings ----------------------------

const PROVIDERS = `query RepositoryProviders { providers(first: 500) { nodes { id name status features metadata { features } } } }`;

/**
 * `save(input)` gets the fields as `CreateRepositoryInput`, the driver only
 * when it was edited (the URL shown hides credentials, so it is not sent back).
 */
function repositoryForm(id, repo, label, save) {
  const [kind, where] = repo ? describe(repo.driver) : ["http", ""];
  const options = (pairs, now) => pairs.map(([v, t]) => h("option", { value: v, selected: v === now }, t));
  const name = h("input", { name: "name", required: true, autocomplete: "off", value: repo?.name ?? "" });
  const driver = h("select", { name: "driver" }, options([["http", "http: a static file server (nginx layout)"], ["local", "local: a directory on the server"], ["provider", "provider: one with the repository feature"]], kind));
  const url = h("input", { name: "url", type: "url", placeholder: "https://elements.example.com/repo", value: kind === "http" ? where : "" });
  const path = h("input", { name: "path", placeholder: "/srv/elements", value: kind === "local" ? where : "" });
  const provider = h("select", { name: "providerId" }, h("option", { value: "" }, "Loading providers…"));
  const note = h("div", {});
  const mode = h("select", { name: "syncMode" }, options([["LAZY", "LAZY: a manifest is fetched when first needed"], ["COPY", "COPY: every manifest at sync time"]], repo?.syncMode ?? "LAZY"));
  const priority = h("input", { name: "priority", type: "number", step: 1, value: repo?.priority ?? 0 });
  const interval = h("input", { name: "refreshIntervalSeconds", type: "number", min: 0, step: 1, value: repo?.refreshIntervalSeconds ?? 3600 });
  const parts = {
    http: field("URL", url, "Where inventory.json is; credentials in it are never shown again."),
    local: field("Path", path, "Absolute path of a directory of YAML manifests on the server."),
    provider: h("div", {}, field("Provider", provider), note),
  };
  const show = () => Object.entries(parts).forEach(([k, el]) => (el.hidden = k !== driver.value));
  driver.addEventListener("change", show);
  show();
  gql(PROVIDERS)
    .then(({ providers }) => {
      const able = providers.nodes.filter((p) => [...p.features, ...(p.metadata?.features ?? [])].includes("repository"));
      replace(provider, h("option", { value: "" }, able.length ? "Choose a provider" : "No provider has the repository feature"), able.map((p) => h("option", { value: p.id, selected: p.id === where }, `${p.name} (${p.status})`)));
      if (!able.length) replace(note, empty("None offers repositories:", h("a", { href: "/providers/new" }, "add a provider"), " whose corbel-provider.yaml lists the repository feature."));
    })
    .catch((error) => replace(note, errorBox(error)));

  const driverValue = () => {
    const v = driver.value;
    if (v === "http") return url.value.trim() === where && kind === v ? null : { http: { url: url.value.trim() } };
    if (v === "local") return path.value.trim() === where && kind === v ? null : { local: { path: path.value.trim() } };
    if (!provider.value) throw Object.assign(new Error("Choose a provider with the repository feature."), { code: "VALIDATION" });
    return provider.value === where && kind === v ? null : { provider: { providerId: provider.value } };
  };
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, label);
  return h(
    "form",
    {
      id,
      onsubmit: (event) => {
        event.preventDefault();
        busy(submit, slot, () => {
          const input = { name: name.value.trim(), syncMode: mode.value, priority: Number(priority.value), refreshIntervalSeconds: Number(interval.value) };
          const d = kind === "migration" ? null : driverValue();
          if (d) input.driver = d;
          return save(input);
        });
      },
    },
    field("Name", name),
    // A migration repository keeps its driver.
    kind === "migration" ? null : h("fieldset", { class: "driver-fields" }, h("legend", {}, "Driver"), field("Kind", driver), Object.values(parts)),
    field("Sync mode", mode),
    field("Priority", priority, "Higher wins when several repositories offer a name."),
    field("Refresh interval (seconds)", interval),
    slot,
    h("div", { class: "toolbar" }, submit, repo ? null : h("a", { href: "/repositories" }, "Cancel")),
  );
}

function create(view) {
  const form = repositoryForm("repository-form", null, "Create repository", async (input) => {
    const { createRepository } = await gql(`mutation CreateRepository($i: CreateRepositoryInput!) { createRepository(input: $i) { id } }`, { i: input });
    navigate(`/repositories/${createRepository.id}`);
  });
  form.classList.add("card");
  view.append(h("h1", {}, "Add a repository"), form);
  form.querySelector("input").focus();
}

// One repository -----------------------------------------------------------

async function detail(view, id, scope) {
  const heading = h("h1", {}, "Repository");
  const facts = h("dl", { class: "facts", id: "repository-facts" });
  const status = h("div", { class: "toolbar", id: "sync-status" });
  const progress = h("ul", { class: "sync-counts", id: "sync-progress" });
  const bar = h("span", { style: "width: 0%" });
  const refreshSlot = errorSlot();
  const refetch = h("input", { type: "checkbox", id: "refetch" });
  const refresh = h("button", { type: "button", id: "refresh" }, "Refresh");
  const invalid = h("section", { id: "invalid-elements" });
  const settings = h("details", { id: "settings", class: "card" }, h("summary", {}, "Edit settings"));
  const sync = h(
    "section",
    { class: "card", id: "sync" },
    h("h2", {}, "Sync"),
    status,
    progress,
    h("div", { class: "bar", title: "stored and invalid, of seen" }, bar),
    h("div", { class: "toolbar" }, refresh, h("label", { class: "refetch-option" }, refetch, " Refetch every manifest")),
    h("small", { class: "hint" }, "Refetch reads every manifest again, for sources that edit manifests without changing their inventory entry."),
    refreshSlot,
  );

  let heard = 0; // events heard so far
  let last = null; // the last of them
  let current = null; // the repository as last read

  function showSync(e) {
    replace(status, badge(e.status), e.message ? h("span", { class: "muted", id: "sync-message" }, e.message) : null);
    if (e.seen != null) {
      const item = (key, n) => h("li", { dataset: { field: key } }, h("strong", {}, String(n)), ` ${key}`);
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
    const fact = (term, value, key) => [h("dt", {}, term), h("dd", { dataset: { field: key } }, value)];
    replace(
      facts,
      fact("Driver", driverText(repo.driver)),
      fact("Sync mode", repo.syncMode),
      fact("Priority", String(repo.priority)),
      fact("Refresh interval", `${repo.refreshIntervalSeconds} s`),
      fact("Last synced", time(repo.lastSyncedAt), "last-synced"),
      fact("Next refresh", time(repo.nextRefreshAt)),
      fact("Created", time(repo.createdAt)),
    );
  }

  refresh.addEventListener("click", () =>
    busy(refresh, refreshSlot, async () => {
      const before = heard;
      const { refreshRepository: r } = await gql(
        `mutation Refresh($id: ID!, $refetch: Boolean!) { refreshRepository(id: $id, refetchManifests: $refetch) { ${FULL} } }`,
        { id, refetch: refetch.checked },
      );
      refetch.checked = false;
      // Events heard since the click are newer than this answer.
      if (scope.alive && heard === before) draw(r);
    }),
  );

  // The settings form is made from the repository as it is when opened.
  settings.addEventListener("toggle", () => {
    settings.querySelector("form")?.remove();
    if (!settings.open || !current) return;
    const was = current;
    settings.append(
      repositoryForm("repository-settings", was, "Save settings", async (input) => {
        for (const key of ["name", "syncMode", "priority", "refreshIntervalSeconds"]) if (input[key] === was[key]) delete input[key];
        const { updateRepository } = await gql(`mutation UpdateRepository($id: ID!, $i: UpdateRepositoryInput!) { updateRepository(id: $id, input: $i) { ${FULL} } }`, { id, i: input });
        if (!scope.alive) return;
        draw(updateRepository);
        settings.open = false;
      }),
    );
  });

  async function loadInvalid() {
    try {
      const { repository: r } = await gql(`query Invalid($id: ID!) { repository(id: $id) { invalidElements(first: 200) { totalCount nodes { name version path message elementId } } } }`, { id });
      const { nodes, totalCount } = r.invalidElements;
      const rows = nodes.map((n) =>
        h(
          "tr",
          { dataset: { path: n.path } },
          h("td", {}, h("code", {}, n.path)),
          h("td", {}, n.elementId ? h("a", { href: `/elements/${n.elementId}` }, `${n.name} ${n.version}`) : [n.name, n.version].filter(Boolean).join(" ")),
          h("td", {}, n.message),
        ),
      );
      replace(
        invalid,
        h("h2", {}, `Invalid elements (${totalCount})`),
        rows.length
          ? h("table", { class: "list" }, h("thead", {}, h("tr", {}, h("th", {}, "Path"), h("th", {}, "Element"), h("th", {}, "What is wrong"))), h("tbody", {}, rows))
          : h("p", { class: "muted" }, "Every entry of the last sync was a valid element."),
        totalCount > rows.length ? h("p", { class: "muted" }, `and ${totalCount - rows.length} more`) : null,
      );
    } catch (error) {
      replace(invalid, h("h2", {}, "Invalid elements"), errorBox(error));
    }
  }

  const search = h("input", { type: "search", id: "repository-element-search", placeholder: "Part of a name", "aria-label": "Search this repository's elements" });
  const found = h("div", {});
  let searches = 0;
  async function loadElements() {
    const mine = ++searches;
    const term = search.value.trim();
    try {
      const { repository: r } = await gql(
        `query RepoElements($id: ID!, $search: String) { repository(id: $id) { elements(first: 200, search: $search) { totalCount nodes { id name version installed } } } }`,
        { id, search: term || null },
      );
      if (mine !== searches || !scope.alive) return;
      const { nodes, totalCount } = r.elements;
      replace(
        found,
        nodes.length
          ? h(
              "ul",
              { class: "element-chips" },
              nodes.map((e) =>
                h(
                  "li",
                  { dataset: { name: e.name, version: e.version, installed: String(e.installed) } },
                  h("a", { href: `/elements/${e.id}` }, `${e.name} ${e.version}`),
                  e.installed ? h("span", { class: "badge state-active" }, "installed") : null,
                ),
              ),
            )
          : empty(term ? "No element's name here contains that." : "No elements stored yet: a sync stores them."),
        totalCount > nodes.length ? h("p", { class: "muted" }, `${nodes.length} of ${totalCount}: search to narrow.`) : null,
      );
    } catch (error) {
      replace(found, errorBox(error));
    }
  }
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(loadElements, 200);
  });
  scope.onDispose(() => clearTimeout(typing));

  const deleteSlot = errorSlot();
  const confirm = h("button", { type: "button", class: "danger", id: "confirm-delete", hidden: true }, "Delete it and its elements");
  confirm.addEventListener("click", async () => {
    if (await busy(confirm, deleteSlot, () => gql(`mutation DeleteRepository($id: ID!) { deleteRepository(id: $id) }`, { id }))) navigate("/repositories");
  });
  const del = h("button", { type: "button", class: "danger", id: "delete-repository" }, "Delete repository…");
  del.addEventListener("click", () => {
    confirm.hidden = !confirm.hidden;
    del.textContent = confirm.hidden ? "Delete repository…" : "Keep it";
    del.className = confirm.hidden ? "danger" : "secondary";
    deleteSlot.clear();
  });

  view.append(
    heading,
    sync,
    h("section", { class: "card" }, h("h2", {}, "Facts"), facts),
    invalid,
    h(
      "section",
      { id: "repository-elements" },
      h("div", { class: "toolbar" }, h("h2", { class: "grow" }, "Elements"), h("a", { href: `/elements?repositoryId=${encodeURIComponent(id)}` }, "Open in Elements")),
      h("form", { role: "search", onsubmit: (e) => (e.preventDefault(), loadElements()) }, search),
      found,
    ),
    settings,
    h("section", { id: "danger" }, h("div", { class: "toolbar" }, del, confirm), deleteSlot),
  );

  // After a sync ends: what it changed.
  async function settled() {
    try {
      const { repository } = await gql(ONE, { id });
      if (scope.alive) draw(repository);
    } catch (error) {
      if (scope.alive) refreshSlot.show(error);
    }
    if (scope.alive) await Promise.all([loadInvalid(), loadElements()]);
  }

  scope.subscribe(`subscription RepositorySync($id: ID!) { repositoryEvents(id: $id) { status message seen stored invalid } }`, { id }, {
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
    replace(view, h("h1", {}, "Repository"), errorBox(error), h("p", {}, h("a", { href: "/repositories" }, "All repositories")));
    return;
  }
  // An event heard before this answer may be newer than what it read; a
  // sync's end heard then is applied again (this answer drew over it).
  const early = last;
  draw(repo);
  if (early && early.status !== repo.status) {
    showSync(early);
    if (early.status !== "SYNCING") return settled();
  }
  await Promise.all([loadInvalid(), loadElements()]);
}
