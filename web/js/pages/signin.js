// Sign-in: username and password (the session is an HttpOnly cookie), and,
// on a first start, setting the admin's password with the token printed then.

import { gql } from "../api.js";
import { signedIn } from "../app.js";
import { busy, errorSlot, field, h } from "../dom.js";

const LOGIN = `mutation Login($username: String!, $password: String!) {
  login(username: $username, password: $password) { user { id username } }
}`;

export async function render(view, { query }) {
  const next = query.get("next") ?? "/";
  const username = h("input", { name: "username", autocomplete: "username", required: true, autofocus: true });
  const password = h("input", { name: "password", type: "password", autocomplete: "current-password", required: true });
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    {
      id: "sign-in",
      class: "card narrow",
      onsubmit: async (event) => {
        event.preventDefault();
        const ok = await busy(submit, slot, () =>
          gql(LOGIN, { username: username.value, password: password.value }),
        );
        if (ok) await signedIn(next);
      },
    },
    h("h1", {}, "Sign in to Corbel"),
    field("Username", username),
    field("Password", password),
    slot,
    submit,
  );

  // First start: the admin has no password yet, only the token Corbel printed.
  const token = h("input", { name: "token", type: "password", autocomplete: "off", required: true });
  const firstUser = h("input", { name: "admin", value: "admin", autocomplete: "username", required: true });
  const newPassword = h("input", { name: "new-password", type: "password", autocomplete: "new-password", required: true, minlength: 8 });
  const firstSlot = errorSlot();
  const setIt = h("button", { type: "submit" }, "Set password and sign in");
  const first = h(
    "details",
    { class: "card narrow" },
    h("summary", {}, "First start: set the admin password"),
    h(
      "form",
      {
        id: "first-start",
        onsubmit: async (event) => {
          event.preventDefault();
          const ok = await busy(setIt, firstSlot, async () => {
            await gql(
              "mutation First($p: String!) { setPassword(newPassword: $p) }",
              { p: newPassword.value },
              { Authorization: `Bearer ${token.value.trim()}` },
            );
            return gql(LOGIN, { username: firstUser.value, password: newPassword.value });
          });
          if (ok) await signedIn(next);
        },
      },
      h("p", { class: "hint" }, "Corbel printed an admin token on its first start (or set ", h("code", {}, "CORBEL_ADMIN_TOKEN"), "). It is used here once and not kept."),
      field("Admin token", token),
      field("Username", firstUser),
      field("New password", newPassword, "At least 8 characters."),
      firstSlot,
      setIt,
    ),
  );
  view.append(form, first);
}
