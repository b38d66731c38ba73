// The overview: counts and what needs attention (down or degraded resources
// among them), then pictures: the changes of the last 24 hours, resources by
// health, each provider's nodes used of total, the busiest projects against
// their limits. Read again when a provider, repository, deployment or a
// deployment's health changes (never polled); the pictures at most every few
// seconds while changes keep coming.

import { gql } from "../api.js";
import { isAdmin } from "../app.js";
import { bars, empty, fill, h, link, liveList, nodeUsage, note, status, svg, table, usedOf } from "../dom.js";

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
  const glance = h("div#glance.glance");
  view.append(h("h1", "Overview"), body, glance);
  const pictures = throttled(scope, PICTURES_EVERY, () => fill(glance, scope, drawPictures));
  const load = () => Promise.all([fill(body, scope, async () => draw(await gql(QUERY))), pictures()]);
  await liveList(scope, EVENTS, load, (e) => (REREAD.has(e.__typename) ? false : undefined));
}

// The pictures read the last day's history: not more often than this.
const PICTURES_EVERY = 3000;

/** `fn` now if it has not run for `ms`, else once when `ms` have passed; not once the page was left. */
function throttled(scope, ms, fn) {
  let last = 0;
  let timer = null;
  scope.onDispose(() => clearTimeout(timer));
  return () => {
    const wait = last + ms - Date.now();
    if (wait <= 0) {
      last = Date.now();
      return fn();
    }
    timer ??= setTimeout(() => {
      timer = null;
      last = Date.now();
      if (scope.alive) fn();
    }, wait);
  };
}

const PICTURES = `query Pictures {
  changesByHour(hours: 24) { from deployments resources }
  resourcesByHealth { health count }
  providers(first: 100) { nodes { id name status } }
  projects { id name maxResources quotas usage { resources quantities } }
}`;
const NODES = `query Nodes($id: ID!) { provider(id: $id) { nodes { name capacity used } } }`;
const HEALTHS = ["HEALTHY", "DEGRADED", "DOWN", "UNKNOWN"];

async function drawPictures() {
  const data = await gql(PICTURES);
  // A provider that does not answer is left out; the attention list says why.
  const connected = data.providers.nodes.filter((p) => p.status === "CONNECTED");
  const nodes = await Promise.all(connected.map((p) => gql(NODES, { id: p.id }).then((d) => d.provider.nodes, () => null)));
  const byHealth = new Map(data.resourcesByHealth.map((c) => [c.health, c.count]));
  const card = (id, title, ...children) => h("section.card", { id }, h("h2", title), ...children);
  return [
    card("changes", "Changes, last 24 hours", changesChart(data.changesByHour)),
    card("health", "Resources by health", [...byHealth.values()].some(Boolean)
      ? bars(HEALTHS.map((health) => [health, byHealth.get(health) ?? 0, { health }]))
      : empty("No resource is deployed.")),
    card("nodes", "Provider nodes, used of total", connected.length ? connected.map((p, i) => h("div.node", { dataset: { provider: p.name } },
      h("h3", link(`/providers/${p.id}`, p.name)),
      nodes[i] ? nodes[i].map((n) => [h("p.node-name", n.name),
        nodeUsage(n)])
        : note("Did not answer."))) : empty("No provider is connected.")),
    card("busiest", "Busiest projects", busiest(data.projects)),
  ];
}

/** Each project's use of its limits (resources, then each quota), fullest first: the five fullest with any limit. */
function busiest(projects) {
  const rows = projects.map((p) => {
    const limits = [["resources", p.usage.resources, p.maxResources],
      ...Object.entries(p.quotas ?? {}).map(([key, limit]) => [key, Number(p.usage.quantities?.[key] ?? 0), limit])].filter(([, , limit]) => limit !== null);
    return { p, limits, full: Math.max(0, ...limits.map(([, used, limit]) => used / Math.max(1, limit))) };
  }).filter((r) => r.limits.length).sort((a, b) => b.full - a.full).slice(0, 5);
  if (!rows.length) return empty("No project has limits.");
  return rows.map(({ p, limits }) => h("div.project", { dataset: { project: p.name } }, h("h3", link(`/projects/${p.id}`, p.name)),
    usedOf(limits.map(([key, used, limit]) => [key, used, limit, { limit: key }]))));
}

/** Two bars an hour (deployments, resources changed) on one scale, the hour's figures on hover. */
function changesChart(hours) {
  const [width, height, below] = [480, 110, 16];
  const top = Math.max(1, ...hours.map((x) => Math.max(x.deployments, x.resources)));
  const step = width / hours.length;
  const bar = (step - 2) / 2;
  const y = (n) => height - ((height - 2) * n) / top;
  const clock = (iso) => new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const sum = (key) => hours.reduce((n, x) => n + x[key], 0);
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height + below}`, role: "img",
    "aria-label": `In the last 24 hours, hour by hour: at most ${top} changes in an hour; ${sum("deployments")} deployment-hours and ${sum("resources")} resource-hours with changes.` },
  svg("line", { x1: 0, x2: width, y1: height, y2: height, class: "axis" }),
  svg("text", { x: width, y: 10, "text-anchor": "end", class: "top" }, String(top)),
  hours.map((x, i) => svg("g", { "data-from": x.from, "data-deployments": x.deployments, "data-resources": x.resources },
    svg("title", {}, `${clock(x.from)}: ${x.deployments} deployment${x.deployments === 1 ? "" : "s"}, ${x.resources} resource${x.resources === 1 ? "" : "s"} changed`),
    svg("rect", { class: "deployments", x: i * step + 1, y: y(x.deployments), width: bar, height: height - y(x.deployments) }),
    svg("rect", { class: "resources", x: i * step + 1 + bar, y: y(x.resources), width: bar, height: height - y(x.resources) }),
    i % 6 === 0 || i === hours.length - 1 ? svg("text", { x: i * step + 1, y: height + 12 }, i === hours.length - 1 ? "now" : clock(x.from)) : null)));
  return [chart, h("p.legend", h("span.key.deployments"), " Deployments ", h("span.key.resources"), " Resources changed")];
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
