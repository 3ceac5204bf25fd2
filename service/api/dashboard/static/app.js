// The dashboard: subscriptions with their health, a subscription's delivery log, one
// delivery's attempts and payload, and the actions of SPEC section 8.
import { ApiError, call, token } from "./api.js";
import { indented, rawMember } from "./payload.js";
import { breakableCell, button, cell, clear, el, targetCell, time, timeCell } from "./view.js";

const $ = (id) => document.getElementById(id);
const PAGE = 25;

const state = {
  subscriptions: [],
  log: null,          // {id, target} of the subscription whose log is open
  cursors: [null],    // `before` cursors of the pages seen; the last is the current page
  next: null,         // the cursor of the next (older) page
  delivery: null,     // id of the delivery shown
  payload: "",        // its payload's text, as sent
  followUp: null,     // timer of the refreshes after an action
  backfill: null,     // timer of the progress of the backfill last started
  hookEvents: [],     // {resource, event} of GET /hook_events/
  loads: { subscriptions: 0, log: 0 },  // the latest load of each, numbered
};

// Each load of a list is numbered, and only the latest is shown: an earlier one answered
// later (a follow-up's refresh overtaken by a deletion's) would put back what is gone.
function startLoad(list) {
  state.loads[list] += 1;
  const load = state.loads[list];
  return () => load === state.loads[list];
}

function showError(error) {
  const box = $("error");
  box.textContent = error instanceof ApiError || error instanceof Error ? error.message : String(error);
  box.hidden = false;
  $("notice").textContent = "";
}

function notify(message) {
  $("error").hidden = true;
  $("error").textContent = "";
  $("notice").textContent = message;
}

// Runs an action; an error is shown in words, never swallowed.
async function run(action) {
  try {
    await action();
  } catch (error) {
    showError(error);
    if (error instanceof ApiError && error.status === 429) stopFollowUp();
  }
}

// --- health ------------------------------------------------------------------------------

// Recent failures: the last attempt failed (a failure after the last success, if any). Not
// named "failing": webhook.failing fires only after failures unbroken for failing_after (an
// hour by default), which the page cannot see.
function failing(sub) {
  if (!sub.last_failure_at) return false;
  return !sub.last_success_at || new Date(sub.last_failure_at) >= new Date(sub.last_success_at);
}

function marks(sub) {
  const td = el("td");
  if (failing(sub)) {
    td.append(el("span", { class: "mark failing", text: "recent failures",
      attrs: { title: "The last attempt failed. webhook.failing is sent once failures have lasted the failing period (an hour by default)." } }));
  }
  // inactive_reason is set only when the service stopped it (table detached, events made
  // private, auto-disable); without one the owner paused it.
  if (!sub.active && sub.inactive_reason) {
    td.append(el("span", { class: "mark disabled", text: "disabled" }));
    td.append(el("div", { class: "reason", text: sub.inactive_reason }));
  } else if (!sub.active) {
    td.append(el("span", { class: "mark paused", text: "paused" }));
  }
  if (!td.childNodes.length) td.append(el("span", { class: "mark healthy", text: "healthy" }));
  return td;
}

// --- subscriptions -----------------------------------------------------------------------

async function loadSubscriptions() {
  const latest = startLoad("subscriptions");
  const all = [];
  let after = null;
  for (let page = 0; page < 20; page += 1) {  // up to 20 000 subscriptions
    const query = after ? `?limit=1000&after=${encodeURIComponent(after)}` : "?limit=1000";
    const { data } = await call("GET", `/webhooks/${query}`);
    all.push(...data);
    if (data.length < 1000) break;
    after = data[data.length - 1].id;
  }
  if (!latest()) return;
  state.subscriptions = all;
  renderSubscriptions();
}

function renderSubscriptions() {
  const body = $("subscription-rows");
  clear(body);
  $("subscriptions").hidden = false;
  $("no-subscriptions").hidden = state.subscriptions.length > 0;
  for (const sub of state.subscriptions) {
    const failure = el("td", {}, el("div", { text: time(sub.last_failure_at) }));
    if (sub.last_failure_content) failure.append(el("div", { class: "failure", text: sub.last_failure_content }));
    const actions = el("td", { class: "actions" }, el("div", { class: "buttons" },
      button("Deliveries", () => run(() => openLog(sub))),
      sub.active
        ? button("Pause", () => run(() => setActive(sub, false)))
        : button("Resume", () => run(() => setActive(sub, true))),
      button("Send test event", () => run(() => sendTest(sub))),
      button("Backfill", () => run(() => backfill(sub))),
      button("Rotate secret", () => run(() => rotate(sub))),
      button("Delete", () => run(() => remove(sub)), "danger"),
    ));
    const target = targetCell(sub.target);
    // A rate limit (POSTs per second, across every worker) is shown under its target.
    if (sub.rate_limit) target.append(el("div", { class: "muted rate-limit", text: `at most ${sub.rate_limit} per second` }));
    const row = el("tr", { attrs: { "data-subscription": sub.id } },
      cell(sub.id), cell(sub.resource), breakableCell(sub.events, ",", "events"), target,
      cell(sub.active ? "yes" : "no"), marks(sub), cell(sub.last_status),
      timeCell(sub.last_success_at), failure, actions);
    if (state.log && state.log.id === sub.id) row.classList.add("selected");
    body.append(row);
  }
}

async function setActive(sub, active) {
  await call("PUT", `/webhooks/${sub.id}/`, { active });
  notify(active ? `Subscription ${sub.id} resumed.` : `Subscription ${sub.id} paused: nothing is delivered to it until it is resumed.`);
  await loadSubscriptions();
}

async function sendTest(sub) {
  const { data } = await call("POST", `/webhooks/${sub.id}/test`);
  notify(`Test event queued for subscription ${sub.id} as delivery ${data.id}.`);
  followUp(sub.id);
}

// A backfill sends every current row as <noun>.snapshot; its progress shows in the notice
// line until it is done or failed.
async function backfill(sub) {
  const { data } = await call("POST", `/webhooks/${sub.id}/backfill`, {});
  notify(`Backfill ${data.id} of subscription ${sub.id} started: every current row is sent as a snapshot.`);
  watchBackfill(sub.id, data.id);
}

function watchBackfill(subscriptionId, backfillId, delay = 500) {
  if (state.backfill) clearTimeout(state.backfill);
  state.backfill = setTimeout(() => run(async () => {
    state.backfill = null;
    const { data } = await call("GET", `/webhooks/${subscriptionId}/backfills/${backfillId}`);
    const rows = `${data.rows} row${data.rows === 1 ? "" : "s"}`;
    if (state.log && state.log.id === subscriptionId) await loadLatestBackfill();
    if (data.status === "running") {
      notify(`Backfill ${backfillId} of subscription ${subscriptionId}: ${rows} queued so far.`);
      watchBackfill(subscriptionId, backfillId, Math.min(delay * 2, 4000));
    } else if (data.status === "done") {
      notify(`Backfill ${backfillId} of subscription ${subscriptionId} done: ${rows} queued.`);
      if (state.log && state.log.id === subscriptionId) await loadLog();
    } else {
      showError(`Backfill ${backfillId} of subscription ${subscriptionId} failed after ${rows}: ${data.error}`);
    }
  }), delay);
}

async function rotate(sub) {
  await call("POST", `/webhooks/${sub.id}/rotate_secret`);
  notify(`Secret of subscription ${sub.id} rotated: the target confirmed the new secret; the old one still signs alongside it for the overlap period.`);
  await loadSubscriptions();
}

async function remove(sub) {
  if (!window.confirm(`Delete subscription ${sub.id} (${sub.resource} → ${sub.target})? Its deliveries stop and it cannot be undone.`)) {
    notify("Nothing deleted.");
    return;
  }
  await call("DELETE", `/webhooks/${sub.id}/`);
  if (state.log && state.log.id === sub.id) closeLog();
  notify(`Subscription ${sub.id} deleted.`);
  await loadSubscriptions();
}

// --- a new subscription -----------------------------------------------------------------

async function loadHookEvents() {
  const { data } = await call("GET", "/hook_events/");
  state.hookEvents = data;
  const select = $("create-resource");
  const chosen = select.value;
  clear(select);
  for (const resource of [...new Set(data.map((e) => e.resource))]) {
    select.append(el("option", { text: resource, attrs: { value: resource } }));
  }
  if (chosen) select.value = chosen;
  renderEventChoices();
}

function renderEventChoices() {
  const box = $("create-events");
  clear(box);
  const resource = $("create-resource").value;
  const events = state.hookEvents.filter((e) => e.resource === resource);
  if (!events.length) box.append(el("span", { class: "muted", text: "No events to subscribe to." }));
  for (const { event } of events) {
    const id = `create-event-${event}`;
    const input = el("input", { attrs: { type: "checkbox", id, value: event } });
    box.append(el("span", {}, input, el("label", { text: ` ${event}`, attrs: { for: id } })));
  }
}

function createError(message) {
  $("create-error").textContent = message;
  $("create-error").hidden = !message;
}

// The API checks the target with a handshake before it answers: its refusal is shown
// beside the form, where the fields to correct are.
async function createSubscription() {
  createError("");
  const resource = $("create-resource").value;
  const events = [...$("create-events").querySelectorAll("input:checked")].map((i) => i.value);
  const target = $("create-target").value.trim();
  const rate = $("create-rate").value.trim();
  if (!resource) return createError("Choose a resource.");
  if (!events.length) return createError("Choose at least one event.");
  if (!target) return createError("Write the target URL.");
  if (rate && !/^[0-9]+$/.test(rate)) return createError("The rate limit is a whole number of POSTs per second (1 to 10000), or empty for none.");
  const submit = $("create").querySelector("button[type=submit]");
  submit.disabled = true;
  try {
    const body = { resource, events, target };
    if (rate) body.rate_limit = Number(rate);
    const { data } = await call("POST", "/webhooks/", body);
    $("create-target").value = "";
    $("create-rate").value = "";
    for (const input of $("create-events").querySelectorAll("input")) input.checked = false;
    notify(`Subscription ${data.id} created: the target answered the handshake.`);
    await loadSubscriptions();
  } catch (error) {
    createError(error instanceof Error ? error.message : String(error));
  } finally {
    submit.disabled = false;
  }
}

// --- the delivery log --------------------------------------------------------------------

function closeLog() {
  resetRecover();
  $("log-chart").hidden = true;
  state.log = null;
  state.delivery = null;
  $("log").hidden = true;
  $("delivery").hidden = true;
}

async function openLog(sub) {
  resetRecover();
  state.log = { id: sub.id, target: sub.target };
  state.cursors = [null];
  state.delivery = null;
  $("delivery").hidden = true;
  $("log-title").textContent = `Deliveries of subscription ${sub.id}`;
  $("log-target").textContent = `${sub.resource}: ${sub.events} → ${sub.target}`;
  $("log").hidden = false;
  renderSubscriptions();
  await loadLog();
  $("log").scrollIntoView({ block: "nearest" });
}

async function loadLog() {
  if (!state.log) return;
  const params = new URLSearchParams({ limit: String(PAGE) });
  const status = $("status-filter").value;
  if (status) params.set("status", status);
  const before = state.cursors[state.cursors.length - 1];
  if (before) params.set("before", before);
  const latest = startLoad("log");
  const { data, next } = await call("GET", `/webhooks/${state.log.id}/deliveries?${params}`);
  if (!latest()) return;
  state.next = next;
  renderLog(data);
  await loadLatestBackfill();
  if (state.cursors.length === 1) await loadChart();
}

// --- the outcome chart -------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
const OUTCOMES = ["succeeded", "failed", "pending"];
const CHART = { width: 600, height: 140, top: 8, bottom: 22, left: 34, right: 8, buckets: 24 };

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

// The latest 1000 deliveries by creation time in 24 equal slices, stacked by outcome. Drawn
// here as SVG: the policy allows no script from elsewhere, and no chart library is needed.
async function loadChart() {
  if (!state.log) return;
  const id = state.log.id;
  const { data } = await call("GET", `/webhooks/${id}/deliveries?limit=1000`);
  if (!state.log || state.log.id !== id) return;
  drawChart(id, data);
}

function drawChart(id, deliveries) {
  const figure = $("log-chart");
  clear(figure);
  figure.hidden = !deliveries.length;
  if (!deliveries.length) return;
  const times = deliveries.map((d) => new Date(d.created_at).getTime());
  const end = Date.now();
  const start = Math.min(Math.min(...times), end - 3600 * 1000);
  const slice = (end - start) / CHART.buckets;
  const buckets = Array.from({ length: CHART.buckets }, () => ({ succeeded: 0, failed: 0, pending: 0 }));
  const totals = { succeeded: 0, failed: 0, pending: 0 };
  deliveries.forEach((d, i) => {
    const outcome = OUTCOMES.includes(d.status) ? d.status : "pending";
    const index = Math.min(CHART.buckets - 1, Math.max(0, Math.floor((times[i] - start) / slice)));
    buckets[index][outcome] += 1;
    totals[outcome] += 1;
  });
  const highest = Math.max(1, ...buckets.map((b) => b.succeeded + b.failed + b.pending));
  const plot = CHART.height - CHART.top - CHART.bottom;
  const step = (CHART.width - CHART.left - CHART.right) / CHART.buckets;
  const label = `Deliveries of subscription ${id} over time, from ${time(new Date(start).toISOString())} `
    + `to ${time(new Date(end).toISOString())}: ${totals.succeeded} succeeded, ${totals.failed} failed, `
    + `${totals.pending} pending${deliveries.length >= 1000 ? " (the latest 1000)" : ""}.`;
  const chart = svg("svg", { viewBox: `0 0 ${CHART.width} ${CHART.height}`, role: "img", "aria-label": label });
  chart.append(svg("title", {}, label));
  const baseline = CHART.top + plot;
  chart.append(svg("line", { class: "axis", x1: CHART.left, x2: CHART.width - CHART.right, y1: baseline, y2: baseline }));
  chart.append(svg("text", { x: CHART.left - 4, y: CHART.top + 10, "text-anchor": "end" }, String(highest)));
  chart.append(svg("text", { x: CHART.left - 4, y: baseline, "text-anchor": "end" }, "0"));
  chart.append(svg("text", { x: CHART.left, y: CHART.height - 6 }, time(new Date(start).toISOString())));
  chart.append(svg("text", { x: CHART.width - CHART.right, y: CHART.height - 6, "text-anchor": "end" }, "now"));
  buckets.forEach((bucket, index) => {
    let y = baseline;
    for (const outcome of OUTCOMES) {
      if (!bucket[outcome]) continue;
      const h = (bucket[outcome] / highest) * plot;
      y -= h;
      const bar = svg("rect", { class: outcome, x: CHART.left + index * step + 1, y, width: Math.max(1, step - 2), height: h });
      bar.append(svg("title", {}, `${bucket[outcome]} ${outcome}`));
      chart.append(bar);
    }
  });
  const caption = el("figcaption", {}, el("span", { text: "Delivery outcomes by creation time (UTC):" }),
    ...OUTCOMES.map((o) => el("span", { class: `key ${o}`, text: `${o} ${totals[o]}` })));
  figure.append(chart, caption);
}

// The subscription's latest backfill, if any, above its log.
async function loadLatestBackfill() {
  if (!state.log) return;
  const { data } = await call("GET", `/webhooks/${state.log.id}/backfills?limit=1`);
  const line = $("log-backfill");
  line.hidden = !data.length;
  if (!data.length) return;
  const b = data[0];
  const rows = `${b.rows} row${b.rows === 1 ? "" : "s"}`;
  line.textContent = b.status === "running" ? `Backfill ${b.id}: running, ${rows} queued so far.`
    : b.status === "done" ? `Backfill ${b.id}: done, ${rows} queued (finished ${time(b.finished_at)}).`
      : `Backfill ${b.id}: failed after ${rows}: ${b.error}`;
}

// A pending delivery with no next attempt waits behind an earlier one (strict ordering).
const WAITING = "behind an earlier one";

function waiting(d) {
  return d.status === "pending" && !d.next_attempt_at;
}

function nextAttemptCell(d) {
  return waiting(d) ? cell(WAITING) : timeCell(d.next_attempt_at);
}

function renderLog(deliveries) {
  const body = $("delivery-rows");
  clear(body);
  $("no-deliveries").hidden = deliveries.length > 0;
  for (const d of deliveries) {
    const row = el("tr", { attrs: { "data-delivery": d.id } },
      cell(d.id), cell(d.event), cell(d.status, `status-${d.status}`), cell(d.attempts),
      cell(d.last_status), timeCell(d.created_at), nextAttemptCell(d),
      timeCell(d.finished_at),
      el("td", { class: "actions" },
        button("Details", () => run(() => openDelivery(d.id))),
        button("Redeliver", () => run(() => redeliver(d.id)))));
    if (state.delivery === d.id) row.classList.add("selected");
    body.append(row);
  }
  $("newest-page").disabled = state.cursors.length <= 1;
  $("previous-page").disabled = state.cursors.length <= 1;
  $("next-page").disabled = !state.next;
}

async function redeliver(id) {
  await call("POST", `/webhooks/${state.log.id}/deliveries/${id}/redeliver`);
  notify(`Delivery ${id} queued again.`);
  await loadLog();
  followUp(state.log.id);
}

// "YYYY-MM-DD HH:MM[:SS]" read as UTC, the zone of every time on the page; null otherwise.
function parseUtc(text) {
  const match = /^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2}))?(?:\s*UTC|Z)?$/i.exec(text.trim());
  if (!match) return null;
  const [, y, mo, d, h, mi, s] = match.map(Number);
  const date = new Date(Date.UTC(y, mo - 1, d, h, mi, s || 0));
  // Date.UTC rolls 2024-02-31 over into March: refuse instead.
  if (date.getUTCMonth() !== mo - 1 || date.getUTCDate() !== d || h > 23 || mi > 59) return null;
  return date;
}

function recoverSince() {
  const since = parseUtc($("recover-since").value);
  if (!since) throw new Error("Write the time from which failed deliveries are sent again as YYYY-MM-DD HH:MM (UTC).");
  return since;
}

// Recover can queue many deliveries at once: the first click only asks.
function askRecover() {
  const since = recoverSince();
  $("recover").hidden = true;
  $("recover-confirm").hidden = false;
  $("recover-cancel").hidden = false;
  notify(`Send again every failed delivery of subscription ${state.log.id} since ${time(since.toISOString())}? Press "Confirm recover".`);
  $("recover-confirm").focus();
}

function resetRecover() {
  $("recover").hidden = false;
  $("recover-confirm").hidden = true;
  $("recover-cancel").hidden = true;
}

async function recover() {
  const since = recoverSince();
  resetRecover();
  const { data } = await call("POST", `/webhooks/${state.log.id}/recover`, { since: since.toISOString() });
  notify(`${data.requeued} failed ${data.requeued === 1 ? "delivery" : "deliveries"} since ${time(since.toISOString())} queued again.`);
  await loadLog();
  followUp(state.log.id);
}

// --- one delivery ------------------------------------------------------------------------

async function openDelivery(id) {
  const { data, text } = await call("GET", `/webhooks/${state.log.id}/deliveries/${id}`);
  state.delivery = id;
  // The payload's text as the API sent it, which is the body the receiver got.
  state.payload = rawMember(text, "payload") ?? JSON.stringify(data.payload);
  $("delivery-title").textContent = `Delivery ${data.id}`;
  const fields = $("delivery-fields");
  clear(fields);
  const rows = [["Event", data.event], ["Event id", data.event_id], ["Status", data.status],
    ["Attempts", data.attempts], ["Last status", data.last_status], ["Created", time(data.created_at)],
    ["Next attempt", waiting(data) ? WAITING : time(data.next_attempt_at)], ["Finished", time(data.finished_at)],
    ["webhook-id", `msg_${data.id}`]];
  for (const [name, value] of rows) {
    fields.append(el("dt", { text: name }), el("dd", { text: value === null || value === undefined ? "—" : value }));
  }
  const attempts = $("attempt-rows");
  clear(attempts);
  for (const a of data.attempt_log || []) {
    attempts.append(el("tr", {}, cell(a.attempt), timeCell(a.attempted_at),
      cell(a.status === 0 ? "no response" : a.status), cell(a.duration_ms === null || a.duration_ms === undefined ? null : `${Number(a.duration_ms).toFixed(1)} ms`),
      cell(a.error, "failure")));
  }
  if (!(data.attempt_log || []).length) attempts.append(el("tr", {}, el("td", { class: "muted", text: "No attempt yet.", attrs: { colspan: 5 } })));
  showPayload();
  $("delivery").hidden = false;
  for (const row of $("delivery-rows").children) row.classList.toggle("selected", row.dataset.delivery === String(id));
}

// As sent, or indented (only the whitespace between its tokens changes).
function showPayload() {
  const text = state.payload || "";
  $("payload").textContent = $("payload-indent").checked ? indented(text) : text;
}

// --- refreshes ---------------------------------------------------------------------------

function stopFollowUp() {
  if (state.followUp) clearTimeout(state.followUp);
  state.followUp = null;
}

// After an action that queues deliveries, refresh a few times, backing off (1, 2, 4, 8 s):
// the worker's answer shows without a reload and without hammering the rate limit.
function followUp(subscriptionId, delay = 1000) {
  stopFollowUp();
  if (delay > 8000) return;
  state.followUp = setTimeout(() => run(async () => {
    await loadSubscriptions();
    if (state.log && state.log.id === subscriptionId) {
      await loadLog();
      if (state.delivery) await openDelivery(state.delivery);
    }
    followUp(subscriptionId, delay * 2);
  }), delay);
}

// --- start -------------------------------------------------------------------------------

async function connect() {
  closeLog();
  stopFollowUp();
  try {
    await loadSubscriptions();
    await loadHookEvents();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      token.clear();
      $("forget").hidden = true;
      $("subscriptions").hidden = true;
    }
    throw error;
  }
  $("forget").hidden = false;
  notify(`Connected: ${state.subscriptions.length} subscription${state.subscriptions.length === 1 ? "" : "s"}.`);
}

function defaultRecoverSince() {
  return new Date(Date.now() - 24 * 3600 * 1000).toISOString().slice(0, 16).replace("T", " ");
}

function start() {
  $("connect").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) {
      showError("Paste an API token first.");
      return;
    }
    token.set(value);
    run(connect);
  });
  $("forget").addEventListener("click", () => {
    token.clear();
    $("token").value = "";
    closeLog();
    stopFollowUp();
    state.subscriptions = [];
    $("subscriptions").hidden = true;
    $("forget").hidden = true;
    notify("Token forgotten.");
  });
  $("refresh-subscriptions").addEventListener("click", () => run(loadSubscriptions));
  $("refresh-log").addEventListener("click", () => run(loadLog));
  $("payload-indent").addEventListener("change", showPayload);
  $("status-filter").addEventListener("change", () => {
    state.cursors = [null];
    run(loadLog);
  });
  $("recover").addEventListener("click", () => run(async () => askRecover()));
  $("recover-confirm").addEventListener("click", () => run(recover));
  $("recover-cancel").addEventListener("click", () => {
    resetRecover();
    notify("Nothing queued.");
  });
  $("create").addEventListener("submit", (event) => {
    event.preventDefault();
    createSubscription();
  });
  $("create-resource").addEventListener("change", renderEventChoices);
  $("next-page").addEventListener("click", () => {
    if (!state.next) return;
    state.cursors.push(state.next);
    run(loadLog);
  });
  $("previous-page").addEventListener("click", () => {
    if (state.cursors.length > 1) state.cursors.pop();
    run(loadLog);
  });
  $("newest-page").addEventListener("click", () => {
    state.cursors = [null];
    run(loadLog);
  });
  $("recover-since").value = defaultRecoverSince();
  if (token.get()) {
    $("token").value = token.get();
    run(connect);
  }
}

start();
