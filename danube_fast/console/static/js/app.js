// The console's page router: #/page?params picks a page module, which renders into <main>.
import { h, replace } from "./dom.js";
import { loadSession, session, signOut } from "./api.js";
import * as overview from "./overview.js";
import * as topics from "./topics.js";
import * as topic from "./topic.js";
import * as browser from "./browser.js";
import * as schemas from "./schemas.js";
import * as security from "./security.js";
import * as login from "./login.js";

const PAGES = { overview, topics, topic, browse: browser, schemas, schema: schemas, security, login };
let current = null;  // the page shown: its stop() ends its refreshing

function parse() {
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [name, query] = hash.split("?");
  return { name, params: Object.fromEntries(new URLSearchParams(query || "")) };
}

// Draws who is signed in; a render that changes nothing leaves the element alone (a click on the sign-out
// button must not land on one that a refresh just replaced).
function who() {
  const el = document.getElementById("who");
  const state = !session.security ? "off" : session.signedIn ? `in:${session.principal}` : "out";
  if (el.dataset.state === state) return;
  el.dataset.state = state;
  if (!session.security) return replace(el, "security off");
  if (!session.signedIn) return replace(el, h("a", { href: "#/login" }, "Sign in"));
  replace(el, session.principal, h("button", { "data-test": "sign-out", onclick: async () => {
    await signOut().catch(() => {});
    location.hash = "#/login";
    render();
  } }, "Sign out"));
}

// Each render has a number: one that a newer render overtook (the session ended while its page loaded, and
// the sign-in page was drawn meanwhile) leaves the page alone.
let renders = 0;

async function render() {
  const mine = ++renders;
  if (current && current.stop) current.stop();
  current = null;
  const main = document.getElementById("main");
  main.removeAttribute("data-rendered");
  let { name, params } = parse();
  if (session.security && !session.signedIn && name !== "login") {
    name = "login";
    params = { next: location.hash };
  }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("current", a.dataset.page === name || (a.dataset.page === "topics" && (name === "topic" || name === "browse")));
  }
  who();
  const page = PAGES[name];
  if (!page) return replace(main, h("h1", {}, "No such page"));
  replace(main, h("p", { class: "muted" }, "Loading…"));
  current = page;
  try {
    await page.show(main, params, name);
  } catch (e) {
    if (mine !== renders) return;
    replace(main, h("div", { class: "error", "data-test": "error" }, `${e.code || "ERROR"}: ${e.message}`));
  }
  if (mine !== renders) return;
  main.setAttribute("data-rendered", name);
}

window.addEventListener("hashchange", render);
window.addEventListener("danube-signed-out", () => { if (parse().name !== "login") render(); });
window.addEventListener("danube-render", render);

loadSession().then(render).catch(e => {
  replace(document.getElementById("main"), h("div", { class: "error" }, `cannot reach the broker: ${e.message}`));
});
