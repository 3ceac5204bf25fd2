// The REST API from the page: the token (this tab only) and one call() for every request.
const KEY = "webhooks-dashboard-token";
let memory = "";

export const token = {
  get() {
    try { return sessionStorage.getItem(KEY) || memory; } catch { return memory; }
  },
  set(value) {
    memory = value;
    try { sessionStorage.setItem(KEY, value); } catch { /* memory only */ }
  },
  clear() {
    memory = "";
    try { sessionStorage.removeItem(KEY); } catch { /* memory only */ }
  },
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const REASONS = {
  400: "The API refused the request",
  401: "The token was not accepted",
  404: "Not found",
  409: "Not possible now",
  413: "The request is too large",
  429: "Too many requests",
  503: "The service cannot answer now",
};

// The `before` cursor of a Link: <...>; rel="next" header, or null.
function nextCursor(header) {
  if (!header) return null;
  const match = /<([^>]*)>\s*;\s*rel="?next"?/.exec(header);
  if (!match) return null;
  try {
    return new URL(match[1], location.href).searchParams.get("before");
  } catch {
    return null;
  }
}

// One request; resolves to {data, next, text} (text: the answer as sent) or throws an
// ApiError whose message a person reads.
export async function call(method, path, body) {
  const secret = token.get();
  if (!secret) throw new ApiError(0, "Paste an API token and press Connect first.");
  const headers = { Authorization: `Bearer ${secret}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`/api/v1${path}`, init);
  } catch (error) {
    throw new ApiError(0, `The API did not answer (${error.message}). Is the service running?`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!response.ok) {
    const said = data && typeof data.error === "string" ? data.error : (text.slice(0, 500) || response.statusText);
    let message = `${REASONS[response.status] || "The API answered an error"} (HTTP ${response.status}): ${said}`;
    const wait = response.headers.get("Retry-After");
    if (response.status === 429 && wait) message += ` Try again in ${wait} s.`;
    throw new ApiError(response.status, message);
  }
  return { data, next: nextCursor(response.headers.get("Link")), text };
}
