import { errorBox, h, number, replace, route, table } from "./dom.js";
import { del, get, post } from "./api.js";

export async function show(main, params) {
  const data = await get("/api/topic", { name: params.name });
  const message = h("div", {});
  const act = async (what, call) => {
    try {
      const answer = await call();
      replace(message, h("div", { class: "notice", "data-test": "notice" }, what(answer)));
      setTimeout(() => window.dispatchEvent(new Event("danube-render")), 600);
    } catch (e) { replace(message, errorBox(e)); }
  };
  const subs = data.subscriptions;
  const subRows = Array.isArray(subs) ? subs : [];
  const seekBox = sub => {
    const kind = h("select", {}, ["offset", "time", "earliest", "latest", "shift"].map(k => h("option", { value: k }, k)));
    const value = h("input", { placeholder: "offset, ISO time or shift", "data-test": "seek-value" });
    return h("form", { class: "toolbar", onsubmit: e => {
      e.preventDefault();
      let to;
      if (kind.value === "earliest" || kind.value === "latest") to = { [kind.value]: true };
      else if (kind.value === "time") to = { time_ms: Date.parse(value.value) };
      else to = { [kind.value]: Number.parseInt(value.value, 10) };
      act(a => `Moved ${sub.name}: ${a.positions.map(p => `${p.stored_topic} ${p.from_offset} → ${p.to_offset}`).join(", ")}`,
        () => post("/api/subscriptions/seek", { topic: data.name, subscription: sub.name, to }));
    } }, kind, value, h("button", { type: "submit", "data-test": "seek" }, "Seek"),
      h("button", { type: "button", "data-test": "skip", onclick: () => {
        const count = Number.parseInt(value.value, 10);
        act(a => `Skipped ${a.positions.reduce((n, p) => n + p.records, 0)} records`, () => post("/api/subscriptions/skip", { topic: data.name, subscription: sub.name, count }));
      } }, "Skip N"),
      h("button", { type: "button", "data-test": "skip-all", onclick: () => {
        if (window.confirm(`Skip everything ${sub.name} has not acknowledged?`)) {
          act(a => `Skipped ${a.positions.reduce((n, p) => n + p.records, 0)} records`, () => post("/api/subscriptions/skip", { topic: data.name, subscription: sub.name, all: true }));
        }
      } }, "Skip all"),
      h("button", { type: "button", class: "danger", "data-test": "delete-subscription", onclick: () => {
        if (window.confirm(`Delete subscription ${sub.name}?`)) act(() => `Deleted ${sub.name}`, () => del("/api/subscriptions", { topic: data.name, subscription: sub.name }));
      } }, "Delete"));
  };
  const policy = data.policy;
  replace(main,
    h("h1", {}, data.name),
    h("div", { class: "toolbar" }, h("a", { href: route("browse", { topic: data.name }), "data-test": "browse-link" }, "Browse messages")),
    message,
    h("h2", {}, "Partitions"),
    table([
      { title: "Stored topic", cell: p => p.name }, { title: "Owner", cell: p => p.broker_id },
      { title: "Delivery", cell: p => p.delivery },
      { title: "Offsets", cell: p => p.start_offset === null ? "on its owner" : `${p.start_offset} … ${p.end_offset}` },
      { title: "Producers", cell: p => p.producers === null ? "on its owner" : (p.producers.join(", ") || "none") },
      { title: "Schema", cell: p => p.error ? errorBox(p.error) : (p.schema_subject ? h("a", { href: route("schema", { subject: p.schema_subject }) }, `${p.schema_subject} (${p.schema_type} v${p.schema_version}, ${p.compatibility})`) : "none") },
      { title: "", cell: p => h("button", { type: "button", "data-test": "unload", onclick: () => {
        if (window.confirm(`Move ${p.name} off broker ${p.broker_id}? Its clients reconnect to the broker it lands on.`)) {
          act(() => `Unloaded ${p.name} from broker ${p.broker_id}`, () => post("/api/topics/unload", { name: p.name }));
        }
      } }, "Move") },
    ], data.partitions, { "data-test": "partitions" }),
    h("h2", {}, "Subscriptions"),
    subs && subs.error ? errorBox(subs.error) : table([
      { title: "Name", cell: s => s.name }, { title: "Stored topic", cell: s => s.stored_topic }, { title: "Type", cell: s => s.type },
      { title: "Consumers", cell: s => s.consumers.map(c => `${c.name}${c.active ? "" : " (idle)"}`).join(", ") || "none" },
      { title: "Position", num: true, cell: s => number(s.position) }, { title: "Lag", num: true, cell: s => number(s.backlog) },
      { title: "Unacked", num: true, cell: s => number(s.unacked) }, { title: "Delayed", num: true, cell: s => number(s.delayed) },
      { title: "Operations", cell: seekBox },
    ], subRows, { "data-test": "subscriptions" }),
    h("h2", {}, "Policy"),
    policy && policy.error ? errorBox(policy.error) : h("div", {},
      h("p", { class: "muted" }, policy.own ? "The topic's own policy" : "Inherited from its namespace"),
      h("pre", { "data-test": "policy" }, JSON.stringify(policy.policy, null, 2))),
    h("h2", {}, "Table"),
    data.table === null ? h("p", { class: "muted" }, "No table (tableMode none)") :
      data.table.error ? errorBox(data.table.error) : table([
        { title: "Stored topic", cell: t => t.stored_topic }, { title: "Mode", cell: t => t.mode }, { title: "Table", cell: t => t.table },
        { title: "Committed", num: true, cell: t => number(t.committed_offset) }, { title: "Lag ms", num: true, cell: t => number(t.lag_ms) },
        { title: "Files", num: true, cell: t => number(t.files) }, { title: "Partitioning", cell: t => t.partitioning },
        { title: "Error", cell: t => t.error || (t.stopped ? "stopped" : "") },
      ], data.table, { "data-test": "table" }));
}
