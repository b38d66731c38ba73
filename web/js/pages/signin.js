// Sign-in: username and password (the session is an HttpOnly cookie), and,
// on a first start, setting the admin's password with the token printed then.

import { gql } from "../api.js";
import { signedIn } from "../app.js";
import { code, errorSlot, field, h, sending } from "../dom.js";

const LOGIN = `mutation Login($username: String!, $password: String!) {
  login(username: $username, password: $password) { user { id username } }
}`;

export async function render(view, { query }) {
  const next = query.get("next") ?? "/";
  const input = (name, attrs) => h("input", { name, required: true, ...attrs });
  const username = input("username", { autocomplete: "username", autofocus: true });
  const password = input("password", { type: "password", autocomplete: "current-password" });
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Sign in");
  const login = () => gql(LOGIN, { username: username.value, password: password.value });
  const form = h("form#sign-in.card.narrow", { onsubmit: sending(submit, slot, login, () => signedIn(next)) },
    h("h1", "Sign in to Corbel"), field("Username", username), field("Password", password), slot, submit);

  // First start: the admin has no password yet, only the token Corbel printed.
  const token = input("token", { type: "password", autocomplete: "off" });
  const firstUser = input("admin", { value: "admin", autocomplete: "username" });
  const newPassword = input("new-password", { type: "password", autocomplete: "new-password", minlength: 8 });
  const firstSlot = errorSlot();
  const setIt = h("button", { type: "submit" }, "Set password and sign in");
  const setPassword = async () => {
    const headers = { Authorization: `Bearer ${token.value.trim()}` };
    await gql("mutation First($p: String!) { setPassword(newPassword: $p) }", { p: newPassword.value }, headers);
    return gql(LOGIN, { username: firstUser.value, password: newPassword.value });
  };
  const first = h("details.card.narrow", h("summary", "First start: set the admin password"),
    h("form#first-start", { onsubmit: sending(setIt, firstSlot, setPassword, () => signedIn(next)) },
      h("p.hint", "Corbel printed an admin token on its first start (or set ", code("CORBEL_ADMIN_TOKEN"), "). It is used here once and not kept."),
      field("Admin token", token),
      field("Username", firstUser),
      field("New password", newPassword, "At least 8 characters."),
      firstSlot,
      setIt));
  view.append(form, first);
}
