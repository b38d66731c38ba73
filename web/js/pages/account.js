// The signed-in user's account: password and API tokens (a token's secret
// is shown once, when it is made).

import { gql } from "../api.js";
import { me } from "../app.js";
import { busy, empty, errorBox, errorSlot, field, h, replace, time } from "../dom.js";

const TOKENS = `query Tokens { me { id username role hasPassword createdAt
  apiTokens(first: 100) { nodes { id name kind createdAt expiresAt lastUsedAt } } } }`;

export async function render(view, _params, scope) {
  const facts = h("dl", { class: "facts" });
  const tokens = h("div", { id: "tokens" });
  view.append(
    h("h1", {}, "Account"),
    h("section", { class: "card" }, facts),
    passwordForm(),
    h("section", { class: "card" }, h("h2", {}, "API tokens"), h("p", { class: "hint" }, "For scripts and CI: send ", h("code", {}, "Authorization: Bearer <token>"), ". A token's secret is shown once, when it is made."), newTokenForm(load), tokens),
  );

  async function load() {
    try {
      const data = await gql(TOKENS);
      if (!scope.alive) return;
      const user = data.me;
      replace(
        facts,
        h("dt", {}, "Username"), h("dd", {}, user.username),
        h("dt", {}, "Role"), h("dd", {}, user.role),
        h("dt", {}, "Since"), h("dd", {}, time(user.createdAt)),
      );
      drawTokens(tokens, user.apiTokens.nodes, load);
    } catch (error) {
      if (scope.alive) replace(tokens, errorBox(error));
    }
  }
  await load();
}

function passwordForm() {
  const current = h("input", { name: "current-password", type: "password", autocomplete: "current-password", required: me?.hasPassword ?? true });
  const next = h("input", { name: "new-password", type: "password", autocomplete: "new-password", required: true, minlength: 8 });
  const slot = errorSlot();
  const done = h("p", { class: "notice", hidden: true, role: "status" }, "Password changed.");
  const submit = h("button", { type: "submit" }, "Change password");
  return h(
    "form",
    {
      id: "change-password",
      class: "card",
      onsubmit: async (event) => {
        event.preventDefault();
        done.hidden = true;
        const ok = await busy(submit, slot, () =>
          gql("mutation P($n: String!, $c: String) { setPassword(newPassword: $n, currentPassword: $c) }", {
            n: next.value,
            c: current.value || null,
          }),
        );
        if (ok) {
          done.hidden = false;
          current.value = "";
          next.value = "";
        }
      },
    },
    h("h2", {}, "Password"),
    field("Current password", current),
    field("New password", next, "At least 8 characters."),
    slot,
    done,
    submit,
  );
}

function newTokenForm(reload) {
  const name = h("input", { name: "token-name", required: true, maxlength: 128, placeholder: "ci" });
  const slot = errorSlot();
  const shown = h("div", { id: "new-token", "aria-live": "polite" });
  const submit = h("button", { type: "submit" }, "Create token");
  return h(
    "form",
    {
      id: "create-token",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(shown);
        const data = await busy(submit, slot, () =>
          gql("mutation T($n: String!) { createApiToken(name: $n) { token apiToken { id name } } }", { n: name.value }),
        );
        if (!data) return;
        name.value = "";
        replace(
          shown,
          h(
            "div",
            { class: "notice" },
            "Token ", h("strong", {}, data.createApiToken.apiToken.name), " made. Copy it now: it is not shown again.",
            h("p", {}, h("code", { class: "secret", id: "token-secret" }, data.createApiToken.token)),
          ),
        );
        await reload();
      },
    },
    h("div", { class: "toolbar" }, field("Name", name), submit),
    slot,
    shown,
  );
}

function drawTokens(el, list, reload) {
  if (!list.length) {
    replace(el, empty("No tokens yet. Create one above for a script or CI job."));
    return;
  }
  replace(
    el,
    h(
      "table",
      { class: "list" },
      h("thead", {}, h("tr", {}, ["Name", "Kind", "Created", "Expires", "Last used", ""].map((t) => h("th", {}, t)))),
      h(
        "tbody",
        {},
        list.map((t) => {
          const slot = errorSlot();
          const revoke = h("button", { type: "button", class: "secondary", dataset: { revoke: t.name } }, "Revoke");
          revoke.addEventListener("click", async () => {
            if (!confirm(`Revoke the token “${t.name}”? Whatever uses it stops working at once.`)) return;
            const ok = await busy(revoke, slot, () => gql("mutation R($id: ID!) { revokeApiToken(id: $id) }", { id: t.id }));
            if (ok) await reload();
          });
          return h(
            "tr",
            { dataset: { token: t.name } },
            h("td", {}, t.name),
            h("td", {}, t.kind),
            h("td", {}, time(t.createdAt)),
            h("td", {}, time(t.expiresAt)),
            h("td", {}, time(t.lastUsedAt)),
            h("td", {}, t.kind === "API" ? revoke : null, slot),
          );
        }),
      ),
    ),
  );
}
