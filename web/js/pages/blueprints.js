// Blueprints: the list, and an editor for one blueprint's YAML with line
// numbers. Saving asks the server to parse and check it; every problem it
// names is listed with its path and marked at its line. A saved blueprint
// shows what the server read from it: variables with their types, resources,
// and warnings (resource types no provider serves).

import { gql } from "../api.js";
import { navigate } from "../app.js";
import { busy, empty, errorBox, errorSlot, h, replace, time } from "../dom.js";

export const styles = "/ui/css/blueprints.css";

const FIELDS = `id name description source updatedAt warnings
  variables { name type default description }
  resources { key type provider dependsOn replicas strategy }`;
const LIST = `query Blueprints($after: String) {
  blueprints(first: 50, after: $after) {
    totalCount pageInfo { hasNextPage endCursor }
    nodes { id name description updatedAt warnings resources { key } variables { name type } }
  }
}`;
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

// What the page just did, for the page it goes to (a created blueprint and
// its notice, or the name of a deleted one): saves one fetch, keeps the notice.
let handoff = null;

const none = (text) => h("span", { class: "muted" }, text);
const label = (text) => h("span", { class: "bp-label" }, text, ": ");

export async function render(view, params, scope) {
  if (params.view === "list") return list(view, scope);
  return editor(view, params, scope);
}

async function list(view, scope) {
  const notice = h("div", { role: "status" }, handoff?.deleted ? h("p", { class: "notice", id: "bp-deleted" }, `Deleted blueprint “${handoff.deleted}”.`) : null);
  handoff = null;
  const body = h("div", { id: "blueprint-list" });
  view.append(
    h("h1", {}, "Blueprints"),
    notice,
    h(
      "div",
      { class: "toolbar" },
      h("p", { class: "muted grow" }, "A blueprint is YAML naming variables and resources; deploying it runs the resources as a DAG."),
      h("a", { class: "button", href: "/blueprints/new", id: "new-blueprint" }, "New blueprint"),
    ),
    body,
  );
  let rows = null;
  const more = h("button", { type: "button", class: "secondary", id: "more-blueprints" }, "Show more");
  const moreSlot = errorSlot();
  async function page(after) {
    const data = await gql(LIST, { after });
    if (!scope.alive) return;
    const { nodes, pageInfo, totalCount } = data.blueprints;
    if (!rows) {
      if (totalCount === 0) {
        replace(body, empty("No blueprints yet.", h("a", { href: "/blueprints/new" }, "Write one"), "— variables, resources and what each depends on."));
        return;
      }
      rows = h("tbody");
      replace(
        body,
        h(
          "table",
          { class: "list", id: "blueprints" },
          h("thead", {}, h("tr", {}, ["Name", "Description", "Resources", "Variables", "Warnings", "Updated"].map((t) => h("th", {}, t)))),
          rows,
        ),
        h("div", { class: "toolbar" }, more, moreSlot),
      );
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
  return h(
    "tr",
    { dataset: { id: b.id } },
    h("td", {}, h("a", { href: `/blueprints/${b.id}` }, b.name)),
    h("td", {}, b.description ? b.description : none("—")),
    h("td", { dataset: { field: "resources" } }, label("Resources"), String(b.resources.length)),
    h(
      "td",
      { dataset: { field: "variables" } },
      label("Variables"),
      b.variables.length
        ? b.variables.map((v, i) => [i ? ", " : "", h("code", {}, v.name), h("span", { class: "muted" }, `: ${v.type}`)])
        : none("none"),
    ),
    h(
      "td",
      { dataset: { field: "warnings" } },
      label("Warnings"),
      b.warnings.length
        ? h("span", { class: "bp-warn", title: b.warnings.join("\n") }, `⚠ ${b.warnings.length}`)
        : none("none"),
    ),
    h("td", {}, label("Updated"), time(b.updatedAt)),
  );
}

async function editor(view, params, scope) {
  const id = params.id ?? null;
  let saved = null; // the blueprint as stored
  let notice = null;
  if (handoff && handoff.id === id) {
    ({ blueprint: saved, notice } = handoff);
  }
  handoff = null;
  if (id && !saved) {
    try {
      saved = (await gql(ONE, { id })).blueprint;
    } catch (error) {
      if (scope.alive) view.append(h("h1", {}, "Blueprint"), errorBox(error), h("p", {}, h("a", { href: "/blueprints" }, "All blueprints")));
      return;
    }
    if (!scope.alive) return;
  }

  const heading = h("h1", {}, saved ? saved.name : "New blueprint");
  const name = h("input", { name: "name", id: "bp-name", required: true, maxlength: 128, autocomplete: "off", value: saved?.name ?? "" });
  const description = h("input", { name: "description", id: "bp-description", autocomplete: "off", value: saved?.description ?? "" });
  const code = codeEditor(saved?.source ?? STARTER);
  const notices = h("div", { id: "bp-notice", role: "status" });
  const dirtyNote = h("span", { class: "muted", id: "bp-dirty", hidden: true }, "Unsaved changes");
  const saveButton = h("button", { type: "submit", id: "bp-save" }, "Save");
  const saveSlot = problemSlot(code);
  const actions = h("span", { class: "toolbar" });
  const deleteArea = h("div");
  const parsed = h("div", { id: "bp-parsed" });

  let baseline = values();
  function values() {
    return { name: name.value, description: description.value, source: code.area.value };
  }
  const dirty = () => {
    const now = values();
    return now.name !== baseline.name || now.description !== baseline.description || now.source !== baseline.source;
  };
  const markDirty = () => (dirtyNote.hidden = !dirty());

  async function save() {
    const { name: n, description: d, source } = values();
    const input = { name: n.trim(), description: d.trim() || null, source };
    const data = saved
      ? (await gql(UPDATE, { id: saved.id, input: { ...input, description: d.trim() } })).updateBlueprint
      : (await gql(CREATE, { input })).createBlueprint;
    const message = `Saved “${data.name}” at ${new Date().toLocaleTimeString()}.`;
    name.value = data.name;
    description.value = data.description ?? "";
    baseline = values();
    if (!saved) {
      handoff = { id: data.id, blueprint: data, notice: message };
      navigate(`/blueprints/${encodeURIComponent(data.id)}`, { replace: true });
      return;
    }
    saved = data;
    showSaved(message);
  }

  function showSaved(message) {
    code.mark([]);
    markDirty();
    heading.textContent = saved.name;
    document.title = `${saved.name} · Corbel`;
    replace(notices, message ? h("p", { class: "notice", id: "bp-saved" }, message) : null);
    const [links, confirmBox] = savedActions(saved);
    replace(actions, ...links);
    replace(deleteArea, confirmBox);
    replace(parsed, ...parsedView(saved));
  }

  const form = h(
    "form",
    {
      id: "blueprint-form",
      class: "card",
      novalidate: true,
      onsubmit: (event) => {
        event.preventDefault();
        replace(notices);
        busy(saveButton, saveSlot, save);
      },
      oninput: markDirty,
    },
    h(
      "div",
      { class: "bp-meta" },
      h("div", { class: "field" }, h("label", { for: "bp-name" }, "Name"), name),
      h("div", { class: "field" }, h("label", { for: "bp-description" }, "Description"), description),
    ),
    h(
      "div",
      { class: "field" },
      h("label", { for: "bp-source" }, "Source (YAML)"),
      code.box,
      h("small", { class: "hint", id: "bp-source-hint" }, "Tab inserts two spaces (Esc, then Tab, leaves the editor). Ctrl+S or ⌘S saves."),
    ),
    h("div", { class: "toolbar" }, saveButton, dirtyNote, h("span", { class: "grow" }), actions),
    saveSlot,
    deleteArea,
  );
  view.append(
    heading,
    h("p", {}, h("a", { href: "/blueprints" }, "← All blueprints")),
    notices,
    form,
    parsed,
  );
  code.fit();
  if (saved) showSaved(notice);
  else code.area.focus();

  // Ctrl/Cmd+S saves from anywhere on the page.
  const onKey = (event) => {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "s") {
      event.preventDefault();
      if (!saveButton.disabled) form.requestSubmit();
    }
  };
  // Leaving with unsaved changes asks first: a reload or another site
  // (beforeunload), and links inside the console (before the router sees them).
  const onUnload = (event) => {
    if (dirty()) event.preventDefault();
  };
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

  function savedActions(b) {
    const confirmBox = h("div", { class: "bp-confirm", id: "bp-delete-confirm", hidden: true });
    const ask = h("button", { type: "button", class: "danger", id: "bp-delete" }, "Delete");
    ask.onclick = () => {
      const slot = errorSlot();
      const yes = h("button", { type: "button", class: "danger", id: "bp-delete-yes" }, "Delete for good");
      const no = h("button", { type: "button", class: "secondary", id: "bp-delete-no" }, "Cancel");
      yes.onclick = async () => {
        const ok = await busy(yes, slot, () => gql(DELETE, { id: b.id }));
        if (!ok) return;
        baseline = values(); // nothing left to save
        handoff = { deleted: b.name };
        navigate("/blueprints", { replace: true });
      };
      no.onclick = () => {
        confirmBox.hidden = true;
        ask.focus();
      };
      replace(
        confirmBox,
        h("p", {}, `Delete blueprint “${b.name}”? This cannot be undone; it is refused while deployments made from it are not destroyed.`),
        h("div", { class: "toolbar" }, yes, no),
        slot,
      );
      confirmBox.hidden = false;
      no.focus();
    };
    const deploy = h("a", { class: "button secondary", id: "bp-deploy", href: `/deployments/new?blueprint=${encodeURIComponent(b.id)}`, title: "Deploys the saved version" }, "Deploy");
    return [[deploy, ask], confirmBox];
  }
}

/** The parsed blueprint: variables with their types, resources, warnings. */
function parsedView(b) {
  const cell = (name, ...children) => h("td", { dataset: { field: name.toLowerCase().replace(/ /g, "-") } }, label(name), ...children);
  const table = (id, heads, rows) =>
    h("table", { class: "list", id }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), h("tbody", {}, rows));
  return [
    h("p", { class: "muted" }, "Last saved ", time(b.updatedAt), ". What the server read from it:"),
    h("h2", {}, "Variables"),
    b.variables.length
      ? table(
          "bp-variables",
          ["Name", "Type", "Default", "Description"],
          b.variables.map((v) =>
            h(
              "tr",
              { dataset: { name: v.name } },
              h("td", {}, h("code", {}, v.name)),
              cell("Type", h("code", { class: "bp-type" }, v.type)),
              cell("Default", v.default === null || v.default === undefined ? none("required at deploy") : h("code", {}, JSON.stringify(v.default))),
              cell("Description", v.description ?? none("—")),
            ),
          ),
        )
      : empty("No variables: a deploy needs no values."),
    h("h2", {}, "Resources"),
    b.resources.length
      ? table(
          "bp-resources",
          ["Key", "Type", "Provider", "Depends on", "Replicas", "Strategy"],
          b.resources.map((r) =>
            h(
              "tr",
              { dataset: { key: r.key } },
              h("td", {}, h("code", {}, r.key)),
              cell("Type", h("code", {}, r.type)),
              cell("Provider", r.provider ?? none("by type")),
              cell("Depends on", r.dependsOn.length ? r.dependsOn.map((d, i) => [i ? ", " : "", h("code", {}, d)]) : none("nothing")),
              cell("Replicas", h("code", {}, r.replicas)),
              cell("Strategy", r.strategy),
            ),
          ),
        )
      : empty("No resources yet: add some under `resources:`."),
    h("h2", {}, "Warnings"),
    b.warnings.length
      ? h("ul", { id: "bp-warnings", class: "bp-warnings" }, b.warnings.map((w) => h("li", {}, w)))
      : h("p", { class: "muted", id: "bp-warnings-none" }, "None: a provider serves every resource type."),
  ];
}

/**
 * Where a save's error goes. A VALIDATION error lists every problem with its
 * path, its message and a button to its line, and marks the lines in the
 * editor's gutter; other errors are shown as they came.
 */
function problemSlot(code) {
  const el = h("div", { class: "error-slot", "aria-live": "polite" });
  el.clear = () => replace(el);
  el.show = (error) => {
    const problems = error?.code === "VALIDATION" ? problemsOf(error) : [];
    code.mark(problems);
    if (!problems.some((p) => p.path || p.line)) return replace(el, errorBox(error));
    const n = problems.length;
    replace(
      el,
      h(
        "div",
        { class: "error bp-problems", role: "alert", id: "bp-problems", dataset: { code: error.code } },
        h("strong", {}, error.code),
        ` The server found ${n} problem${n === 1 ? "" : "s"}; nothing was saved.`,
        h(
          "ul",
          {},
          problems.map((p) =>
            h(
              "li",
              { dataset: { path: p.path, line: p.line ?? "" } },
              p.path ? h("code", { class: "bp-path" }, p.path) : h("span", { class: "bp-path muted" }, "(document)"),
              " ",
              h("span", { class: "bp-message" }, p.message),
              p.line
                ? [" ", h("button", { type: "button", class: "link bp-goto", onclick: () => code.goTo(p.line) }, `line ${p.line}`)]
                : null,
            ),
          ),
        ),
      ),
    );
  };
  return el;
}

/**
 * `extensions.problems`: `{ path, message, line }` each. A problem without a
 * line whose message names one (a YAML parse error) is at that line.
 */
function problemsOf(error) {
  const list = error.extensions?.problems;
  return (Array.isArray(list) ? list : []).map((p) => {
    const message = String(p.message ?? "");
    const named = p.path ? null : /\bline (\d+)/.exec(message);
    return { path: p.path ?? "", message, line: p.line > 0 ? p.line : named ? Number(named[1]) : null };
  });
}

/**
 * A textarea with a line-number gutter that scrolls with it, and bands behind
 * the text on the lines with problems. `mark(problems)` marks lines,
 * `goTo(line)` selects a line and scrolls to it.
 */
function codeEditor(text) {
  const numbers = h("div", { class: "bp-numbers" });
  const gutter = h("div", { class: "bp-gutter", "aria-hidden": "true" }, numbers);
  const bandsInner = h("div", { class: "bp-bands-inner" });
  const bands = h("div", { class: "bp-bands", "aria-hidden": "true" }, bandsInner);
  const area = h("textarea", {
    name: "source",
    id: "bp-source",
    wrap: "off",
    spellcheck: "false",
    autocapitalize: "off",
    autocomplete: "off",
    "aria-describedby": "bp-source-hint",
  });
  area.value = text;
  const box = h("div", { class: "bp-code" }, gutter, h("div", { class: "bp-text" }, bands, area));
  let marks = [];
  let escaped = false;

  const lineCount = () => {
    let n = 1;
    for (let i = area.value.indexOf("\n"); i >= 0; i = area.value.indexOf("\n", i + 1)) n++;
    return n;
  };
  function numberLines() {
    const n = lineCount();
    const have = numbers.childElementCount;
    if (n > have) {
      const more = document.createDocumentFragment();
      for (let i = have + 1; i <= n; i++) more.append(h("div", { dataset: { line: i } }, String(i)));
      numbers.append(more);
    }
    while (numbers.childElementCount > n) numbers.lastElementChild.remove();
    for (const line of marks) paint(line.line, line.messages);
  }
  function paint(line, messages) {
    const el = numbers.children[line - 1];
    if (!el) return;
    el.classList.toggle("bad", Boolean(messages));
    if (messages) el.title = messages.join("\n");
    else el.removeAttribute("title");
  }
  function follow() {
    const y = `translateY(${-area.scrollTop}px)`;
    numbers.style.transform = y;
    bandsInner.style.transform = y;
  }
  const lineHeight = () => parseFloat(getComputedStyle(area).lineHeight) || 19.5;

  area.addEventListener("scroll", follow);
  // Tall enough for the text (10 to 32 lines); never shrinks what the user made taller.
  function fit() {
    const want = Math.min(Math.max(lineCount() + 1, 10), 32) * lineHeight() + 14;
    if (area.offsetHeight && area.offsetHeight < want) area.style.height = `${want}px`;
  }
  area.addEventListener("input", () => {
    numberLines();
    fit();
    box.classList.toggle("stale", marks.length > 0);
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      escaped = true;
      return;
    }
    const leave = escaped;
    escaped = false;
    if (event.key !== "Tab" || event.shiftKey || event.ctrlKey || event.altKey || event.metaKey || leave) return;
    event.preventDefault();
    // execCommand keeps the browser's undo history; setRangeText where it is gone.
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
      for (const { line } of marks) paint(line, null);
      const byLine = new Map();
      for (const p of problems) {
        if (!p.line) continue;
        if (!byLine.has(p.line)) byLine.set(p.line, []);
        byLine.get(p.line).push(p.path ? `${p.path}: ${p.message}` : p.message);
      }
      marks = [...byLine].map(([line, messages]) => ({ line, messages }));
      box.classList.remove("stale");
      for (const { line, messages } of marks) paint(line, messages);
      const lh = lineHeight();
      const top = parseFloat(getComputedStyle(area).paddingTop) || 0;
      replace(
        bandsInner,
        marks.map(({ line }) => h("div", { class: "bp-band", style: `top:${top + (line - 1) * lh}px;height:${lh}px` })),
      );
    },
    goTo(line) {
      const value = area.value;
      let start = 0;
      for (let i = 1; i < line; i++) {
        const next = value.indexOf("\n", start);
        if (next < 0) break;
        start = next + 1;
      }
      const end = value.indexOf("\n", start);
      area.focus({ preventScroll: true });
      area.setSelectionRange(start, end < 0 ? value.length : end);
      area.scrollTop = Math.max(0, (line - 1) * lineHeight() - area.clientHeight / 3);
      area.scrollLeft = 0;
      follow();
      box.scrollIntoView({ block: "nearest" });
    },
  };
}
