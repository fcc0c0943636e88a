// Builds a JavaScript plugin into an outbox:plugin component:
//   node build.mjs <wit dir> <out.wasm> [<world> <source.js> [<module dir>...]]
// Without a world and a source it builds this directory's src/app.js as a
// `transformer`. The source's directory and each module dir (for example
// guest-sdk/js, the outboxd helper modules) are staged into one temporary
// directory, so the source imports them as "./outboxd_guest.js".
// componentize-js embeds the StarlingMonkey engine it ships with, so the
// build needs no network once `npm ci` has installed it. The guest gets no
// WASI features it does not use (wasi:http is imported through the WIT
// world, never through the engine's fetch).
import { componentize } from "@bytecodealliance/componentize-js";
import { cp, mkdtemp, readdir, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const [witArg, outArg, world = "transformer", source, ...moduleDirs] = process.argv.slice(2);
if (!witArg || !outArg) {
  console.error("usage: node build.mjs <wit dir> <out.wasm> [<world> <source.js> [<module dir>...]]");
  process.exit(2);
}
const witPath = resolve(witArg);
const out = resolve(outArg);
const src = resolve(source ?? join(dirname(fileURLToPath(import.meta.url)), "src/app.js"));
const stage = await mkdtemp(join(tmpdir(), "outboxd-js-"));
try {
  for (const dir of [dirname(src), ...moduleDirs.map((d) => resolve(d))]) {
    for (const name of await readdir(dir)) {
      if (name.endsWith(".js") || name.endsWith(".mjs")) await cp(join(dir, name), join(stage, name));
    }
  }
  process.chdir(stage);
  const { component } = await componentize({
    sourcePath: join(stage, basename(src)),
    witPath,
    worldName: world,
    disableFeatures: ["random", "stdio", "clocks", "http", "fetch-event"],
  });
  await writeFile(`${out}.tmp`, component);
  await rename(`${out}.tmp`, out);
  console.log(`${basename(src)}: wrote ${out} (${component.length} bytes, world ${world})`);
} finally {
  await rm(stage, { recursive: true, force: true });
}
