// Copies the built charting library (uPlot's minified IIFE bundle, its CSS and its licence)
// from node_modules into the Python package's static folder, where the server serves it and
// the wheel ships it. Run `npm ci && npm run build` here after changing the uPlot version;
// the copied files are committed, node_modules is not.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "node_modules", "uplot");
const out = join(here, "..", "static", "vendor");
mkdirSync(out, { recursive: true });

const version = JSON.parse(readFileSync(join(src, "package.json"), "utf8")).version;
for (const [from, to] of [
  ["dist/uPlot.iife.min.js", "uPlot.iife.min.js"],
  ["dist/uPlot.min.css", "uPlot.min.css"],
  ["LICENSE", "uPlot.LICENSE"],
]) {
  copyFileSync(join(src, from), join(out, to));
}
writeFileSync(join(out, "VERSIONS.txt"), `uplot ${version} (npm), copied by web/frontend/build.mjs\n`);
console.log(`copied uPlot ${version} to ${out}`);
