// A line chart of the broker's recent history in SVG, drawn with the DOM API (no library: two series
// over an hour of points need no more; docs/CONSOLE.md says why).

const NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

export function lineChart(title, points, series, format, width = 440, height = 150) {
  const box = document.createElement("div");
  box.className = "chart";
  box.setAttribute("data-test", "chart");
  const label = document.createElement("div");
  label.className = "title";
  label.textContent = title;
  box.appendChild(label);
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const left = 56, bottom = 18, top = 6;
  const max = Math.max(1, ...points.flatMap(p => series.map(s => p[s.key])));
  const t0 = points.length ? points[0].time : 0, t1 = points.length ? points[points.length - 1].time : 1;
  const x = t => left + (width - left - 4) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = v => top + (height - top - bottom) * (1 - v / max);
  svg.appendChild(el("line", { x1: left, y1: y(0), x2: width - 4, y2: y(0), stroke: "#e4e7ec" }));
  svg.appendChild(el("text", { x: 2, y: top + 8 }, format(max)));
  svg.appendChild(el("text", { x: 2, y: y(0) }, "0"));
  if (points.length) {
    svg.appendChild(el("text", { x: left, y: height - 4 }, new Date(t0 * 1000).toLocaleTimeString()));
    svg.appendChild(el("text", { x: width - 60, y: height - 4 }, new Date(t1 * 1000).toLocaleTimeString()));
  }
  for (const s of series) {
    const line = points.map(p => `${x(p.time).toFixed(1)},${y(p[s.key]).toFixed(1)}`).join(" ");
    svg.appendChild(el("polyline", { points: line, class: s.cls }));
  }
  box.appendChild(svg);
  const legend = document.createElement("div");
  legend.className = "muted";
  for (const s of series) {
    const item = document.createElement("span");
    item.className = `legend ${s.cls}`;
    item.textContent = `— ${s.label}`;
    legend.appendChild(item);
  }
  box.appendChild(legend);
  return box;
}
