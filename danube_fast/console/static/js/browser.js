// The message browser: a topic's records by offset or publish time, forwards and backwards, N at a time.
// Reading acknowledges nothing and moves no subscription (the broker's Browse call).
import { errorBox, h, replace, route, table, when } from "./dom.js";
import { get } from "./api.js";

function decodeBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function hex(data) {
  const lines = [];
  for (let i = 0; i < data.length; i += 16) {
    const row = Array.from(data.slice(i, i + 16), b => b.toString(16).padStart(2, "0")).join(" ");
    lines.push(`${i.toString(16).padStart(6, "0")}  ${row}`);
  }
  return lines.join("\n");
}

export function valueText(record, format) {
  const data = decodeBase64(record.value_b64);
  const text = () => new TextDecoder("utf-8", { fatal: false }).decode(data);
  if (format === "hex") return hex(data);
  if (format === "json") {
    try { return JSON.stringify(JSON.parse(text()), null, 2); } catch { return `(not JSON) ${text()}`; }
  }
  if (format === "avro") {
    if (record.decoded !== undefined) return JSON.stringify(record.decoded, null, 2);
    return record.decode_error ? `(not decoded: ${record.decode_error})` : "(no Avro schema on this record)";
  }
  return text();
}

export async function show(main, params) {
  const topic = params.topic;
  const from = params.from || "earliest";
  const count = params.count || "20";
  const backward = params.backward === "1";
  const format = params.format || "text";
  const kind = h("select", { "data-test": "from-kind" }, ["earliest", "latest", "offset", "time"].map(k => h("option", { value: k, selected: from.split(":")[0] === k }, k)));
  const fromValue = from.includes(":") ? from.split(":")[1] : "";
  const value = h("input", { placeholder: "offset, or time (ISO 8601)", "data-test": "from-value",
    value: from.startsWith("time:") ? new Date(Number(fromValue)).toISOString() : fromValue });
  const countBox = h("input", { type: "number", min: 1, max: 1000, value: count, "data-test": "count" });
  const direction = h("select", { "data-test": "direction" }, h("option", { value: "0", selected: !backward }, "forwards"), h("option", { value: "1", selected: backward }, "backwards"));
  const formatBox = h("select", { "data-test": "format" }, ["text", "json", "avro", "hex"].map(f => h("option", { value: f, selected: f === format }, f)));
  const go = over => { location.hash = route("browse", { topic, from, count, backward: backward ? "1" : "0", format, ...over }); };
  const form = h("form", { class: "toolbar", onsubmit: e => {
    e.preventDefault();
    let start = kind.value;
    if (kind.value === "offset") start = `offset:${Number.parseInt(value.value, 10) || 0}`;
    if (kind.value === "time") start = `time:${Date.parse(value.value) || 0}`;
    go({ from: start, count: countBox.value, backward: direction.value, format: formatBox.value });
  } }, "From", kind, value, "count", countBox, direction, "show as", formatBox, h("button", { type: "submit", class: "primary", "data-test": "read" }, "Read"));
  formatBox.addEventListener("change", () => go({ format: formatBox.value }));
  let data, failure = null;
  try {
    data = await get("/api/records", { topic, from, count, backward: backward ? "1" : "0" });
  } catch (e) { failure = e; }
  const head = [h("h1", {}, "Messages of ", h("a", { href: route("topic", { name: topic }) }, topic)), form];
  if (failure) return replace(main, head, errorBox(failure));
  const records = data.records;
  const partitions = data.ranges.length > 1 ? h("div", { class: "toolbar" }, "This topic has partitions: read one to page through it:",
    data.ranges.map(r => h("a", { href: route("browse", { topic: r.stored_topic, from, count, format }) }, r.stored_topic))) : null;
  const range = data.ranges.length === 1 ? data.ranges[0] : null;
  const first = records.length ? records[0].offset : null;
  const last = records.length ? records[records.length - 1].offset : null;
  const paging = range ? h("div", { class: "toolbar" },
    h("button", { type: "button", "data-test": "older", disabled: first === null ? range.end_offset <= range.start_offset : first <= range.start_offset,
      onclick: () => go({ from: first === null ? "latest" : `offset:${first}`, backward: "1" }) }, "◀ Older"),
    h("button", { type: "button", "data-test": "newer", disabled: last === null || last + 1 >= range.end_offset,
      onclick: () => go({ from: `offset:${last + 1}`, backward: "0" }) }, "Newer ▶"),
    h("span", { class: "muted" }, `offsets ${range.start_offset} … ${range.end_offset - 1} kept`)) : null;
  replace(main, head, partitions, paging, table([
    { title: "Offset", num: true, cell: r => r.offset },
    { title: "Partition", cell: r => r.stored_topic },
    { title: "Published", cell: r => when(r.publish_time_ms) },
    { title: "Key", cell: r => r.key === null ? "—" : r.key },
    { title: "Producer", cell: r => r.producer_name },
    { title: "Attributes", cell: r => Object.keys(r.attributes).length ? h("pre", {}, Object.entries(r.attributes).map(([k, v]) => `${k}: ${v}`).join("\n")) : "—" },
    { title: "Schema", cell: r => r.schema_id === null ? "—" : `id ${r.schema_id} v${r.schema_version}` },
    { title: "Value", cell: r => h("div", {}, h("pre", { "data-test": "value" }, valueText(r, format)),
      h("a", { href: `/api/records/value?${new URLSearchParams({ topic: r.stored_topic, offset: r.offset })}`, download: `record-${r.offset}.bin`, "data-test": "download" }, `download (${r.size} B)`)) },
  ], records, { "data-test": "records", class: "record" }));
}
