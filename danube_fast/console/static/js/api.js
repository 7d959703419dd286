// The console's calls to its broker's JSON endpoints; a refusal becomes an ApiError with the broker's
// status code and message. Changes carry the session's CSRF token.

export class ApiError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

export const session = { security: false, signedIn: false, principal: null, csrf: null };

async function send(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = session.csrf || "";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({ error: { code: "INTERNAL", message: response.statusText } }));
  if (!response.ok) {
    const error = data.error || { code: "INTERNAL", message: response.statusText };
    if (error.code === "UNAUTHENTICATED" && session.security) {
      session.signedIn = false;
      window.dispatchEvent(new Event("danube-signed-out"));
    }
    throw new ApiError(error.code, error.message);
  }
  return data;
}

export const get = (path, params) => send("GET", params ? `${path}?${new URLSearchParams(params)}` : path);
export const post = (path, body) => send("POST", path, body);
export const del = (path, params) => send("DELETE", `${path}?${new URLSearchParams(params)}`);

export async function loadSession() {
  const data = await send("GET", "/api/session");
  Object.assign(session, { security: data.security, signedIn: data.signed_in, principal: data.principal,
    csrf: data.csrf });
  return session;
}

export async function signIn(token) {
  const response = await fetch("/api/session", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Requested-With": "danube-console" },
    body: JSON.stringify({ token }) });
  const data = await response.json();
  if (!response.ok) throw new ApiError(data.error.code, data.error.message);
  Object.assign(session, { signedIn: true, principal: data.principal, csrf: data.csrf });
}

export async function signOut() {
  await send("DELETE", "/api/session");
  Object.assign(session, { signedIn: false, principal: null, csrf: null });
}
