// The overview: counts and what needs attention (down or degraded resources
// among them), read again when a provider, repository, deployment or a
// deployment's health changes (never polled).

import { gql } from "../api.js";
import { isAdmin } from "../app.js";
import { empty, fill, h, link, liveList, status, table } from "../dom.js";

const QUERY = `query Overview {
  providers(first: 100) { totalCount nodes { id name status statusMessage } }
  repositories(first: 100) { totalCount nodes { id name status statusMessage } }
  installed: elements(filter: { installed: true }, first: 0) { totalCount }
  blueprints(first: 0) { totalCount }
  deployments(first: 0) { totalCount }
  troubled: deployments(filter: { states: [FAILED, IN_PROGRESS, DESTROYING, PENDING] }, first: 50) {
    totalCount nodes { id name state error }
  }
  sick: deployments(health: [DOWN, DEGRADED], first: 50) {
    nodes { id name nodes { key replica health healthReason } }
  }
}`;

const EVENTS = `subscription { serverEvents {
  __typename
  ... on ProviderStatusChanged { providerId }
  ... on RepositorySync { repositoryId status }
  ... on DeploymentChanged { deploymentId }
  ... on DeploymentHealthChanged { deploymentId }
} }`;

const REREAD = new Set(["ProviderStatusChanged", "RepositorySync", "DeploymentChanged", "DeploymentHealthChanged"]);
const SICK = /DOWN|DEGRADED/;

export async function render(view, _params, scope) {
  const body = h("div#overview");
  view.append(h("h1", "Overview"), body);
  const load = () => fill(body, scope, async () => draw(await gql(QUERY)));
  await liveList(scope, EVENTS, load, (e) => (REREAD.has(e.__typename) ? false : undefined));
}

function draw(data) {
  const counts = [
    ["/providers", "Providers", data.providers.totalCount],
    ["/repositories", "Repositories", data.repositories.totalCount],
    ["/elements?installed=true", "Installed elements", data.installed.totalCount],
    ["/blueprints", "Blueprints", data.blueprints.totalCount],
    ["/deployments", "Deployments", data.deployments.totalCount],
  ];
  const row = (href, kind, name, state, message) => h("tr", h("td", kind), h("td", link(href, name)), h("td", status(state, message)));
  const attention = [
    ...data.providers.nodes
      .filter((p) => p.status === "FAILED" || p.status === "DISCONNECTED")
      .map((p) => row(`/providers/${p.id}`, "Provider", p.name, p.status, p.statusMessage)),
    ...data.repositories.nodes.filter((r) => r.status === "ERROR").map((r) => row(`/repositories/${r.id}`, "Repository", r.name, r.status, r.statusMessage)),
    ...data.troubled.nodes.map((d) => row(`/deployments/${d.id}`, "Deployment", d.name, d.state, d.error)),
    ...data.sick.nodes.flatMap((d) => d.nodes.filter((n) => SICK.test(n.health))
      .map((n) => row(`/deployments/${d.id}`, "Resource", `${d.name} · ${n.key}[${n.replica}]`, n.health, n.healthReason))),
  ];
  return [
    h("ul.counts", { "aria-label": "Counts" },
      counts.map(([href, label, n]) => h("li", h("a", { href, dataset: { count: label } }, h("strong", String(n)), h("span", label))))),
    h("h2", "Needs attention"),
    attention.length
      ? table(["Kind", "Name", "State"], attention, { id: "attention" })
      : empty("Nothing needs attention: every provider is connected, every repository synced, and no deployment failed, is running or is down."),
    data.providers.totalCount || !isAdmin() ? null : empty("No providers yet.", link("/providers/new", "Add a provider"), "to deploy resources."),
  ];
}
