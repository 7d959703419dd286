import { bytes, errorBox, h, number, replace, table } from "./dom.js";
import { del, get, post } from "./api.js";
import { lineChart } from "./chart.js";

const REFRESH_MS = 5000;
let timer = null;

export function stop() { clearTimeout(timer); timer = null; }

function section(title, data, build) {
  return [h("h2", {}, title), data && data.error ? errorBox(data.error) : build(data)];
}

export async function show(main) {
  const data = await get("/api/overview");
  const figures = data.figures && !data.figures.error ? data.figures : null;
  const t = figures ? figures.totals : {};
  const points = figures ? figures.history : [];
  const missing = figures ? Object.entries(figures.missing) : [];
  const brokerRows = Array.isArray(data.brokers) ? data.brokers : [];
  const balance = data.balance && !data.balance.error ? data.balance : {};
  replace(main,
    h("h1", {}, "Overview"),
    h("div", { class: "cards" },
      card("Brokers", Array.isArray(data.brokers) ? data.brokers.length : "—"),
      card("Namespaces", Array.isArray(data.namespaces) ? data.namespaces.length : "—"),
      card("Messages in", number(t.messages_in)), card("Bytes in", bytes(t.bytes_in)),
      card("Messages out", number(t.messages_out)), card("Bytes out", bytes(t.bytes_out))),
    h("h2", {}, figures ? `Last hour, every broker (every ${figures.period_s} s)` : "Last hour"),
    missing.map(([id, why]) => h("div", { class: "error", "data-test": "missing-broker" }, `Broker ${id} did not answer: ${why}`)),
    figures ? h("div", { class: "charts" },
      lineChart("messages / s", points, [{ key: "messages_in", cls: "in", label: "in" }, { key: "messages_out", cls: "out", label: "out" }], v => number(v, 1)),
      lineChart("bytes / s", points, [{ key: "bytes_in", cls: "in", label: "in" }, { key: "bytes_out", cls: "out", label: "out" }], bytes))
      : errorBox(data.figures.error),
    section("Brokers", data.brokers, () => table([
      { title: "Id", cell: b => b.id }, { title: "Address", cell: b => b.addr }, { title: "Admin", cell: b => b.admin_addr },
      { title: "Status", cell: b => b.status }, { title: "Role", cell: b => b.id === data.leader ? "leader" : b.role },
      { title: "Topics", num: true, cell: b => balance[b.id] ? balance[b.id].topics : "—" },
      { title: "Load", num: true, cell: b => balance[b.id] ? number(balance[b.id].load, 2) : "—" },
    ], brokerRows, { "data-test": "brokers" })),
    section("Namespaces", data.namespaces, ns => namespaces(ns)));
  const refresh = () => {
    if (!(location.hash === "" || location.hash.startsWith("#/overview"))) return;
    // Not under a person typing: the redraw would drop what they typed.
    const typing = [...main.querySelectorAll("input")].some(i => i.value || i === document.activeElement);
    if (typing) timer = setTimeout(refresh, REFRESH_MS);
    else window.dispatchEvent(new Event("danube-render"));
  };
  timer = setTimeout(refresh, REFRESH_MS);
}

function namespaces(names) {
  const message = h("div", {});
  const name = h("input", { placeholder: "namespace", "data-test": "new-namespace" });
  const change = async (call, done) => {
    try { await call(); window.dispatchEvent(new Event("danube-render")); } catch (e) { replace(message, errorBox(e)); }
  };
  return h("div", {}, message,
    h("form", { class: "toolbar", onsubmit: e => { e.preventDefault(); change(() => post("/api/namespaces", { name: name.value.trim() })); } },
      name, h("button", { type: "submit", "data-test": "create-namespace" }, "Create namespace")),
    h("ul", { "data-test": "namespaces" }, names.map(n => h("li", {}, n, " ",
      h("button", { type: "button", class: "danger", "data-test": "delete-namespace", onclick: () => {
        if (window.confirm(`Delete namespace ${n}? The broker refuses while it holds topics.`)) change(() => del("/api/namespaces", { name: n }));
      } }, "Delete")))));
}

function card(label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}
