// Users, for server admins.

import { gql } from "../api.js";
import { isAdmin, navigate } from "../app.js";
import { busy, errorSlot, facts, failed, field, fill, h, link, muted, replace, sending, table, time, typedConfirm } from "../dom.js";

const FIELDS = "id username role disabled hasPassword createdAt memberships { role project { id name } }";
const roles = (now) => h("select", { name: "role" }, ["USER", "ADMIN"].map((r) => h("option", { value: r, selected: r === now }, r)));
export const memberships = (list) => (list.length ? list.map((m, i) => [i ? ", " : "", link(`/projects/${m.project.id}`, m.project.name), muted(` ${m.role}`)]) : muted("none"));

export async function list(view, _params, scope) {
  const body = h("div#user-list");
  view.append(h("div.toolbar", h("h1.grow", "Users"), isAdmin() && h("a#new-user.button", { href: "/users/new" }, "New user")), body);
  await fill(body, scope, async () => {
    const { users } = await gql(`query Users { users { ${FIELDS} } }`);
    const row = (u) => h("tr", { dataset: { username: u.username } }, h("td", link(`/users/${u.id}`, u.username)), h("td", u.role),
      h("td", { dataset: { label: "Disabled" } }, u.disabled ? "disabled" : "no"), h("td", { dataset: { label: "Projects" } }, memberships(u.memberships)));
    return table(["Username", "Role", "Disabled", "Projects"], users.map(row), { id: "users" });
  });
}

export function create(view) {
  const username = h("input", { name: "username", required: true, autocomplete: "off", autofocus: true });
  const password = h("input", { name: "password", type: "password", required: true, minlength: 8, autocomplete: "new-password" });
  const role = roles("USER");
  const slot = errorSlot();
  const submit = h("button", { type: "submit" }, "Create user");
  const make = () => gql(`mutation CreateUser($i: CreateUserInput!) { createUser(input: $i) { id } }`, { i: { username: username.value.trim(), password: password.value, role: role.value } });
  view.append(h("h1", "New user"), h("form#user-form.card.form", { onsubmit: sending(submit, slot, make, (d) => navigate(`/users/${d.createUser.id}`)) },
    field("Username", username), field("Password", password, "At least 8 characters."), field("Server role", role),
    slot, h("div.toolbar", submit, link("/users", "Cancel"))));
}

export async function detail(view, { id }, scope) {
  let u;
  try {
    u = (await gql(`query User($id: ID!) { user(id: $id) { ${FIELDS} } }`, { id })).user;
  } catch (error) {
    return failed(view, "User", error, "/users", "All users");
  }
  if (!scope.alive) return;
  const about = h("div#user-facts");
  const slot = errorSlot({ id: "user-error" });
  const toggle = h("button#toggle-disabled.secondary", { type: "button" });
  const role = roles(u.role);
  const setRole = h("button#set-role.secondary", { type: "submit" }, "Change role");
  const change = (name, arg, type, v) => gql(`mutation($id: ID!, $v: ${type}) { r: ${name}(id: $id, ${arg}: $v) { ${FIELDS} } }`, { id, v }).then((d) => d.r);
  const draw = (next) => {
    u = next;
    toggle.textContent = u.disabled ? "Enable" : "Disable";
    replace(about, facts([["Role", u.role, "role"], ["Status", u.disabled ? "disabled: cannot sign in" : "enabled", "disabled"],
      ["Password", u.hasPassword ? "set" : "none yet"], ["Created", time(u.createdAt)], ["Projects", memberships(u.memberships), "memberships"]]));
  };
  toggle.onclick = () => busy(toggle, slot, async () => draw(await change("setUserDisabled", "disabled", "Boolean!", !u.disabled)));
  const onsubmit = sending(setRole, slot, () => change("setUserRole", "role", "Role!", role.value), draw);
  const del = h("button#delete-user.danger", { type: "button" }, "Delete…");
  draw(u);
  view.append(h("h1", u.username), h("p", link("/users", "← All users")), h("section.card", about),
    h("section.card", h("h2", "Change"), h("div.toolbar", toggle, h("form#user-role.toolbar", { onsubmit }, field("Server role", role), setRole)), slot),
    h("section#danger", del, typedConfirm(del, () => u.username, "delete the user with their tokens and memberships", h("button#delete-user-confirm.danger", "Delete user"), async () => {
      await gql("mutation($id: ID!) { deleteUser(id: $id) }", { id });
      navigate("/users");
    })));
}
