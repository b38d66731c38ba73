// The audit log: who did what, when, in which project, on what, how it ended.
// Filtered in the URL (back and reload keep them), paged by cursor, and live
// for server admins (`auditEvents`). A project's page shows its own log to
// its ADMINs through `auditLog` (`project.auditLog`).

import { gql } from "../api.js";
import { isAdmin, projectLink } from "../app.js";
import { busy, code, empty, errorBox, errorSlot, field, h, link, muted, note, replace, table, time } from "../dom.js";

const ENTRY = "id at userId username projectId action arguments outcome error durationMs address";
const PAGE = `totalCount pageInfo { hasNextPage endCursor } nodes { ${ENTRY} }`;
const ALL = `query Audit($filter: AuditFilter, $after: String) { auditLog(filter: $filter, first: 50, after: $after) { ${PAGE} } }`;
const OF_PROJECT = `query ProjectAudit($id: ID!, $filter: AuditFilter, $after: String) {
  project(id: $id) { auditLog(filter: $filter, first: 50, after: $after) { ${PAGE} } } }`;
const LIVE = `subscription AuditLive($filter: AuditFilter) { auditEvents(filter: $filter) { ${ENTRY} } }`;

// What an action touched: the first kind its name holds, and that kind's id
// among its arguments (`id`, `<kind>Id`, or the same in `input`).
const KINDS = [["Deployment", "deployments"], ["Blueprint", "blueprints"], ["Provider", "providers"], ["Repository", "repositories"],
  ["Element", "elements"], ["Project", "projects"], ["User", "users"], ["Resource", "deployments", "deploymentId"]];

/** `[path, label]` of what `entry` acted on, or null. */
export function target(entry) {
  const args = entry.arguments ?? {};
  const idOf = (key) => [args[key], args.input?.[key]].find((v) => typeof v === "string" && v);
  for (const [kind, section, key = `${kind[0].toLowerCase()}${kind.slice(1)}Id`] of KINDS) {
    if (!entry.action.includes(kind)) continue;
    const id = (kind !== "Resource" && idOf("id")) || idOf(key);
    if (id) return [`/${section}/${encodeURIComponent(id)}`, `${kind.toLowerCase()} ${id.slice(0, 8)}`];
  }
  for (const [kind, section] of KINDS.slice(0, 7)) {
    const id = idOf(`${kind[0].toLowerCase()}${kind.slice(1)}Id`);
    if (id) return [`/${section}/${encodeURIComponent(id)}`, `${kind.toLowerCase()} ${id.slice(0, 8)}`];
  }
  return null;
}

/** The filters a URL's query holds, as the API's `AuditFilter` (null: none). */
function filterOf(q, projectId) {
  const iso = (v) => (v && !Number.isNaN(Date.parse(v)) ? new Date(v).toISOString() : null);
  const actions = (q.get("action") ?? "").split(/[\s,]+/).filter(Boolean);
  const filter = {
    username: q.get("user")?.trim() || null,
    projectId: projectId ?? (q.get("project") || null),
    actions: actions.length ? actions : null,
    outcome: ["OK", "FAILED"].includes(q.get("outcome")) ? q.get("outcome") : null,
    since: iso(q.get("since")),
    until: iso(q.get("until")),
  };
  return Object.values(filter).some((v) => v !== null) ? filter : null;
}

export async function render(view, { query }, scope) {
  view.append(h("h1", "Audit log"));
  if (!isAdmin()) return view.append(errorBox({ code: "FORBIDDEN", message: "The audit log is for server admins; a project's ADMINs see its own on the project's page." }));
  const { projects } = await gql("query AuditProjects { projects { id name } }");
  await auditLog(view, scope, { query, projects, base: "/audit" });
}

/**
 * The log in `view`: filters (kept in the URL's query when `base` is given),
 * the entries, "Show more". `projectId`: only that project's.
 */
export async function auditLog(view, scope, { query = new URLSearchParams(), projects = null, projectId = null, base = null }) {
  const input = (name, attrs) => h("input", { name, value: query.get(name) ?? "", autocomplete: "off", ...attrs });
  const user = input("user", { placeholder: "username" });
  const action = input("action", { placeholder: "deployBlueprint, deleteUser", list: "audit-actions" });
  const outcome = h("select", { name: "outcome" }, [["", "Any"], ["OK", "OK"], ["FAILED", "Failed"]].map(([v, label]) => h("option", { value: v, selected: query.get("outcome") === v }, label)));
  const since = input("since", { type: "datetime-local" });
  const until = input("until", { type: "datetime-local" });
  const project = projects && h("select", { name: "project" }, h("option", { value: "" }, "Any project"),
    projects.map((p) => h("option", { value: p.id, selected: query.get("project") === p.id }, p.name)));
  const names = new Map((projects ?? []).map((p) => [p.id, p.name]));
  // Every mutation, for the action field's suggestions: the log records each.
  const actions = (await gql("query Mutations { __type(name: \"Mutation\") { fields { name } } }")).__type.fields.map((f) => f.name);
  const form = h("form.filters.card", { id: projectId ? "project-audit-filters" : "audit-filters", role: "search", onsubmit: (e) => (e.preventDefault(), apply()) },
    field("User", user), project && field("Project", project), field("Action", action), field("Outcome", outcome),
    field("Since", since), field("Until", until), h("div.toolbar", h("button", { type: "submit" }, "Filter"),
      h("button.secondary", { type: "button", onclick: clear }, "Clear")),
    h("datalist#audit-actions", actions.map((a) => h("option", { value: a }))));
  const body = h("div", { id: projectId ? "project-audit" : "audit" });
  view.append(form, body);

  function clear() {
    for (const el of [user, project, action, outcome, since, until]) if (el) el.value = "";
    apply();
  }

  let filter = null;
  let stopLive = null;
  function apply() {
    const q = new URLSearchParams();
    for (const el of [user, project, action, outcome, since, until]) if (el?.value.trim()) q.set(el.name, el.value.trim());
    if (base) {
      const url = `${base}${q.size ? `?${q}` : ""}`;
      if (url !== location.pathname + location.search) history.pushState(null, "", url);
    }
    return load(q);
  }

  const row = (e) => {
    const touched = target(e);
    const cell = (label, ...children) => h("td", { dataset: { label } }, ...children);
    return h("tr", { dataset: { id: e.id, action: e.action, outcome: e.outcome } },
      cell("When", time(e.at)),
      cell("User", e.username ?? muted("anonymous")),
      projectId ? null : cell("Project", e.projectId ? (names.has(e.projectId) ? link(`/projects/${e.projectId}`, names.get(e.projectId)) : projectLink(e.projectId)) : muted()),
      cell("Action", code(e.action)),
      cell("On", touched ? link(touched[0], touched[1]) : muted()),
      cell("Outcome", h("span", { class: `badge state-${e.outcome === "OK" ? "complete" : "failed"}` }, e.outcome), e.error ? h("small.hint", e.error) : null),
      cell("Took", `${e.durationMs < 10 ? e.durationMs.toFixed(1) : Math.round(e.durationMs)} ms`),
      cell("From", e.address ?? muted()),
      cell("Arguments", h("details", h("summary", "Show"), h("pre.json", JSON.stringify(e.arguments, null, 2)))));
  };

  async function load(q = query) {
    filter = filterOf(q, projectId);
    stopLive?.();
    stopLive = null;
    const read = (after) => gql(projectId ? OF_PROJECT : ALL, { id: projectId, filter, after }).then((d) => (projectId ? d.project : d).auditLog);
    try {
      const first = await read(null);
      if (!scope.alive) return;
      if (!first.nodes.length) return replace(body, empty(filter ? "No entry matches these filters." : "Nothing recorded yet: every mutation is, once made."));
      const rows = h("tbody", first.nodes.map(row));
      const count = note("", { id: projectId ? "project-audit-count" : "audit-count" });
      let total = first.totalCount;
      const counted = () => (count.textContent = `${total} entr${total === 1 ? "y" : "ies"}, newest first; ${rows.children.length} shown`);
      const more = h("button.secondary", { type: "button", id: projectId ? "project-audit-more" : "audit-more" }, "Show more");
      const slot = errorSlot();
      let cursor = first.pageInfo;
      const next = async () => {
        const page = await read(cursor.endCursor);
        rows.append(...page.nodes.filter((e) => !rows.querySelector(`[data-id="${e.id}"]`)).map(row));
        cursor = page.pageInfo;
        more.hidden = !cursor.hasNextPage;
        counted();
      };
      more.hidden = !cursor.hasNextPage;
      more.onclick = () => busy(more, slot, next);
      counted();
      const heads = ["When", "User", projectId ? null : "Project", "Action", "On", "Outcome", "Took", "From", "Arguments"].filter(Boolean);
      replace(body, count, table(heads, rows, { id: projectId ? "project-audit-list" : "audit-list" }), h("div.toolbar", more, slot));
      // New entries as they are recorded (server admins may follow the log).
      if (isAdmin()) {
        stopLive = scope.subscribe(LIVE, { filter }, {
          next: ({ auditEvents: e }) => {
            if (projectId && e.projectId !== projectId) return;
            if (rows.querySelector(`[data-id="${e.id}"]`)) return;
            rows.prepend(row(e));
            total += 1;
            counted();
          },
        });
      }
    } catch (error) {
      if (scope.alive) replace(body, errorBox(error));
    }
  }
  await load();
}
