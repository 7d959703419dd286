import { bytes, errorBox, h, number, replace, route, table } from "./dom.js";
import { del, get, post } from "./api.js";

const PAGE_ROWS = 100;

export async function show(main, params) {
  const data = await get("/api/topics");
  const search = h("input", { type: "search", placeholder: "filter topics", "data-test": "filter", value: params.q || "" });
  const list = h("div", {});
  const message = h("div", {});
  // A page of rows at a time: laying out a table of thousands costs the browser (and a broker on the same
  // machine) far more than the data (bench/RESULTS.md "Console").
  let shown = PAGE_ROWS;
  const draw = () => {
    const q = search.value.toLowerCase();
    const matching = data.topics.filter(t => t.name.toLowerCase().includes(q));
    const rows = matching.slice(0, shown);
    const more = matching.length > rows.length
      ? h("button", { type: "button", "data-test": "more", onclick: () => { shown += PAGE_ROWS; draw(); } }, `Show ${Math.min(PAGE_ROWS, matching.length - rows.length)} more`)
      : null;
    replace(list, h("p", { class: "muted" }, `${rows.length} shown, ${matching.length} matching, ${data.topics.length} topics`), table([
      { title: "Topic", cell: t => h("a", { href: route("topic", { name: t.name }), "data-test": "topic-link" }, t.name) },
      { title: "Delivery", cell: t => t.delivery },
      { title: "Partitions", num: true, cell: t => t.partitions || "—" },
      { title: "Broker", cell: t => t.brokers.join(", ") },
      { title: "In msg/s", num: true, cell: t => here(t, number(t.messages_in_rate, 1)) },
      { title: "In B/s", num: true, cell: t => here(t, bytes(t.bytes_in_rate)) },
      { title: "Out msg/s", num: true, cell: t => here(t, number(t.messages_out_rate, 1)) },
      { title: "Subs", num: true, cell: t => here(t, t.subscriptions) },
      { title: "Backlog", num: true, cell: t => here(t, number(t.backlog)) },
      { title: "WAL", num: true, cell: t => here(t, bytes(t.wal_bytes)) },
      { title: "Objects", num: true, cell: t => here(t, `${bytes(t.retained_bytes)} / ${number(t.retained_records)}`) },
      { title: "Table", cell: t => t.table || "—" },
      { title: "", cell: t => h("button", { class: "danger", "data-test": "delete-topic", onclick: () => remove(t.name) }, "Delete") },
    ], rows, { "data-test": "topics" }), more);
  };
  const remove = async name => {
    if (!window.confirm(`Delete topic ${name} and every record it holds? This cannot be undone.`)) return;
    try {
      await del("/api/topics", { name });
      replace(message, h("div", { class: "notice", "data-test": "notice" }, `Deleted ${name}`));
      data.topics = data.topics.filter(t => t.name !== name);
      draw();
    } catch (e) { replace(message, errorBox(e)); }
  };
  search.addEventListener("input", () => { shown = PAGE_ROWS; draw(); });
  const name = h("input", { placeholder: "/namespace/topic", "data-test": "new-name" });
  const partitions = h("input", { type: "number", min: 0, max: 1024, value: 0, "data-test": "new-partitions" });
  const delivery = h("select", { "data-test": "new-delivery" }, h("option", { value: "Reliable" }, "Reliable"), h("option", { value: "NonReliable" }, "NonReliable"));
  const create = h("form", { class: "toolbar", onsubmit: async e => {
    e.preventDefault();
    try {
      await post("/api/topics", { name: name.value.trim(), partitions: Number(partitions.value) || 0, delivery: delivery.value });
      replace(message, h("div", { class: "notice", "data-test": "notice" }, `Created ${name.value.trim()}`));
      const fresh = await get("/api/topics");
      data.topics = fresh.topics;
      draw();
    } catch (err) { replace(message, errorBox(err)); }
  } }, "New topic", name, "partitions", partitions, delivery, h("button", { type: "submit", class: "primary", "data-test": "create-topic" }, "Create"));
  const refused = Object.entries(data.refused || {}).map(([ns, why]) => h("div", { class: "error", "data-test": "denied" }, `Not permitted to list ${ns}: ${why}`));
  replace(main, h("h1", {}, "Topics"), h("div", { class: "toolbar" }, search), create, message, refused, list);
  draw();
}

// Figures are kept by the broker serving the topic: one this broker does not serve shows a dash.
function here(t, value) { return t.figures_from ? value : "—"; }
