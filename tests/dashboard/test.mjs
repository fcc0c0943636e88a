// Drives the dashboard in headless Chromium: enter the token, see the dead
// event, click its redrive button, and watch it leave the dead-letter table.
import { chromium } from "playwright-core";

const url = process.env.URL;
const token = process.env.TOKEN;
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const fail = async (msg) => { console.error("dashboard test FAILED: " + msg); await browser.close(); process.exit(1); };
try {
  const page = await browser.newPage();
  const external = [];
  page.on("request", (r) => { if (!r.url().startsWith(url)) external.push(r.url()); });
  await page.goto(url);
  await page.fill("#token", token);
  await page.click("#save-token");
  await page.waitForSelector("#redrive-1", { timeout: 15000 });
  const reason = await page.textContent("#dead-1");
  if (!reason.includes("poison")) await fail("dead row does not show its reason: " + reason);
  if ((await page.textContent("#dead")).trim() !== "1") await fail("the dead counter is not 1");
  await page.click("#redrive-1");
  await page.waitForSelector("#redrive-1", { state: "detached", timeout: 15000 });
  await page.waitForFunction(() => document.getElementById("dead").textContent.trim() === "0", null, { timeout: 15000 });
  await page.screenshot({ path: process.env.SHOT, fullPage: true });
  if (external.length > 0) await fail("the page loaded external assets: " + external.join(", "));
  console.log("dashboard: redrive click moved the event; screenshot at " + process.env.SHOT);
} catch (e) {
  await fail(e.message);
}
await browser.close();
