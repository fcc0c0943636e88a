// Builds src/app.js into an outbox:plugin `transformer` component:
//   node build.mjs <wit dir> <out.wasm>
// componentize-js embeds the StarlingMonkey engine it ships with, so the
// build needs no network once `npm ci` has installed it. The guest gets no
// WASI features it does not use.
import { componentize } from "@bytecodealliance/componentize-js";
import { readFile, writeFile, rename } from "node:fs/promises";

const [witPath, out] = process.argv.slice(2);
if (!witPath || !out) {
  console.error("usage: node build.mjs <wit dir> <out.wasm>");
  process.exit(2);
}
const source = await readFile(new URL("./src/app.js", import.meta.url), "utf8");
const { component } = await componentize(source, {
  witPath,
  worldName: "transformer",
  disableFeatures: ["random", "stdio", "clocks", "http", "fetch-event"],
});
await writeFile(`${out}.tmp`, component);
await rename(`${out}.tmp`, out);
console.log(`js-tag: wrote ${out} (${component.length} bytes)`);
