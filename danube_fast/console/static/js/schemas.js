import { errorBox, h, replace, route, table, when } from "./dom.js";
import { get, post } from "./api.js";

export async function show(main, params, name) {
  if (name === "schema") return subject(main, params);
  const data = await get("/api/schemas");
  replace(main, h("h1", {}, "Schemas"), table([
    { title: "Subject", cell: s => h("a", { href: route("schema", { subject: s.subject }), "data-test": "subject-link" }, s.subject) },
    { title: "Type", cell: s => s.error ? errorBox(s.error) : s.type },
    { title: "Latest version", num: true, cell: s => s.version ?? "—" },
    { title: "Compatibility", cell: s => s.compatibility ?? "—" },
  ], data.subjects, { "data-test": "subjects" }));
}

// A line diff (longest common subsequence): schemas are short, so the quadratic table is fine.
export function diffLines(a, b) {
  const x = a.split("\n"), y = b.split("\n");
  const n = x.length, m = y.length;
  const lcs = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) lcs[i][j] = x[i] === y[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] === y[j]) { out.push([" ", x[i]]); i++; j++; }
    else if (j < m && (i >= n || lcs[i][j + 1] >= lcs[i + 1][j])) { out.push(["+", y[j]]); j++; }
    else { out.push(["-", x[i]]); i++; }
  }
  return out;
}

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}

async function subject(main, params) {
  const data = await get("/api/schema", { subject: params.subject });
  const versions = data.versions;
  const pick = (test, chosen) => h("select", { "data-test": test }, versions.map(v => h("option", { value: v.version, selected: v.version === chosen }, `v${v.version}`)));
  const last = versions.length ? versions[versions.length - 1].version : 0;
  const left = pick("diff-from", versions.length > 1 ? versions[versions.length - 2].version : last);
  const right = pick("diff-to", last);
  const diff = h("div", { class: "diff", "data-test": "diff" });
  const drawDiff = () => {
    const a = versions.find(v => String(v.version) === left.value), b = versions.find(v => String(v.version) === right.value);
    replace(diff, diffLines(pretty(a ? a.definition : ""), pretty(b ? b.definition : "")).map(([op, line]) =>
      h("div", { class: op === "+" ? "add" : op === "-" ? "del" : null }, `${op} ${line}`)));
  };
  left.addEventListener("change", drawDiff);
  right.addEventListener("change", drawDiff);
  const pasted = h("textarea", { "data-test": "check-definition", placeholder: "a schema to check against this subject" });
  const type = h("select", { "data-test": "check-type" }, ["avro", "json_schema"].map(t => h("option", { value: t, selected: versions.length && versions[versions.length - 1].type.toLowerCase().startsWith(t.slice(0, 4)) }, t)));
  const verdict = h("div", {});
  const check = h("form", { onsubmit: async e => {
    e.preventDefault();
    try {
      const answer = await post("/api/schema/check", { subject: data.subject, type: type.value, definition: pasted.value });
      replace(verdict, answer.compatible ? h("div", { class: "notice", "data-test": "verdict" }, "Compatible")
        : h("div", { class: "error", "data-test": "verdict" }, "Not compatible: ", answer.errors.join("; ")));
    } catch (err) { replace(verdict, errorBox(err)); }
  } }, pasted, h("div", { class: "toolbar" }, type, h("button", { type: "submit", class: "primary", "data-test": "check" }, "Check compatibility")), verdict);
  const mode = h("select", { "data-test": "mode" }, ["None", "Backward", "Forward", "Full"].map(m => h("option", { value: m, selected: m.toLowerCase() === (data.compatibility || "").toLowerCase() }, m)));
  const modeMessage = h("div", {});
  const setMode = h("form", { class: "toolbar", onsubmit: async e => {
    e.preventDefault();
    try { await post("/api/schema/mode", { subject: data.subject, mode: mode.value }); window.dispatchEvent(new Event("danube-render")); } catch (err) { replace(modeMessage, errorBox(err)); }
  } }, `Compatibility mode: ${data.compatibility || "—"}`, mode, h("button", { type: "submit", "data-test": "set-mode" }, "Set"));
  replace(main, h("h1", {}, data.subject), setMode, modeMessage,
    table([
      { title: "Version", num: true, cell: v => v.version }, { title: "Schema id", num: true, cell: v => v.schema_id },
      { title: "Type", cell: v => v.type }, { title: "Created", cell: v => when(v.created_at * 1000) },
      { title: "Definition", cell: v => h("pre", {}, pretty(v.definition)) },
    ], versions, { "data-test": "versions" }),
    h("h2", {}, "Diff"), h("div", { class: "toolbar" }, "from", left, "to", right), diff,
    h("h2", {}, "Check a schema"), check);
  drawDiff();
}
