// The overview: how much there is, and what needs attention, each a link.
// Refreshed when a provider or repository changes (serverEvents), never polled.

import { gql } from "../api.js";
import { badge, empty, errorBox, h, replace } from "../dom.js";

const QUERY = `query Overview {
  providers(first: 100) { totalCount nodes { id name status statusMessage } }
  repositories(first: 100) { totalCount nodes { id name status statusMessage } }
  installed: elements(filter: { installed: true }, first: 0) { totalCount }
  blueprints(first: 0) { totalCount }
  deployments(first: 0) { totalCount }
  troubled: deployments(filter: { states: [FAILED, IN_PROGRESS, DESTROYING, PENDING] }, first: 50) {
    totalCount nodes { id name state error }
  }
}`;

const EVENTS = `subscription { serverEvents {
  __typename
  ... on ProviderStatusChanged { providerId }
  ... on RepositorySync { repositoryId status }
} }`;

export async function render(view, _params, scope) {
  const body = h("div", { id: "overview" });
  view.append(h("h1", {}, "Overview"), body);

  async function load() {
    try {
      const data = await gql(QUERY);
      if (scope.alive) draw(body, data);
    } catch (error) {
      if (scope.alive) replace(body, errorBox(error));
    }
  }
  await load();

  let pending = null;
  scope.subscribe(EVENTS, {}, {
    next: (data) => {
      const kind = data.serverEvents.__typename;
      if (kind !== "ProviderStatusChanged" && kind !== "RepositorySync") return;
      clearTimeout(pending);
      pending = setTimeout(load, 150);
    },
  });
  scope.onDispose(() => clearTimeout(pending));
}

function draw(body, data) {
  const counts = [
    ["/providers", "Providers", data.providers.totalCount],
    ["/repositories", "Repositories", data.repositories.totalCount],
    ["/elements?installed=true", "Installed elements", data.installed.totalCount],
    ["/blueprints", "Blueprints", data.blueprints.totalCount],
    ["/deployments", "Deployments", data.deployments.totalCount],
  ];
  const attention = [
    ...data.providers.nodes
      .filter((p) => p.status === "FAILED" || p.status === "DISCONNECTED")
      .map((p) => row(`/providers/${p.id}`, "Provider", p.name, p.status, p.statusMessage)),
    ...data.repositories.nodes
      .filter((r) => r.status === "ERROR")
      .map((r) => row(`/repositories/${r.id}`, "Repository", r.name, r.status, r.statusMessage)),
    ...data.troubled.nodes.map((d) => row(`/deployments/${d.id}`, "Deployment", d.name, d.state, d.error)),
  ];
  replace(
    body,
    h(
      "ul",
      { class: "counts", "aria-label": "Counts" },
      counts.map(([href, label, n]) =>
        h("li", {}, h("a", { href, dataset: { count: label } }, h("strong", {}, String(n)), h("span", {}, label))),
      ),
    ),
    h("h2", {}, "Needs attention"),
    attention.length
      ? h("table", { class: "list", id: "attention" }, h("tbody", {}, attention))
      : empty("Nothing needs attention: every provider is connected, every repository synced, and no deployment failed or is running."),
    data.providers.totalCount === 0
      ? empty("No providers yet.", h("a", { href: "/providers/new" }, "Add a provider"), " to deploy resources.")
      : null,
  );
}

function row(href, kind, name, state, message) {
  return h(
    "tr",
    {},
    h("td", {}, kind),
    h("td", {}, h("a", { href }, name)),
    h("td", {}, badge(state)),
    h("td", { class: "muted" }, message ?? ""),
  );
}
