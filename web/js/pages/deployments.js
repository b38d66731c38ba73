// Deployments: list, deploy form, one deployment live (with its plans and
// revisions). Nothing polls: a settled run's revision has ended before its STATE event goes out.

import { gql } from "../api.js";
import { allows, navigate, projectLink, projectsFor, roleIn } from "../app.js";
import {
  badge, bars, busy, empty, errorBox, errorSlot, facts, field, fill, h, invalid, json, jsonArea, later, link, liveList, note,
  parseJson, replace, sending, status, table, time, typedConfirm,
} from "../dom.js";
import { drawDag, label } from "./dag.js";
import { commandRunner } from "./exec.js";

export const styles = "/ui/css/deployments.css";

const STATES = ["PENDING", "IN_PROGRESS", "COMPLETE", "FAILED", "DESTROYING", "DESTROYED", "SUSPENDED"];
const words = (s) => s.toLowerCase().replace(/_/g, " ");
const checked = (el) => [...el.querySelectorAll("input:checked")].map((i) => i.value);
const option = (value, text, selected) => h("option", { value, selected }, text);
const BLUEPRINTS = "query { blueprints(first: 500) { nodes { id name projectId } } }";

const LIST = `query Deployments($filter: DeploymentFilter!) { deployments(filter: $filter, first: 200) {
  totalCount nodes { id name projectId state health phase blueprintId elementId createdAt expiresAt }
} }`;

export async function list(view, { query }, scope) {
  const { blueprints } = await gql(BLUEPRINTS);
  const names = new Map(blueprints.nodes.map((b) => [b.id, b.name]));
  const blueprint = h("select", { name: "blueprint", onchange: () => apply(true) }, option("", "Any blueprint"),
    blueprints.nodes.map((b) => option(b.id, b.name, b.id === query.get("blueprint"))));
  const search = h("input", { type: "search", name: "search", value: query.get("search") ?? "", placeholder: "Part of the name", oninput: later(scope, 250, () => apply(false)) });
  const box = (s) => h("input", { type: "checkbox", name: "state", value: s, checked: query.getAll("state").includes(s), onchange: () => apply(true) });
  const states = h("fieldset.states", h("legend", "State"), STATES.map((s) => h("label", box(s), " ", words(s))));
  const body = h("div#deployments");
  view.append(
    h("div.toolbar", h("h1.grow", "Deployments"), projectsFor("DEPLOYER").length ? h("a#deploy-new.button", { href: "/deployments/new" }, "Deploy a blueprint") : null),
    h("form#deployment-filters.filters.card", { role: "search", onsubmit: (e) => (e.preventDefault(), apply(true)) }, states, field("Blueprint", blueprint), field("Search", search)),
    body,
  );

  // In the URL (typing replaces it), for back and reload.
  function apply(push) {
    const q = new URLSearchParams();
    for (const s of checked(states)) q.append("state", s);
    if (blueprint.value) q.set("blueprint", blueprint.value);
    if (search.value.trim()) q.set("search", search.value.trim());
    const url = `/deployments${q.size ? `?${q}` : ""}`;
    if (url !== location.pathname + location.search) history[push ? "pushState" : "replaceState"](null, "", url);
    load();
  }

  const load = () => fill(body, scope, async () => {
    const q = new URLSearchParams(location.search);
    const chosen = q.getAll("state").filter((s) => STATES.includes(s));
    const filter = { states: chosen.length ? chosen : null, blueprintId: q.get("blueprint") || null, search: q.get("search") || null };
    const { nodes, totalCount: n } = (await gql(LIST, { filter })).deployments;
    if (nodes.length) {
      return [
        note(`${n} deployment${n === 1 ? "" : "s"}${n > nodes.length ? ` (the newest ${nodes.length} shown)` : ""}`),
        table(["Name", "Project", "State", "Health", "Phase", "Blueprint", "Created", "Lease"], nodes.map((d) => row(d, names)), { id: "deployment-list" }),
      ];
    }
    return filter.states || filter.blueprintId || filter.search
      ? empty("No deployment matches these filters.")
      : empty("No deployments yet: deploy one of the", link("/blueprints", "blueprints"), ".");
  });
  await liveList(scope, CHANGES, load, (e) => (e.__typename.startsWith("Deployment") ? false : undefined));
}

const CHANGES = `subscription DeploymentChanges { serverEvents { __typename ... on DeploymentChanged { deploymentId } ... on DeploymentHealthChanged { health } } }`;

const origin = (d, blueprint) =>
  d.blueprintId ? link(`/blueprints/${d.blueprintId}`, blueprint) : d.elementId ? link(`/elements/${d.elementId}`, "an element's install") : "—";

function row(d, names) {
  const cell = (label, value) => h("td", { dataset: { label } }, value);
  return h("tr", { dataset: { id: d.id } },
    h("td", link(`/deployments/${d.id}`, d.name)),
    cell("Project", projectLink(d.projectId)),
    h("td", badge(d.state)),
    cell("Health", badge(d.health)),
    cell("Phase", d.phase ? words(d.phase) : "—"),
    cell("From", origin(d, names.get(d.blueprintId) ?? "(deleted)")),
    cell("Created", time(d.createdAt)),
    cell("Lease", time(d.expiresAt)));
}

const BLUEPRINT = `query Blueprint($id: ID!) { blueprint(id: $id) {
  id description warnings variables { name type default description } resources { key strategy }
} }`;
const DEPLOY = "mutation Deploy($input: DeployBlueprintInput!) { deployBlueprint(input: $input) { id } }";

export async function create(view, { query }) {
  const mine = new Set(projectsFor("DEPLOYER").map((p) => p.id));
  const nodes = (await gql(BLUEPRINTS)).blueprints.nodes.filter((b) => mine.has(b.projectId));
  view.append(h("h1", "Deploy a blueprint"));
  if (!nodes.length) return view.append(empty("No blueprint you may deploy."));
  const choose = h("select", { name: "blueprint" }, nodes.map((b) => option(b.id, b.name, b.id === query.get("blueprint"))));
  const about = h("div");
  const variables = h("fieldset#variables");
  const name = h("input", { name: "name", required: true, autocomplete: "off", placeholder: "e.g. shop-staging" });
  const choice = (value, text, checked) => h("label", h("input", { type: "radio", name: "onFailure", value, checked }), " ", text);
  const lease = h("input", { type: "datetime-local", name: "expiresAt" });
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Deploy");
  const capacity = h("section#capacity.card");
  let current = null;
  const deploy = () => {
    if (!current) throw invalid("choose a blueprint");
    const input = {
      blueprintId: current.id,
      name: name.value.trim(),
      variables: readVariables(variables),
      onFailure: form.querySelector("[name=onFailure]:checked").value,
      expiresAt: lease.value ? new Date(lease.value).toISOString() : null,
    };
    return gql(DEPLOY, { input });
  };
  const onsubmit = sending(submit, slot, deploy, (made) => navigate(`/deployments/${made.deployBlueprint.id}`));
  const form = h("form#deploy-form.card.form", { onsubmit },
    field("Blueprint", choose),
    about,
    variables,
    field("Deployment name", name),
    h("fieldset.choices", h("legend", "If the deploy fails"),
      choice("ROLLBACK", "Roll back: destroy what it made", true), choice("KEEP", "Keep what it made, to look at")),
    field("Lease", lease, "Optional: the deployment is destroyed then (it can be extended)."),
    slot,
    submit);
  view.append(h("div.deploy-grid", form, capacity));

  async function show(id) {
    history.replaceState(null, "", `/deployments/new?blueprint=${encodeURIComponent(id)}`);
    current = null;
    replace(variables, h("legend", "Variables"));
    replace(capacity);
    try {
      current = (await gql(BLUEPRINT, { id })).blueprint;
    } catch (error) {
      return replace(about, errorBox(error));
    }
    replace(about, current.description ? note(current.description) : null,
      current.warnings.map((w) => h("p.error", { dataset: { code: "WARNING" } }, w)));
    variables.append(...(current.variables.length ? current.variables.map(variableField) : [note("This blueprint has no variables.")]));
    capacityPreview(capacity, current, () => readVariables(variables));
  }
  choose.onchange = () => show(choose.value);
  await show(choose.value);
}

function variableField(v) {
  const required = v.default == null;
  const structured = v.type === "list" || v.type === "object";
  const attrs = { name: `var-${v.name}`, dataset: { var: v.name, type: v.type }, required };
  const control =
    v.type === "int" || v.type === "number"
      ? h("input", { ...attrs, type: "number", step: v.type === "int" ? 1 : "any", value: v.default })
      : v.type === "bool"
        ? h("input", { ...attrs, type: "checkbox", required: false, checked: v.default === true })
        : structured
          ? jsonArea({ ...attrs, rows: 3 })
          : h("input", { ...attrs, value: v.default, autocomplete: "off" });
  if (structured && !required) control.value = JSON.stringify(v.default, null, 2);
  return field(v.name, control, [v.description, structured ? `${v.type} (JSON)` : v.type, required ? "required" : null].filter(Boolean).join(" · "));
}

/** One left empty takes its default. */
function readVariables(fieldset) {
  const out = {};
  for (const el of fieldset.querySelectorAll("[data-var]")) {
    const { var: name, type } = el.dataset;
    const text = el.value.trim();
    if (type === "bool") out[name] = el.checked;
    else if (!text) {
      if (el.required) throw invalid(`${name}: a value is required`);
    } else if (type === "int" || type === "number") {
      const n = Number(text);
      if (!Number.isFinite(n) || (type === "int" && !Number.isInteger(n))) throw invalid(`${name}: expected ${type === "int" ? "an integer" : "a number"}`);
      out[name] = n;
    } else if (type === "list" || type === "object") out[name] = parseJson(text, name, type);
    else out[name] = el.value;
  }
  return out;
}

const CAPACITY = `query Capacity($id: ID!, $key: String!, $strategy: PlacementStrategy, $variables: JSON!) {
  calculateCapacity(blueprintId: $id, resourceKey: $key, strategy: $strategy, variables: $variables) { node count }
}`;

function capacityPreview(section, blueprint, variables) {
  if (!blueprint.resources.length) return;
  const resource = h("select", { name: "resource" }, blueprint.resources.map((r) => option(r.key, r.key)));
  const strategy = h("select", { name: "strategy" }, option("", "none: each node's room"), ["AUTO", "FILL", "EACH", "GLOBAL", "DRAINED"].map((s) => option(s, s)));
  const result = h("div#capacity-bars", { "aria-live": "polite" });
  const slot = errorSlot();
  const go = h("button#capacity-calc.secondary", { type: "button" }, "Calculate");
  const calc = () =>
    busy(go, slot, async () => {
      const [key, s] = [resource.value, strategy.value || null];
      const plan = (await gql(CAPACITY, { id: blueprint.id, key, strategy: s, variables: variables() })).calculateCapacity;
      replace(result, note(s ? `Replicas of ${key} each node would get (${s}):` : `Room for ${key} on each node:`),
        plan.length ? bars(plan.map((p) => [p.node, p.count, { node: p.node }])) : empty("No provider node offers this resource's type."));
    });
  resource.onchange = () => {
    strategy.value = blueprint.resources.find((r) => r.key === resource.value).strategy;
    calc();
  };
  strategy.onchange = calc;
  go.onclick = calc;
  strategy.value = blueprint.resources[0].strategy;
  replace(section,
    h("h2", "Capacity preview"),
    h("p.hint", "Where a deploy would place a resource now, with these variables; nothing is allocated."),
    h("div.toolbar", field("Resource", resource), field("Strategy", strategy), go),
    slot,
    result);
}

const FIELDS = `id name projectId blueprintId elementId state health healthChangedAt phase onFailure error expiresAt createdAt updatedAt variables
  nodes { id key replica type node state outputs error updatedAt health healthReason healthChangedAt restarts drift provider { id name features } }
  revisions { number kind outcome createdBy createdAt }`;
const DEPLOYMENT = `query Deployment($id: ID!) { deployment(id: $id) { ${FIELDS} } }`;
const FIRST = `query Deployment($id: ID!) { deployment(id: $id) { ${FIELDS} resources { key type dependsOn } } }`;
const EVENTS = `subscription Events($id: ID!, $after: ID) { deploymentEvents(id: $id, after: $after) { id at kind nodeKey state message } }`;
const LOG_ROWS = 1000;

function local(iso) {
  if (!iso) return "";
  const t = new Date(iso);
  return new Date(t.getTime() - t.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

const PLAN = `id summary { create update replace destroy keep } notes
  changes { key replica action reason ripplesFrom createBeforeDestroy config { key before after known secret } }`;

// A plan's action in a state's colour.
const TONE = { CREATE: "complete", UPDATE: "pending", REPLACE: "suspended", DESTROY: "failed" };
// A credential's values are never shown (the server masks them too).
const shown = (v, c) => (c.secret ? "(secret)" : v == null ? "(not set)" : JSON.stringify(v));

/** A plan as a diff: what it does per replica (KEEP left out), its counts and notes. */
function planDiff(plan) {
  const rows = plan.changes.filter((c) => c.action !== "KEEP").map((c) =>
    h("li.change", { dataset: { action: c.action, key: `${c.key}[${c.replica}]` } },
      h("span", { class: `badge state-${TONE[c.action]}` }, c.action), " ", h("code", `${c.key}[${c.replica}]`), c.action === "REPLACE" && c.createBeforeDestroy && " · new one first",
      c.reason && h("p", c.reason), c.ripplesFrom.length > 0 && h("p.ripple", `Follows ${c.ripplesFrom.join(", ")}`),
      h("ul", c.config.map((k) => h("li", h("code", k.key), ": ", shown(k.before, k), " → ", k.known ? shown(k.after, k) : "(known after apply)")))));
  return h("div.plan", h("p", Object.entries(plan.summary).map(([w, n]) => h("span", { dataset: { count: w } }, h("strong", n), ` ${w} `))),
    rows.length ? h("ul.changes", rows) : empty("Nothing to change."), plan.notes.map((n) => h("p", n)));
}

const failure = (error, id) => (error ? h("div.error", { id, role: "alert" }, h("strong", "Error"), " ", error) : null);

export async function detail(view, { id }, scope) {
  let { deployment: d } = await gql(FIRST, { id });
  const { resources } = d;
  // A VIEWER reads, a DEPLOYER acts.
  const mayAct = allows(roleIn(d.projectId), "DEPLOYER");

  let state = badge(d.state);
  const destroy = h("button#destroy.danger", { type: "button" }, "Destroy…");
  const setState = (s) => {
    const next = Object.assign(badge(s), { id: "deployment-state" });
    state.replaceWith(next);
    state = next;
    destroy.hidden = s === "DESTROYED" || !mayAct;
  };
  const health = h("span#deployment-health");
  const setHealth = (x) => replace(health, "health ", badge(x));
  const confirm = typedConfirm(destroy, () => d.name, "destroy its resources", h("button#destroy-confirm.danger", "Destroy every resource"), async () => {
    await gql("mutation Destroy($id: ID!) { destroyDeployment(id: $id) { id } }", { id });
    confirm.hidden = true;
  });

  const summary = h("div#deployment-summary");
  const drawSummary = () => {
    setState(d.state);
    setHealth(d.health);
    replace(summary, failure(d.error, "deployment-error"), facts([
      ["Project", projectLink(d.projectId), "project"],
      ["Phase", h("span#deployment-phase", d.phase ? words(d.phase) : "settled")],
      ["From", origin(d, "its blueprint")],
      ["On failure", d.onFailure === "KEEP" ? "keep what was made" : "roll back"],
      ["Created", time(d.createdAt)],
      ["Lease", h("span#lease-now", d.expiresAt ? time(d.expiresAt) : "none")],
    ], { class: "facts inline" }));
  };

  const leaseAt = h("input#lease-input", { type: "datetime-local", value: local(d.expiresAt) });
  const leaseSlot = errorSlot();
  const extend = h("button#extend.secondary", { type: "button" }, "Extend lease");
  const unlease = h("button#remove-lease.link", { type: "button" }, "Remove lease");
  const setLease = (button, at) =>
    busy(button, leaseSlot, async () => {
      if (at === undefined) throw invalid("choose when the lease ends");
      const q = "mutation Extend($id: ID!, $at: DateTime) { extendDeployment(id: $id, expiresAt: $at) { expiresAt } }";
      d.expiresAt = (await gql(q, { id, at })).extendDeployment.expiresAt;
      drawSummary();
    });
  extend.onclick = () => setLease(extend, leaseAt.value ? new Date(leaseAt.value).toISOString() : undefined);
  unlease.onclick = () => setLease(unlease, null);

  // The graph fits its box until zoomed: buttons, + - 0 on the box, or Ctrl and the wheel; the box scrolls to pan.
  const dagBox = h("div#dag.dag", { tabindex: "0", "aria-label": "The graph: + and - zoom, 0 fits, arrows scroll" });
  let zoomed = null; // a scale, or null: fitted
  const zoom = (scale) => {
    zoomed = scale == null ? null : Math.min(3, Math.max(0.25, scale));
    dag?.zoom(zoomed);
  };
  const zoomBy = (factor) => zoom((zoomed ?? dag?.scale() ?? 1) * factor);
  dagBox.addEventListener("keydown", (event) => {
    const by = { "+": 1.25, "=": 1.25, "-": 0.8 }[event.key];
    if (by) zoomBy(by);
    else if (event.key === "0") zoom(null);
    else return;
    event.preventDefault();
  });
  dagBox.addEventListener("wheel", (event) => {
    if (!event.ctrlKey) return;
    event.preventDefault();
    zoomBy(event.deltaY < 0 ? 1.1 : 0.9);
  }, { passive: false });
  const dagTools = h("div.dag-tools", { role: "group", "aria-label": "Zoom" },
    h("button#dag-zoom-out.secondary", { type: "button", title: "Zoom out (-)", onclick: () => zoomBy(0.8) }, "−"),
    h("button#dag-fit.secondary", { type: "button", title: "Fit to the box (0)", onclick: () => zoom(null) }, "Fit"),
    h("button#dag-zoom-in.secondary", { type: "button", title: "Zoom in (+)", onclick: () => zoomBy(1.25) }, "+"));
  const panel = h("aside#node-panel.card", { "aria-live": "polite" });
  let selected = null;
  let dag = null;
  const runCommand = commandRunner(scope);
  let drawn = null; // what the panel shows: drawn again only when it changed
  // Label or key -> its nodes, made again once `d` is read again: an event finds its nodes without a walk over thousands.
  let named = new Map();
  const nodesNamed = (name) => {
    if (named.of !== d.nodes) {
      named = Object.assign(new Map(), { of: d.nodes });
      for (const n of d.nodes) {
        named.set(label(n), [n]);
        if (!named.has(n.key)) named.set(n.key, []);
        named.get(n.key).push(n);
      }
    }
    return named.get(name) ?? [];
  };
  const drawPanel = () => {
    const n = nodesNamed(selected).find((x) => label(x) === selected);
    const shows = JSON.stringify([selected, n ?? null, roleIn(d.projectId), n && logsRead.get(n.id)]);
    if (shows === drawn) return; // a click or a form in it is not lost to a redraw
    drawn = shows;
    if (!n) return replace(panel, note("Choose a node in the graph to see its state, outputs and error."));
    const focused = panel.contains(document.activeElement) ? document.activeElement : null; // kept if drawn again (a command's form)
    replace(panel,
      h("h2", label(n)),
      facts([
        ["State", badge(n.state)],
        ["Type", h("span.mono", n.type)],
        ["Provider", n.provider ? link(`/providers/${n.provider.id}`, n.provider.name) : "—"],
        ["Node", h("span.mono", n.node ?? "—"), "node"],
        ["Updated", time(n.updatedAt)],
      ]),
      failure(n.error),
      healthSection(n),
      powerControls(n),
      h("h3", "Outputs"),
      n.outputs && Object.keys(n.outputs).length ? json(n.outputs) : note("None yet."),
      logsSection(n),
      runCommand(n, roleIn(d.projectId)));
    if (focused?.isConnected) focused.focus();
  };

  // The new state comes as an event.
  const powerSlot = errorSlot({ id: "power-error" });
  const POWER = "mutation Power($id: ID!, $key: String!, $replica: Int!, $action: PowerAction!) { powerResource(deploymentId: $id, key: $key, replica: $replica, action: $action) { state } }";
  const powerControls = (n) => {
    if (!mayAct || !n.provider?.features?.includes("power") || !["COMPLETE", "SUSPENDED"].includes(n.state)) return null;
    const actions = n.state === "COMPLETE" ? [["STOP", "Stop"], ["PAUSE", "Pause"], ["RESTART", "Restart"]] : [["START", "Start"], ["RESUME", "Resume"]];
    const buttons = actions.map(([action, text]) => {
      const button = h(`button#power-${action.toLowerCase()}.secondary`, { type: "button" }, text);
      button.onclick = () =>
        busy(button, powerSlot, async () => {
          const { powerResource: r } = await gql(POWER, { id, key: n.key, replica: n.replica, action });
          n.state = r.state;
          drawPanel();
        });
      return button;
    });
    return h("div.power", h("h3", "Power"), h("div.actions", buttons), powerSlot);
  };

  // A restart is a run: its progress comes as events.
  const restartSlot = errorSlot();
  const RESTART = "mutation Restart($id: ID!, $k: String!, $r: Int!) { restartResource(deploymentId: $id, key: $k, replica: $r) { id } }";
  const healthSection = (n) => {
    const restart = mayAct && n.state === "COMPLETE" &&
      h("button#restart-node.secondary", { type: "button", onclick: () => busy(restart, restartSlot, () => gql(RESTART, { id, k: n.key, r: n.replica })) }, "Restart");
    return h("div#node-health", facts([
      ["Health", status(n.health, n.healthReason), "health"],
      ["Since", time(n.healthChangedAt)],
      ["Restarts", n.restarts, "restarts"],
      n.drift.length > 0 && ["Drift", n.drift.join(", "), "drift"],
    ]), restart, restartSlot);
  };

  const LOGS = "query NodeLogs($id: ID!) { resourceNode(id: $id) { logs(tail: 200) } }";
  const logsRead = new Map(); // node id → logs
  const logsSection = (n) => {
    if (!n.provider?.features?.includes("data") || !["COMPLETE", "SUSPENDED"].includes(n.state)) return null;
    const slot = errorSlot();
    const read = h("button#read-logs.secondary", { type: "button" }, "Show the last 200 lines");
    read.onclick = () =>
      busy(read, slot, async () => {
        const { resourceNode: r } = await gql(LOGS, { id: n.id });
        logsRead.set(n.id, r.logs || "(no output)");
        drawPanel(); // it may have been drawn again meanwhile
      });
    return h("div.logs", h("h3", "Logs"), read, slot, h("pre#node-logs.json", { hidden: !logsRead.has(n.id) }, logsRead.get(n.id)));
  };
  const drawGraph = () => {
    dag = drawDag(resources, d.nodes, (name) => {
      selected = name;
      dag.select(name);
      drawPanel();
    });
    replace(dagBox, dag.el);
    dag.zoom(zoomed);
    dag.select(selected);
    drawPanel();
  };

  const picks = h("div.picks");
  const drawPicks = () => {
    const was = checked(picks);
    const keys = new Set([...resources.map((r) => r.key), ...d.nodes.map((n) => n.key)]);
    replace(picks, [...keys].map((k) => h("label", h("input", { type: "checkbox", name: "redeploy", value: k, checked: was.includes(k) }), " ", k)));
  };
  const redeploySlot = errorSlot();
  const redeploy = h("button#redeploy", { type: "button" }, "Redeploy selected");
  redeploy.onclick = () =>
    busy(redeploy, redeploySlot, async () => {
      const keys = checked(picks);
      if (!keys.length) throw invalid("choose at least one resource to redeploy");
      await gql("mutation Redeploy($id: ID!, $keys: [String!]!) { redeployDeployment(id: $id, resourceKeys: $keys) { id } }", { id, keys });
      for (const box of picks.querySelectorAll("input:checked")) box.checked = false;
    });

  // Change: plan against new variables or YAML, read the diff, then apply it.
  const vars = jsonArea({ id: "change-variables" });
  vars.value = JSON.stringify(d.variables, null, 2);
  const yaml = jsonArea({ id: "change-source" });
  const planSlot = errorSlot({ id: "plan-error" });
  const applySlot = errorSlot({ id: "apply-error" });
  const planButton = h("button#plan", { type: "button" }, "Plan");
  const applyButton = h("button#apply-plan", { type: "button", hidden: true }, "Apply");
  const planBox = h("div#plan-diff", { "aria-live": "polite" });
  let planned = null;
  planButton.onclick = () =>
    busy(planButton, planSlot, async () => {
      const input = { deploymentId: id, variables: parseJson(vars.value, "variables"), blueprintSource: yaml.value.trim() || null };
      applyButton.hidden = true;
      applySlot.clear();
      replace(planBox);
      planned = (await gql(`mutation($input: PlanDeploymentInput!) { planDeployment(input: $input) { ${PLAN} } }`, { input })).planDeployment;
      replace(planBox, planDiff(planned));
      applyButton.hidden = false;
    });
  // The run is then followed from deploymentEvents, as a redeploy's.
  applyButton.onclick = () =>
    busy(applyButton, applySlot, async () => {
      await gql("mutation($id: ID!) { applyPlan(id: $id) { id } }", { id: planned.id });
      applyButton.hidden = true;
    });

  // Revisions, oldest first; each but the last may be rolled back to.
  const revisionBox = h("div#revisions");
  const rollbackSlot = errorSlot({ id: "rollback-error" });
  const rollbackBox = h("div#rollback-plan", { "aria-live": "polite" });
  let drawnRevisions = ""; // redrawn only when they change: a focused button stays
  const drawRevisions = () => {
    const seen = JSON.stringify(d.revisions);
    if (seen === drawnRevisions) return;
    drawnRevisions = seen;
    const back = (r) =>
      h("button.secondary", { type: "button", dataset: { rollback: r.number }, onclick: (e) =>
        busy(e.currentTarget, rollbackSlot, async () => {
          const q = `mutation($id: ID!, $r: Int!) { rollbackDeployment(id: $id, revision: $r) { plan { ${PLAN} } } }`;
          const { plan } = (await gql(q, { id, r: r.number })).rollbackDeployment;
          replace(rollbackBox, h("h3", `Back to revision ${r.number}`), planDiff(plan));
        }) }, "Roll back");
    replace(revisionBox, table(["#", "Kind", "Outcome", "By", "At", ""], d.revisions.map((r) =>
      h("tr", { dataset: { revision: r.number, kind: r.kind, outcome: r.outcome } },
        h("td", r.number), h("td", words(r.kind)), h("td", badge(r.outcome)),
        h("td", r.createdBy), h("td", time(r.createdAt)), h("td", mayAct && r.number < d.revisions.at(-1).number && back(r)))),
    { id: "revision-list" }));
  };

  // The last LOG_ROWS events, added in batches (a replay lays out once).
  const rows = h("tbody");
  const logBox = h("div.log-box", { tabindex: 0, "aria-label": "Event log" },
    table(["Time", "Kind", "Node", "State", "Message"], rows, { class: "list events", id: "event-log" }));
  const liveSlot = errorSlot();
  let queued = [];
  let flushing = null;
  const flush = () => {
    flushing = null;
    const bottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
    rows.append(...queued.splice(0).slice(-LOG_ROWS).map((e) =>
      h("tr", { dataset: { id: e.id, kind: e.kind, node: e.nodeKey ?? "", state: e.state ?? "" } },
        h("td", h("time", { datetime: e.at, title: e.at }, new Date(e.at).toLocaleTimeString())),
        h("td", words(e.kind)),
        h("td.mono", e.nodeKey),
        h("td", e.state ? badge(e.state) : null),
        h("td", e.message))));
    while (rows.rows.length > LOG_ROWS) rows.rows[0].remove();
    if (bottom) logBox.scrollTop = logBox.scrollHeight;
  };

  replace(view,
    h("div.toolbar", h("div.grow.title", h("h1", d.name), state, health), destroy),
    confirm,
    summary,
    h("div.dag-layout", h("div.dag-area", dagTools, dagBox), panel),
    mayAct && h("div.actions", h("section.card", h("h2", "Redeploy"),
        h("p.hint", "Destroys and deploys again the chosen resources and what depends on them."), picks, redeploy, redeploySlot),
      h("section.card.lease", h("h2", "Lease"), h("div.toolbar", field("Destroy at", leaseAt), extend, unlease), leaseSlot),
      h("section#change.card", h("h2", "Change"),
        field("Variables (JSON)", vars), field("Blueprint (YAML; empty: as stored now)", yaml), planButton, planSlot, planBox, applyButton, applySlot)),
    h("section#revisions-section.card", h("h2", "Revisions"), revisionBox, rollbackSlot, rollbackBox),
    h("h2", "Events"),
    liveSlot,
    logBox,
  );
  drawSummary();
  drawGraph();
  drawPicks();
  drawRevisions();

  // An event older than what was read does not apply (a replay); one during a read is kept.
  const latest = new Map(); // label, key or "" (the deployment) -> newest event
  const fresh = (e, since) => e && Date.parse(e.at) >= Date.parse(since);
  const nodeState = (n) => {
    const e = [latest.get(label(n)), latest.get(n.key)].filter((x) => fresh(x, n.updatedAt)).sort((a, b) => b.id - a.id)[0];
    return e?.state ?? n.state;
  };
  const deploymentState = () => (fresh(latest.get(""), d.updatedAt) ? latest.get("").state : d.state);
  // A node's (or the deployment's) health: its colour now, the rest read again (a replay's burst once).
  const onHealth = (e) => {
    const x = e.nodeKey ? nodesNamed(e.nodeKey).find((n) => label(n) === e.nodeKey) : d;
    if (x && fresh(e, x.healthChangedAt)) {
      x.health = e.state;
      if (x === d) setHealth(e.state);
      else dag.set(e.nodeKey, x.state, e.state);
    }
    refetch();
  };

  let reading = false;
  let again = false;
  const refetch = later(scope, 100, read);
  async function read() {
    if (reading) return void (again = true);
    reading = true;
    try {
      const next = (await gql(DEPLOYMENT, { id })).deployment;
      if (!scope.alive) return;
      const drawn = d.nodes.map(label).join();
      d = next;
      d.state = deploymentState();
      for (const n of d.nodes) n.state = nodeState(n);
      drawSummary();
      drawRevisions();
      if (d.nodes.map(label).join() !== drawn) {
        drawGraph();
        drawPicks();
      } else {
        for (const n of d.nodes) dag.set(label(n), n.state, n.health);
        drawPanel();
      }
    } catch (error) {
      if (scope.alive) liveSlot.show(error);
    } finally {
      reading = false;
      if (again && scope.alive) refetch();
      again = false;
    }
  }

  let lastId = 0;
  const askedFor = new Set(); // keys not drawn, read again for
  // Sent again as they are when the socket reopens (a replica failing over):
  // the history is then resumed after the last event seen, not replayed.
  const resume = { id };
  scope.subscribe(EVENTS, resume, {
    next: ({ deploymentEvents: e }) => {
      if (Number(e.id) <= lastId) return;
      lastId = Number(e.id);
      resume.after = e.id;
      liveSlot.clear();
      queued.push(e);
      flushing ??= setTimeout(flush, 30);
      if (e.kind === "HEALTH") return onHealth(e);
      if (e.kind === "STATE") {
        if (!fresh(e, d.updatedAt)) return; // what was read has it already
        if (e.state) latest.set("", e);
        setState((d.state = deploymentState()));
        return refetch();
      }
      if (e.kind !== "NODE" || !e.nodeKey || !e.state) return;
      latest.set(e.nodeKey, e);
      const mine = nodesNamed(e.nodeKey);
      for (const n of mine) dag.set(label(n), (n.state = nodeState(n)));
      if (!mine.length) {
        if (!askedFor.has(e.nodeKey)) refetch();
        askedFor.add(e.nodeKey);
      } else if ((e.state === "COMPLETE" || e.state === "FAILED") && mine.some((n) => fresh(e, n.updatedAt))) {
        refetch(); // its outputs or error
      }
      if (mine.some((n) => label(n) === selected)) drawPanel();
    },
    error: (error) => liveSlot.show(error),
    reconnecting: () => liveSlot.show({ code: "RECONNECTING", message: "the live connection dropped; reconnecting…" }),
  });
  scope.onDispose(() => clearTimeout(flushing));
}
