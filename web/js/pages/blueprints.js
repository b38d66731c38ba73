// Blueprints: the list and a YAML editor.

import { gql } from "../api.js";
import { allows, navigate, projectLink, projectsFor, roleIn } from "../app.js";
import { askFirst, busy, code, empty, errorBox, errorSlot, failed, field, h, link, muted, note, replace, table, time } from "../dom.js";

export const styles = "/ui/css/blueprints.css";

const FIELDS = `id projectId name description source updatedAt warnings
  variables { name type default description }
  resources { key type provider dependsOn replicas strategy }`;
const LIST = `query Blueprints($after: String) { blueprints(first: 50, after: $after) { totalCount pageInfo { hasNextPage endCursor }
  nodes { id projectId name description updatedAt warnings resources { key } variables { name type } } } }`;
const ONE = `query Blueprint($id: ID!) { blueprint(id: $id) { ${FIELDS} } }`;
const CREATE = `mutation CreateBlueprint($input: CreateBlueprintInput!) { createBlueprint(input: $input) { ${FIELDS} } }`;
const UPDATE = `mutation UpdateBlueprint($id: ID!, $input: UpdateBlueprintInput!) { updateBlueprint(id: $id, input: $input) { ${FIELDS} } }`;
const DELETE = `mutation DeleteBlueprint($id: ID!) { deleteBlueprint(id: $id) }`;

const STARTER = `version: "1"
variables:
  replicas: { type: int, default: 1, description: How many copies to run }
resources:
  app:
    type: process.v1.service
    replicas: "{{ replicas }}"
    config: { command: sleep, args: ["3600"] }
`;

// For the next page: a created blueprint, or a deleted one's name.
let handoff = null;

const cell = (name, ...children) => h("td", { dataset: { field: name.toLowerCase().replace(/ /g, "-"), label: name } }, ...children);
const codes = (items, after = () => null) => items.map((x, i) => [i ? ", " : "", code(x.name ?? x), after(x)]);

export async function list(view, _params, scope) {
  const notice = h("div", { role: "status" }, handoff?.deleted ? h("p#bp-deleted.notice", `Deleted blueprint “${handoff.deleted}”.`) : null);
  handoff = null;
  const body = h("div#blueprint-list");
  view.append(
    h("h1", "Blueprints"),
    notice,
    h("div.toolbar", h("p.muted.grow", "YAML naming variables and resources; a deploy runs the resources as a DAG."),
      projectsFor("DEVELOPER").length ? h("a#new-blueprint.button", { href: "/blueprints/new" }, "New blueprint") : null),
    body,
  );
  let rows = null;
  const more = h("button#more-blueprints.secondary", { type: "button" }, "Show more");
  const moreSlot = errorSlot();
  async function page(after) {
    const { nodes, pageInfo, totalCount } = (await gql(LIST, { after })).blueprints;
    if (!scope.alive) return;
    if (!rows) {
      if (!totalCount) return replace(body, empty("No blueprints yet.", link("/blueprints/new", "Write one"), "— variables, resources and what each depends on."));
      rows = h("tbody");
      replace(body, table(["Name", "Description", "Resources", "Variables", "Warnings", "Updated"], rows, { id: "blueprints" }), h("div.toolbar", more, moreSlot));
    }
    rows.append(...nodes.map(listRow));
    more.hidden = !pageInfo.hasNextPage;
    more.onclick = () => busy(more, moreSlot, () => page(pageInfo.endCursor));
  }
  try {
    await page(null);
  } catch (error) {
    if (scope.alive) replace(body, errorBox(error));
  }
}

function listRow(b) {
  return h("tr", { dataset: { id: b.id } },
    h("td", link(`/blueprints/${b.id}`, b.name)),
    h("td", b.description || muted()),
    cell("Resources", String(b.resources.length)),
    cell("Variables", b.variables.length ? codes(b.variables, (v) => muted(`: ${v.type}`)) : muted("none")),
    cell("Warnings", b.warnings.length ? h("span.bp-warn", { title: b.warnings.join("\n") }, `⚠ ${b.warnings.length}`) : muted("none")),
    cell("Updated", time(b.updatedAt)));
}

export { editor as create, editor as detail };

async function editor(view, { id = null }, scope) {
  let saved = null; // as stored
  let notice = null;
  if (handoff && handoff.id === id) ({ blueprint: saved, notice } = handoff);
  handoff = null;
  if (id && !saved) {
    try {
      saved = (await gql(ONE, { id })).blueprint;
    } catch (error) {
      if (scope.alive) failed(view, "Blueprint", error, "/blueprints", "All blueprints");
      return;
    }
    if (!scope.alive) return;
  }

  // DEVELOPER edits, DEPLOYER deploys, VIEWER reads.
  const role = saved ? roleIn(saved.projectId) : "DEVELOPER";
  const mayEdit = allows(role, "DEVELOPER");
  const projects = projectsFor("DEVELOPER");
  if (!saved && !projects.length) return view.append(h("h1", "New blueprint"), note("You are DEVELOPER in no project.", { id: "bp-no-project" }));
  const project = h("select#bp-project", { name: "project" }, projects.map((p) => h("option", { value: p.id }, p.name)));
  const heading = h("h1", saved ? saved.name : "New blueprint");
  const name = h("input#bp-name", { name: "name", required: true, maxlength: 128, autocomplete: "off", value: saved?.name ?? "" });
  const description = h("input#bp-description", { name: "description", autocomplete: "off", value: saved?.description ?? "" });
  const source = codeEditor(saved?.source ?? STARTER);
  const notices = h("div#bp-notice", { role: "status" });
  const dirtyNote = h("span#bp-dirty.muted", { hidden: true }, "Unsaved changes");
  const saveButton = h("button#bp-save", { type: "submit" }, "Save");
  const saveSlot = problemSlot(source);
  const actions = h("span.toolbar");
  const deleteArea = h("div");
  const parsed = h("div#bp-parsed");

  const values = () => [name.value, description.value, source.area.value];
  let baseline = values();
  const dirty = () => values().some((v, i) => v !== baseline[i]);
  const markDirty = () => (dirtyNote.hidden = !dirty());

  async function save() {
    const input = { name: name.value.trim(), description: description.value.trim(), source: source.area.value };
    const data = saved
      ? (await gql(UPDATE, { id: saved.id, input })).updateBlueprint
      : (await gql(CREATE, { input: { ...input, projectId: project.value, description: input.description || null } })).createBlueprint;
    const message = `Saved “${data.name}” at ${new Date().toLocaleTimeString()}.`;
    name.value = data.name;
    description.value = data.description ?? "";
    baseline = values();
    if (!saved) {
      handoff = { id: data.id, blueprint: data, notice: message };
      return navigate(`/blueprints/${encodeURIComponent(data.id)}`, { replace: true });
    }
    saved = data;
    showSaved(message);
  }

  function showSaved(message) {
    const b = saved;
    source.mark([]);
    markDirty();
    heading.textContent = b.name;
    document.title = `${b.name} · Corbel`;
    replace(notices, message ? h("p#bp-saved.notice", message) : null);
    const ask = h("button#bp-delete.danger", { type: "button" }, "Delete");
    replace(actions, allows(role, "DEPLOYER") && h("a#bp-deploy.button.secondary", { href: `/deployments/new?blueprint=${encodeURIComponent(b.id)}`, title: "Deploys the saved version" }, "Deploy"), mayEdit && ask);
    replace(deleteArea, askFirst(ask, {
      id: "bp-delete-confirm",
      cancelId: "bp-delete-no",
      question: `Delete blueprint “${b.name}”? This cannot be undone; it is refused while deployments made from it are not destroyed.`,
      yes: h("button#bp-delete-yes.danger", "Delete for good"),
      act: async () => {
        await gql(DELETE, { id: b.id });
        baseline = values(); // nothing left to save
        handoff = { deleted: b.name };
        navigate("/blueprints", { replace: true });
      },
    }));
    replace(parsed, parsedView(b));
  }

  const onsubmit = (event) => {
    event.preventDefault();
    replace(notices);
    busy(saveButton, saveSlot, save);
  };
  const form = h("form#blueprint-form.card", { novalidate: true, onsubmit, oninput: markDirty },
    h("div.bp-meta", field("Name", name), field("Description", description), saved ? null : field("Project", project)),
    h("div.field", h("label", { for: "bp-source" }, "Source (YAML)"), source.box,
      h("small#bp-source-hint.hint", "Tab inserts two spaces (Esc, then Tab, leaves the editor). Ctrl+S or ⌘S saves.")),
    h("div.toolbar", saveButton, dirtyNote, h("span.grow"), actions),
    saveSlot,
    deleteArea);
  for (const el of [name, description, source.area]) el.readOnly = !mayEdit;
  saveButton.hidden = saveButton.disabled = !mayEdit;
  view.append(heading, h("p", link("/blueprints", "← All blueprints"), saved && [" · project ", projectLink(saved.projectId)]), notices, form, parsed);
  source.fit();
  if (saved) showSaved(notice);
  else source.area.focus();

  const onKey = (event) => {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "s") {
      event.preventDefault();
      if (!saveButton.disabled) form.requestSubmit();
    }
  };
  // Leaving unsaved changes asks first.
  const onUnload = (event) => dirty() && event.preventDefault();
  const onLeave = (event) => {
    const a = event.target.closest?.("a[href]");
    if (!a || a.target || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    if (dirty() && !confirm("Leave this blueprint without saving your changes?")) {
      event.preventDefault();
      event.stopPropagation();
    }
  };
  document.addEventListener("keydown", onKey);
  window.addEventListener("beforeunload", onUnload);
  window.addEventListener("click", onLeave, true);
  scope.onDispose(() => {
    document.removeEventListener("keydown", onKey);
    window.removeEventListener("beforeunload", onUnload);
    window.removeEventListener("click", onLeave, true);
  });
}

function parsedView(b) {
  const variables = b.variables.map((v) =>
    h("tr", { dataset: { name: v.name } },
      h("td", code(v.name)),
      cell("Type", code(v.type)),
      cell("Default", v.default == null ? muted("required at deploy") : code(JSON.stringify(v.default))),
      cell("Description", v.description ?? muted())));
  const resources = b.resources.map((r) =>
    h("tr", { dataset: { key: r.key } },
      h("td", code(r.key)),
      cell("Type", code(r.type)),
      cell("Provider", r.provider ?? muted("by type")),
      cell("Depends on", r.dependsOn.length ? codes(r.dependsOn) : muted("nothing")),
      cell("Replicas", code(r.replicas)),
      cell("Strategy", r.strategy)));
  return [
    h("p.muted", "Saved ", time(b.updatedAt), ". The server read:"),
    h("h2", "Variables"),
    variables.length ? table(["Name", "Type", "Default", "Description"], variables, { id: "bp-variables" }) : empty("No variables."),
    h("h2", "Resources"),
    resources.length
      ? table(["Key", "Type", "Provider", "Depends on", "Replicas", "Strategy"], resources, { id: "bp-resources" })
      : empty("No resources yet."),
    h("h2", "Warnings"),
    b.warnings.length
      ? h("ul#bp-warnings.bp-warnings", b.warnings.map((w) => h("li", w)))
      : h("p#bp-warnings-none.muted", "None: a provider serves every resource type."),
  ];
}

function problemSlot(source) {
  const el = errorSlot();
  el.show = (error) => {
    const problems = error?.code === "VALIDATION" ? problemsOf(error) : [];
    source.mark(problems);
    if (!problems.some((p) => p.path || p.line)) return replace(el, errorBox(error));
    const n = problems.length;
    const item = (p) =>
      h("li", { dataset: { path: p.path, line: p.line ?? "" } },
        p.path ? h("code.bp-path", p.path) : h("span.bp-path.muted", "(document)"),
        " ",
        h("span.bp-message", p.message),
        p.line ? [" ", h("button.link.bp-goto", { type: "button", onclick: () => source.goTo(p.line) }, `line ${p.line}`)] : null);
    replace(el, h("div#bp-problems.error.bp-problems", { role: "alert", dataset: { code: error.code } },
      h("strong", error.code), ` The server found ${n} problem${n === 1 ? "" : "s"}; nothing was saved.`, h("ul", problems.map(item))));
  };
  return el;
}

/** A YAML error's line is in its message. */
function problemsOf(error) {
  const list = error.extensions?.problems;
  return (Array.isArray(list) ? list : []).map((p) => {
    const message = String(p.message ?? "");
    const named = p.path ? null : /\bline (\d+)/.exec(message);
    return { path: p.path ?? "", message, line: p.line > 0 ? p.line : named ? Number(named[1]) : null };
  });
}

/** A textarea with line numbers; `mark(problems)` bands their lines. */
function codeEditor(text) {
  const numbers = h("div.bp-numbers");
  const bands = h("div.bp-bands-inner");
  const area = h("textarea#bp-source", { name: "source", wrap: "off", spellcheck: "false", autocapitalize: "off", autocomplete: "off", "aria-describedby": "bp-source-hint" });
  area.value = text;
  const box = h("div.bp-code", h("div.bp-gutter", { "aria-hidden": "true" }, numbers), h("div.bp-text", h("div.bp-bands", { "aria-hidden": "true" }, bands), area));
  let marks = new Map(); // line -> messages
  let escaped = false;
  const lines = () => area.value.split("\n");
  const lineHeight = () => parseFloat(getComputedStyle(area).lineHeight) || 19.5;

  function paint() {
    [...numbers.children].forEach((el, i) => {
      const messages = marks.get(i + 1);
      el.classList.toggle("bad", Boolean(messages));
      if (messages) el.title = messages.join("\n");
      else el.removeAttribute("title");
    });
  }
  function numberLines() {
    const n = lines().length;
    for (let i = numbers.childElementCount + 1; i <= n; i++) numbers.append(h("div", { dataset: { line: i } }, String(i)));
    while (numbers.childElementCount > n) numbers.lastElementChild.remove();
    paint();
  }
  function follow() {
    numbers.style.transform = bands.style.transform = `translateY(${-area.scrollTop}px)`;
  }
  // 10 to 32 lines; never shrinks.
  function fit() {
    const want = Math.min(Math.max(lines().length + 1, 10), 32) * lineHeight() + 14;
    if (area.offsetHeight && area.offsetHeight < want) area.style.height = `${want}px`;
  }
  area.addEventListener("scroll", follow);
  area.addEventListener("input", () => {
    numberLines();
    fit();
    box.classList.toggle("stale", marks.size > 0);
  });
  area.addEventListener("keydown", (event) => {
    const leave = escaped; // Esc, then Tab, leaves the editor
    escaped = event.key === "Escape";
    if (event.key !== "Tab" || event.shiftKey || event.ctrlKey || event.altKey || event.metaKey || leave) return;
    event.preventDefault();
    // execCommand keeps the undo history.
    if (!document.execCommand?.("insertText", false, "  ")) {
      area.setRangeText("  ", area.selectionStart, area.selectionEnd, "end");
      area.dispatchEvent(new Event("input", { bubbles: true }));
    }
  });
  numberLines();

  return {
    box,
    area,
    fit,
    mark(problems) {
      marks = new Map();
      for (const p of problems.filter((p) => p.line)) marks.set(p.line, [...(marks.get(p.line) ?? []), p.path ? `${p.path}: ${p.message}` : p.message]);
      box.classList.remove("stale");
      paint();
      const lh = lineHeight();
      const top = parseFloat(getComputedStyle(area).paddingTop) || 0;
      replace(bands, [...marks.keys()].map((line) => h("div.bp-band", { style: `top:${top + (line - 1) * lh}px;height:${lh}px` })));
    },
    goTo(line) {
      const all = lines();
      const at = Math.min(line, all.length) - 1;
      const start = all.slice(0, at).reduce((sum, l) => sum + l.length + 1, 0);
      area.focus({ preventScroll: true });
      area.setSelectionRange(start, start + all[at].length);
      area.scrollTop = Math.max(0, at * lineHeight() - area.clientHeight / 3);
      area.scrollLeft = 0;
      follow();
      box.scrollIntoView({ block: "nearest" });
    },
  };
}
