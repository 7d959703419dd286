// Elements built with the DOM API only: every string becomes a text node or an attribute value, never
// markup, so names, keys and payloads from the broker stay inert (docs/CONSOLE.md, "Hostile data").

const SAFE_ATTRS = new Set(["class", "id", "type", "value", "placeholder", "title", "name", "min", "max",
  "data-test", "data-page", "colspan", "rows", "for", "step", "download", "aria-label"]);

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "href") {
      el.setAttribute("href", safeHref(value));
    } else if (key === "checked" || key === "disabled" || key === "selected") {
      el[key] = Boolean(value);
    } else if (SAFE_ATTRS.has(key)) {
      el.setAttribute(key, String(value));
    } else {
      throw new Error(`attribute ${key} is not allowed`);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

// Links are to the console's own pages (#/...) or its API (/api/...): nothing a datum could make a script.
export function safeHref(value) {
  const text = String(value);
  return text.startsWith("#/") || text.startsWith("/api/") ? text : "#/";
}

export function route(page, params) {
  const query = new URLSearchParams(params || {}).toString();
  return `#/${page}${query ? "?" + query : ""}`;
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function table(columns, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, columns.map(c => h("th", { class: c.num ? "num" : null }, c.title)))),
    h("tbody", {}, rows.length === 0
      ? h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "none"))
      : rows.map(row => h("tr", {}, columns.map(c => h("td", { class: c.num ? "num" : null }, c.cell(row)))))));
}

export function number(value, digits) {
  if (value === null || value === undefined) return "—";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 });
}

export function bytes(value) {
  if (value === null || value === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(value), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function when(ms) {
  return ms ? new Date(Number(ms)).toISOString().replace("T", " ").replace("Z", " UTC") : "—";
}

export function errorBox(error) {
  const denied = error && (error.code === "PERMISSION_DENIED" || error.code === "UNAUTHENTICATED");
  return h("div", { class: "error", "data-test": denied ? "denied" : "error" },
    denied ? "Not permitted: " : "Error: ", `${error.code}: ${error.message}`);
}
