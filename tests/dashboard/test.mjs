// Drives the dashboard in headless Chromium. Each panel (the outbox
// numbers, dead events, consumers, consumer dead letters, plugin versions)
// is checked against the API it reads (fetched here with the same token): every row the API
// has is on the page, with the values the API gives, and no other. Then it
// clicks redrive on the relay's dead event, redrive on consumer dead letter
// REDRIVE_ID and discard on DISCARD_ID, and waits for the page to show
// them gone; run.sh checks the database afterwards.
import { chromium } from "playwright-core";

const url = process.env.URL;
const token = process.env.TOKEN;
const redriveId = process.env.REDRIVE_ID;
const discardId = process.env.DISCARD_ID;
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
class Failure extends Error {}
const fail = (msg) => { throw new Failure(msg); };

async function api(path) {
  const r = await fetch(new URL(path, url), { headers: { Authorization: "Bearer " + token } });
  if (!r.ok) fail(path + ": HTTP " + r.status + " " + (await r.text()));
  return r.json();
}

// The page's formatting, written out again (see fmt in dashboard.html).
const none = (v) => v === null || v === undefined;
const fmt = {
  int: (v) => (none(v) ? "–" : String(v)),
  rate: (v) => (none(v) ? "–" : v.toFixed(1)),
  ms: (v) => (none(v) ? "–" : (v < 1 ? v.toFixed(3) : v.toFixed(1)) + " ms"),
};

// The text of every `data-field` cell of the rows of `tbody`, by row id.
async function table(page, tbody) {
  return page.$$eval(`#${tbody} tr`, (trs) => trs.map((tr) => {
    const cells = {};
    for (const td of tr.querySelectorAll("td[data-field]")) cells[td.dataset.field] = td.textContent;
    return { id: tr.id, cells };
  }));
}

// Compares a panel with the API until they agree (the page refreshes every
// 2 s and the values are settled, so a mismatch that outlasts 10 s is real).
async function agree(what, check) {
  let last;
  for (let i = 0; i < 20; i++) {
    last = await check();
    if (last.length === 0) return;
    await new Promise((r) => setTimeout(r, 500));
  }
  fail(what + " disagrees with the API:\n  " + last.join("\n  "));
}

function diff(problems, where, field, shown, want) {
  if (shown !== want) problems.push(`${where} ${field}: page shows ${JSON.stringify(shown)}, API gives ${JSON.stringify(want)}`);
}

async function checkOutbox(page) {
  await agree("the outbox panel and the dead events", async () => {
    const s = await api("/api/stats");
    const dead = await api("/api/dead?limit=50");
    const problems = [];
    for (const [id, v] of [["pending", s.pending], ["failing", s.failing], ["dead", s.dead], ["blocked", s.blocked_aggregates]]) {
      diff(problems, "outbox", id, (await page.textContent("#" + id)).trim(), String(v));
    }
    const shown = await page.$$eval("#dead-rows tr", (trs) => trs.map((tr) => tr.id));
    diff(problems, "dead events", "rows", shown.join(","), dead.map((e) => "dead-" + e.seq).join(","));
    for (const e of dead) {
      const cells = await page.$$eval(`#dead-${e.seq} td`, (tds) => tds.slice(0, 6).map((td) => td.textContent));
      diff(problems, "dead event " + e.seq, "cells", cells.join("|"),
        [e.seq, e.event_type, e.aggregate_id, e.attempts, e.blocking, e.dead_reason].join("|"));
    }
    return problems;
  });
}

async function checkConsumers(page) {
  const api_rows = await api("/api/consumers");
  const billing = api_rows.find((c) => c.name === "billing");
  if (!billing) fail("/api/consumers has no billing: " + JSON.stringify(api_rows));
  // The scenario run.sh set up, so the API itself is checked too.
  const want = { lag: 0, processed_total: 4, duplicates_total: 1, dead_letters: 2, parked_keys: 2, parked_messages: 1 };
  for (const [k, v] of Object.entries(want)) {
    if (billing[k] !== v) fail(`/api/consumers: billing ${k} is ${billing[k]}, want ${v}`);
  }
  if (!(billing.oldest_unhandled_age_seconds > 0)) fail("/api/consumers: billing has dead letters but no oldest unhandled age");
  await agree("the consumers panel", async () => {
    const rows = await api("/api/consumers");
    const shown = await table(page, "consumer-rows");
    const problems = [];
    if (shown.length !== rows.length) problems.push(`${shown.length} rows shown, the API has ${rows.length}`);
    for (const c of rows) {
      const row = shown.find((r) => r.id === "consumer-" + c.name);
      if (!row) { problems.push("no row for consumer " + c.name); continue; }
      const s = row.cells;
      diff(problems, c.name, "name", s.name, c.name);
      diff(problems, c.name, "lag", s.lag, fmt.int(c.lag));
      diff(problems, c.name, "processed/s", s.processed_per_second, fmt.rate(c.processed_per_second));
      diff(problems, c.name, "processed", s.processed_total, fmt.int(c.processed_total));
      diff(problems, c.name, "duplicates", s.duplicates_total, fmt.int(c.duplicates_total));
      diff(problems, c.name, "dead letters", s.dead_letters, fmt.int(c.dead_letters));
      diff(problems, c.name, "parked keys", s.parked_keys, fmt.int(c.parked_keys));
      diff(problems, c.name, "parked messages", s.parked_messages, fmt.int(c.parked_messages));
      // The age grows between the two reads: a few seconds apart at most.
      const age = parseFloat(s.oldest_unhandled_age_seconds);
      if (none(c.oldest_unhandled_age_seconds) ? s.oldest_unhandled_age_seconds !== "–"
          : !(Math.abs(age - c.oldest_unhandled_age_seconds) <= 5)) {
        problems.push(`${c.name} oldest unhandled: page shows ${s.oldest_unhandled_age_seconds}, API gives ${c.oldest_unhandled_age_seconds} s`);
      }
    }
    return problems;
  });
}

async function checkPlugins(page) {
  const rows = await api("/api/plugins");
  const labels = rows.map((p) => p.name + "@" + p.version);
  if (new Set(labels).size !== labels.length) fail("/api/plugins lists a version twice: " + labels.join(", "));
  const want = ["c@1", "c@2", "redact-pii@0.1.0"];
  if (labels.join(",") !== want.join(",")) fail(`/api/plugins lists ${labels.join(", ")}, want ${want.join(", ")}`);
  const [c1, c2, ce] = rows;
  if (c1.state !== "active" || c1.world !== "consumer" || !(c1.calls > 0)) fail("c@1 is not the active consumer with calls: " + JSON.stringify(c1));
  if (c2.state !== "candidate" || !c2.shadow || !(c2.calls > 0) || !(c2.shadow_stats.matches > 0)) {
    fail("c@2 is not a candidate in shadow with calls and matches: " + JSON.stringify(c2));
  }
  if (ce.source !== "file" || ce.world !== "transformer" || !(ce.calls >= 7) || none(ce.p99_ms)) {
    fail("redact-pii@0.1.0 is not the file transformer with calls and a p99: " + JSON.stringify(ce));
  }
  if (!(c1.errors_total > 0)) fail("c@1 failed on the poison orders but counts no errors: " + JSON.stringify(c1));
  await agree("the plugins panel", async () => {
    const rows = await api("/api/plugins");
    const shown = await table(page, "plugin-rows");
    const problems = [];
    if (shown.length !== rows.length) problems.push(`${shown.length} rows shown, the API has ${rows.length}`);
    for (const p of rows) {
      const where = p.name + "@" + p.version;
      const row = shown.find((r) => r.id === `plugin-${p.name}-${p.version}`);
      if (!row) { problems.push("no row for " + where); continue; }
      const s = row.cells;
      const state = p.state + (p.shadow ? " (shadow)" : "") + (p.source === "file" ? " (file)" : "");
      const errors = Object.keys(p.errors).filter((k) => p.errors[k] > 0).sort().map((k) => k + " " + p.errors[k]).join(", ") || "0";
      const stats = p.shadow_stats || {};
      diff(problems, where, "world", s.world, p.world);
      diff(problems, where, "state", s.state, state);
      diff(problems, where, "calls", s.calls, fmt.int(p.calls));
      diff(problems, where, "errors", s.errors, errors);
      diff(problems, where, "p99", s.p99_ms, fmt.ms(p.p99_ms));
      diff(problems, where, "shadow matches", s.shadow_matches, fmt.int(stats.matches));
      diff(problems, where, "shadow mismatches", s.shadow_mismatches, fmt.int(stats.mismatches));
      diff(problems, where, "shadow errors", s.shadow_errors, fmt.int(stats.errors));
    }
    return problems;
  });
}

async function consumerDead() {
  const consumers = await api("/api/consumers");
  const lists = await Promise.all(consumers.map((c) => api(`/api/consumers/${encodeURIComponent(c.name)}/dead?limit=50`)));
  return [].concat(...lists);
}

async function checkConsumerDead(page) {
  const rows = await consumerDead();
  const ids = rows.map((d) => String(d.id));
  if (!ids.includes(redriveId) || !ids.includes(discardId)) fail(`the consumer dead-letter API lacks ${redriveId} or ${discardId}: ${ids}`);
  if (!rows.some((d) => d.state === "parked")) fail("no parked message behind the dead letter: " + JSON.stringify(rows));
  await agree("the consumer dead-letter panel", async () => {
    const rows = await consumerDead();
    const shown = await table(page, "cdead-rows");
    const problems = [];
    if (shown.length !== rows.length) problems.push(`${shown.length} rows shown, the API has ${rows.length}`);
    for (const d of rows) {
      const row = shown.find((r) => r.id === "cdead-" + d.id);
      if (!row) { problems.push("no row for consumer dead letter " + d.id); continue; }
      const s = row.cells;
      const key = none(d.key) ? "–" : typeof d.key === "string" ? d.key : JSON.stringify(d.key);
      diff(problems, d.id, "consumer", s.consumer, d.consumer);
      diff(problems, d.id, "key", s.key, key);
      diff(problems, d.id, "state", s.state, d.state + (d.redrive_with ? " with " + d.redrive_with : ""));
      diff(problems, d.id, "attempts", s.attempts, String(d.attempts));
      diff(problems, d.id, "handler", s.handler, d.handler);
      diff(problems, d.id, "error", s.error, d.error);
      const buttons = await page.$$(`#cdead-${d.id} button`);
      if (d.state === "dead" && buttons.length !== 2) problems.push(`dead letter ${d.id} has ${buttons.length} buttons, want redrive and discard`);
      if (d.state !== "dead" && buttons.length !== 0) problems.push(`${d.state} row ${d.id} offers buttons`);
    }
    return problems;
  });
}

let code = 0;
try {
  const page = await browser.newPage();
  const external = [];
  page.on("request", (r) => { if (!r.url().startsWith(url)) external.push(r.url()); });
  await page.goto(url);
  await page.fill("#token", token);
  await page.click("#save-token");
  await page.waitForSelector("#consumer-billing", { timeout: 15000 });

  await checkOutbox(page);
  await checkConsumers(page);
  await checkPlugins(page);
  await checkConsumerDead(page);
  await page.screenshot({ path: process.env.SHOT, fullPage: true });

  // The relay's dead event.
  await page.waitForSelector("#redrive-1", { timeout: 15000 });
  const reason = await page.textContent("#dead-1");
  if (!reason.includes("poison")) fail("dead row does not show its reason: " + reason);
  if ((await page.textContent("#dead")).trim() !== "1") fail("the dead counter is not 1");
  await page.click("#redrive-1");
  await page.waitForSelector("#redrive-1", { state: "detached", timeout: 15000 });
  await page.waitForFunction(() => document.getElementById("dead").textContent.trim() === "0", null, { timeout: 15000 });

  // A consumer dead letter redriven, another discarded with a reason
  // (refused without one).
  await page.click(`#credrive-${redriveId}`);
  await page.waitForSelector(`#credrive-${redriveId}`, { state: "detached", timeout: 15000 });
  await page.click(`#cdiscard-${discardId}`);
  await page.waitForFunction(() => document.getElementById("cdead-action").textContent.includes("discard reason"), null, { timeout: 5000 });
  if (!(await page.$(`#cdiscard-${discardId}`))) fail("discard went ahead without a reason");
  await page.fill("#cdiscard-reason", "fixed by hand in billing");
  await page.click(`#cdiscard-${discardId}`);
  await page.waitForSelector(`#cdead-${discardId}`, { state: "detached", timeout: 15000 });
  await page.waitForFunction(() => document.querySelector("#consumer-billing td[data-field=dead_letters]").textContent === "0",
    null, { timeout: 15000 });
  if (external.length > 0) fail("the page loaded external assets: " + external.join(", "));
  console.log("dashboard: panels agree with the API; relay redrive, consumer redrive and discard clicked; screenshot at " + process.env.SHOT);
} catch (e) {
  console.error("dashboard test FAILED: " + (e instanceof Failure ? e.message : e.stack || e.message));
  code = 1;
}
await browser.close();
process.exit(code);
