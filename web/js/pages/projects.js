// Projects. Only a project's ADMIN sees what changes it.

import { gql } from "../api.js";
import { allows, navigate } from "../app.js";
import { auditLog } from "./audit.js";
import { badge, busy, chips, empty, errorSlot, facts, failed, field, fill, h, invalid, link, muted, note, replace, sending, table, time, typedConfirm } from "../dom.js";

const FIELDS = "id name description myRole maxResources maxLeaseSeconds quotas usage { resources }";
const roleSelect = (now, attrs) => h("select", { name: "role", ...attrs }, ["VIEWER", "DEPLOYER", "DEVELOPER", "ADMIN"].map((r) => h("option", { value: r, selected: r === now }, r)));
const limit = (n, unit = "") => (n === null ? muted("no limit") : `${n}${unit}`);
const quotaText = (q) => Object.entries(q).map(([k, v]) => `${k} ≤ ${v}`).join(", ") || muted("none");
const usage = (p) => h("span", { dataset: { field: "usage" } }, `${p.usage.resources} of `, limit(p.maxResources), " resources");

export async function list(view, _params, scope) {
  const body = h("div#project-list");
  view.append(h("div.toolbar", h("h1.grow", "Projects"), h("a#new-project.button", { href: "/projects/new" }, "New project")), body);
  await fill(body, scope, async () => {
    const { projects } = await gql(`query Projects { projects { ${FIELDS} } }`);
    const row = (p) => h("tr", { dataset: { name: p.name } }, h("td", link(`/projects/${p.id}`, p.name)),
      [["My role", p.myRole], ["Usage", usage(p)], ["Quotas", quotaText(p.quotas)]].map(([label, v]) => h("td", { dataset: { label } }, v)));
    return projects.length
      ? table(["Name", "My role", "Usage", "Quotas"], projects.map(row), { id: "projects" })
      : empty("In no project yet:", link("/projects/new", "make one"), ".");
  });
}

/** Name, description, limits; `read()`: the API's input (empty: no limit). */
function projectFields(p = {}) {
  const input = (name, value, attrs) => h("input", { name, value: value ?? "", autocomplete: "off", ...attrs });
  const [name, description, max, lease] = [["name", { required: true }], ["description"], ["maxResources"], ["maxLeaseSeconds"]].map(([n, a]) => input(n, p[n], a));
  const rows = h("div#quota-rows");
  const addRow = (key, value) => {
    const row = h("div.toolbar", input("quota-key", key, { "aria-label": "Quota name", placeholder: "cpu" }),
      input("quota-value", value, { "aria-label": "Limit", inputmode: "numeric" }), h("button.link", { type: "button", onclick: () => row.remove() }, "Remove"));
    rows.append(row);
    return row;
  };
  Object.entries(p.quotas ?? {}).forEach(([k, v]) => addRow(k, v));
  const whole = (el, what) => {
    const text = el.value.trim();
    if (text && !/^\d+$/.test(text)) throw invalid(`${what}: expected a whole number 0 or more, got “${text}”`);
    return text ? Number(text) : null;
  };
  const read = () => {
    const quotas = {};
    for (const row of rows.children) {
      const [k, v] = row.querySelectorAll("input");
      const key = k.value.trim();
      if (!key && !v.value.trim()) continue;
      if (!key) throw invalid("quotas: a limit needs a name");
      if (key in quotas) throw invalid(`quotas: “${key}” is named twice`);
      quotas[key] = whole(v, `quotas.${key}`);
      if (quotas[key] === null) throw invalid(`quotas.${key}: a limit is required`);
    }
    return { name: name.value.trim(), description: description.value.trim() || null, maxResources: whole(max, "maxResources"), maxLeaseSeconds: whole(lease, "maxLeaseSeconds"), quotas };
  };
  const el = [field("Name", name), field("Description", description),
    h("div.pair", field("Most resources at once", max, "Empty: no limit."), field("Longest lease (seconds)", lease, "Empty: no limit.")),
    h("fieldset", h("legend", "Quotas"), h("p.hint", "Limits on what providers count (cpu…)."), rows,
      h("button#add-quota.secondary", { type: "button", onclick: () => addRow().querySelector("input").focus() }, "Add a quota"))];
  return { el, read, name };
}

export function create(view) {
  const fields = projectFields();
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Create project");
  const make = () => gql(`mutation CreateProject($i: CreateProjectInput!) { createProject(input: $i) { id } }`, { i: fields.read() });
  view.append(h("h1", "New project"), h("form#project-form.card.form", { onsubmit: sending(submit, slot, make, (d) => navigate(`/projects/${d.createProject.id}`)) },
    fields.el, slot, h("div.toolbar", submit, link("/projects", "Cancel"))));
  fields.name.focus();
}

const ONE = `query Project($id: ID!) { project(id: $id) { ${FIELDS} members { role since user { username } } } }`;
const CONTENTS = `query Contents($id: ID!) { blueprints(first: 500) { nodes { id name projectId } }
  deployments(filter: { projectId: $id }, first: 200) { nodes { id name state } } }`;
const SET = "mutation($p: ID!, $u: String!, $r: ProjectRole!) { setProjectMember(projectId: $p, username: $u, role: $r) { role } }";
const REMOVE = "mutation($p: ID!, $u: String!) { removeProjectMember(projectId: $p, username: $u) }";

export async function detail(view, { id }, scope) {
  let p;
  try {
    p = (await gql(ONE, { id })).project;
  } catch (error) {
    return failed(view, "Project", error, "/projects", "All projects");
  }
  const admin = allows(p.myRole, "ADMIN");
  const [heading, about, members, contents] = [h("h1"), h("section#project-facts.card"), h("div#members"), h("div#project-contents")];
  const del = h("button#delete-project.danger", { type: "button" }, "Delete project…");
  // Its ADMINs see what was done in it.
  const audit = h("details#project-audit-tab.card", h("summary", h("h2", "Audit log")));
  audit.addEventListener("toggle", () => audit.open && !audit.dataset.read && (audit.dataset.read = "1") && auditLog(audit, scope, { projectId: id }), { once: false });
  const member = async (q, u, r) => {
    await gql(q, { p: id, u, r });
    draw(Object.assign(p, (await gql(ONE, { id })).project));
  };

  function draw() {
    heading.textContent = p.name;
    replace(about, facts([["Your role", p.myRole, "my-role"], ["Description", p.description || muted()], ["Usage", usage(p)],
      ["Longest lease", limit(p.maxLeaseSeconds, " s")], ["Quotas", quotaText(p.quotas), "quotas"]]));
    const row = ({ user: { username: u }, role: r, since }) => {
      const slot = errorSlot();
      // Saved at each change; the focus stays on it.
      const role = roleSelect(r, { "aria-label": `Role of ${u}`, onchange: () => busy(role, slot, () => member(SET, u, role.value)).then(() => members.querySelector(`[data-member="${u}"] select`)?.focus()) });
      const remove = h("button.secondary", { type: "button", dataset: { remove: u } }, "Remove");
      remove.onclick = () => busy(remove, slot, () => member(REMOVE, u));
      return h("tr", { dataset: { member: u, role: r } }, h("td", u), h("td", admin ? role : r), h("td", time(since)), admin && h("td", remove, slot));
    };
    replace(members, table(["User", "Role", "Since", admin && ""].filter((x) => x !== false), p.members.map(row), { id: "member-list" }));
  }
  draw();

  replace(view,heading, h("p", link("/projects", "← All projects")), about,
    h("section.card", h("h2", "Members"), members, admin ? addMember(member) : note(`Your role is ${p.myRole}: a project ADMIN changes the project.`, { id: "read-only" })),
    admin && settings(p, (next) => draw(Object.assign(p, next))),
    h("h2", "Blueprints and deployments"), contents,
    admin && audit,
    admin && h("section#danger", del, typedConfirm(del, () => p.name, "delete it (refused while it holds blueprints or deployments not destroyed)",
      h("button#delete-project-confirm.danger", "Delete project"), async () => {
        await gql("mutation($id: ID!) { deleteProject(id: $id) }", { id });
        navigate("/projects");
      })));

  await fill(contents, scope, async () => {
    const { blueprints, deployments } = await gql(CONTENTS, { id });
    const mine = blueprints.nodes.filter((b) => b.projectId === id);
    return [
      mine.length ? chips(mine.map((b) => [{ id: b.id }, link(`/blueprints/${b.id}`, b.name)]), { id: "project-blueprints" }) : empty("No blueprints."),
      deployments.nodes.length ? chips(deployments.nodes.map((d) => [{ id: d.id }, link(`/deployments/${d.id}`, d.name), " ", badge(d.state)]), { id: "project-deployments" }) : empty("No deployments."),
    ];
  });
}

function addMember(member) {
  const username = h("input", { name: "username", required: true, autocomplete: "off" });
  const role = roleSelect("VIEWER");
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Add member");
  const add = async () => {
    await member(SET, username.value.trim(), role.value);
    username.value = "";
  };
  return h("form#add-member", { onsubmit: sending(submit, slot, add) },
    h("div.toolbar", field("Username", username), field("Role", role), submit), slot);
}

function settings(p, saved) {
  const fields = projectFields(p);
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Save");
  const save = () => gql(`mutation UpdateProject($id: ID!, $i: UpdateProjectInput!) { updateProject(id: $id, input: $i) { ${FIELDS} } }`, { id: p.id, i: fields.read() });
  return h("details#project-settings.card", h("summary", "Settings"),
    h("form.form", { onsubmit: sending(submit, slot, save, (d) => saved(d.updateProject)) }, fields.el, slot, submit));
}
