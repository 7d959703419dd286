import { errorBox, h, replace, table } from "./dom.js";
import { del, get, post, session } from "./api.js";

const PERMISSIONS = ["Lookup", "Produce", "Consume", "ManageNamespace", "ManageTopic", "ManageSchema", "ManageBroker", "ManageCluster"];

export async function show(main) {
  if (!session.security) return replace(main, h("h1", {}, "Security"), h("p", { "data-test": "security-off" }, "Security is off on this broker: no roles or bindings apply."));
  let data;
  try { data = await get("/api/security"); } catch (e) { return replace(main, h("h1", {}, "Security"), errorBox(e)); }
  const message = h("div", {});
  const principal = h("input", { placeholder: "principal", "data-test": "bind-principal" });
  const role = h("select", { "data-test": "bind-role" }, data.roles.map(r => h("option", { value: r.name }, r.name)));
  const scope = h("input", { placeholder: "cluster, /ns or /ns/topic", value: "cluster", "data-test": "bind-scope" });
  const bind = h("form", { class: "toolbar", onsubmit: async e => {
    e.preventDefault();
    try { await post("/api/security/bindings", { principal: principal.value, role: role.value, scope: scope.value }); window.dispatchEvent(new Event("danube-render")); } catch (err) { replace(message, errorBox(err)); }
  } }, "Bind", principal, role, scope, h("button", { type: "submit", class: "primary", "data-test": "bind" }, "Bind"));
  const roleName = h("input", { placeholder: "role name", "data-test": "role-name" });
  const checks = PERMISSIONS.map(p => h("input", { type: "checkbox", value: p, "aria-label": p }));
  const putRole = h("form", { class: "toolbar", onsubmit: async e => {
    e.preventDefault();
    const permissions = checks.filter(c => c.checked).map(c => c.value);
    try { await post("/api/security/roles", { name: roleName.value, permissions }); window.dispatchEvent(new Event("danube-render")); } catch (err) { replace(message, errorBox(err)); }
  } }, "Role", roleName, PERMISSIONS.map((p, i) => h("label", {}, checks[i], p)), h("button", { type: "submit", class: "primary", "data-test": "put-role" }, "Save role"));
  replace(main, h("h1", {}, "Security"), message,
    h("h2", {}, "Roles"), putRole, table([{ title: "Role", cell: r => r.name }, { title: "Permissions", cell: r => r.permissions.join(", ") },
      { title: "", cell: r => h("button", { class: "danger", onclick: async () => {
        if (!window.confirm(`Delete role ${r.name}?`)) return;
        try { await del("/api/security/roles", { name: r.name }); window.dispatchEvent(new Event("danube-render")); } catch (err) { replace(message, errorBox(err)); }
      } }, "Delete") }], data.roles, { "data-test": "roles" }),
    h("h2", {}, "Bindings"), bind, table([
      { title: "Principal", cell: b => b.principal }, { title: "Role", cell: b => b.role }, { title: "Scope", cell: b => b.scope },
      { title: "", cell: b => h("button", { class: "danger", onclick: async () => {
        if (!window.confirm(`Remove ${b.role} from ${b.principal} on ${b.scope}?`)) return;
        try { await del("/api/security/bindings", b); window.dispatchEvent(new Event("danube-render")); } catch (err) { replace(message, errorBox(err)); }
      } }, "Unbind") },
    ], data.bindings, { "data-test": "bindings" }));
}
