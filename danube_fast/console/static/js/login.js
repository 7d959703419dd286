import { h, replace } from "./dom.js";
import { session, signIn } from "./api.js";

export async function show(main, params) {
  if (!session.security) return replace(main, h("p", {}, "This broker checks no identity: nothing to sign in to."));
  const token = h("textarea", { id: "token", placeholder: "a JWT from 'danube-fast admin security tokens create'", rows: 4 });
  const message = h("div", {});
  const form = h("form", { onsubmit: async e => {
    e.preventDefault();
    try {
      await signIn(token.value.trim());
      token.value = "";
      location.hash = params.next && params.next.startsWith("#/") && !params.next.startsWith("#/login") ? params.next : "#/overview";
      window.dispatchEvent(new Event("danube-render"));
    } catch (err) {
      replace(message, h("div", { class: "error", "data-test": "error" }, `${err.code}: ${err.message}`));
    }
  } }, h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "The console makes every call as you, with your token's permissions. The token stays in the broker's memory for this session, never in the page or a URL."),
    token, h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary", "data-test": "sign-in" }, "Sign in")), message);
  replace(main, form);
}
