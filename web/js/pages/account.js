// The signed-in user's account: password and API tokens (a token's secret
// is shown once, when it is made).

import { gql } from "../api.js";
import { me } from "../app.js";
import { busy, code, empty, errorSlot, facts, field, fill, h, replace, sending, shownOnce, table, time } from "../dom.js";

const TOKENS = `query Tokens { me { id username role hasPassword createdAt
  apiTokens(first: 100) { nodes { id name kind createdAt expiresAt lastUsedAt } } } }`;

export async function render(view, _params, scope) {
  const about = h("section.card");
  const tokens = h("div#tokens");
  view.append(
    h("h1", "Account"),
    about,
    passwordForm(),
    h("section.card", h("h2", "API tokens"),
      h("p.hint", "For scripts and CI: send ", code("Authorization: Bearer <token>"), ". A token's secret is shown once, when it is made."),
      newTokenForm(load), tokens),
  );
  async function load() {
    await fill(tokens, scope, async () => {
      const { me: user } = await gql(TOKENS);
      replace(about, facts([["Username", user.username], ["Role", user.role], ["Since", time(user.createdAt)]]));
      return tokenTable(user.apiTokens.nodes, load);
    });
  }
  await load();
}

function passwordForm() {
  const current = h("input", { name: "current-password", type: "password", autocomplete: "current-password", required: me?.hasPassword ?? true });
  const next = h("input", { name: "new-password", type: "password", autocomplete: "new-password", required: true, minlength: 8 });
  const slot = errorSlot();
  const done = h("p.notice", { hidden: true, role: "status" }, "Password changed.");
  const submit = h("button", { type: "submit" }, "Change password");
  const q = "mutation P($n: String!, $c: String) { setPassword(newPassword: $n, currentPassword: $c) }";
  const change = () => {
    done.hidden = true;
    return gql(q, { n: next.value, c: current.value || null });
  };
  const onsubmit = sending(submit, slot, change, () => {
    done.hidden = false;
    current.value = next.value = "";
  });
  return h("form#change-password.card", { onsubmit },
    h("h2", "Password"), field("Current password", current), field("New password", next, "At least 8 characters."), slot, done, submit);
}

function newTokenForm(reload) {
  const name = h("input", { name: "token-name", required: true, maxlength: 128, placeholder: "ci" });
  const slot = errorSlot();
  const shown = h("div#new-token", { "aria-live": "polite" });
  const submit = h("button", { type: "submit" }, "Create token");
  const q = "mutation T($n: String!) { createApiToken(name: $n) { token apiToken { id name } } }";
  const make = () => {
    replace(shown);
    return gql(q, { n: name.value });
  };
  const onsubmit = sending(submit, slot, make, async ({ createApiToken: made }) => {
    name.value = "";
    replace(shown, shownOnce(`Token “${made.apiToken.name}” made: copy it now, it is not shown again`, made.token, "token-secret"));
    await reload();
  });
  return h("form#create-token", { onsubmit }, h("div.toolbar", field("Name", name), submit), slot, shown);
}

function tokenTable(list, reload) {
  if (!list.length) return empty("No tokens yet. Create one above for a script or CI job.");
  const row = (t) => {
    const slot = errorSlot();
    const revoke = h("button.secondary", { type: "button", dataset: { revoke: t.name } }, "Revoke");
    revoke.onclick = async () => {
      if (!confirm(`Revoke the token “${t.name}”? Whatever uses it stops working at once.`)) return;
      if (await busy(revoke, slot, () => gql("mutation R($id: ID!) { revokeApiToken(id: $id) }", { id: t.id }))) await reload();
    };
    return h("tr", { dataset: { token: t.name } },
      h("td", t.name), h("td", t.kind), h("td", time(t.createdAt)), h("td", time(t.expiresAt)), h("td", time(t.lastUsedAt)),
      h("td", t.kind === "API" ? revoke : null, slot));
  };
  return table(["Name", "Kind", "Created", "Expires", "Last used", ""], list.map(row));
}
