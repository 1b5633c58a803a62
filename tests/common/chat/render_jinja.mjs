// Renders chat templates with Hugging Face's @huggingface/jinja, the
// independent reference for chat_template_diff_test. Reads one JSON object on
// stdin: {"templates": {name: source}, "cases": [{"template": name,
// "vars": {...}}]}; writes a JSON array with, per case, {"ok": true, "text"}
// or {"ok": false, "error"}.
// Usage: node render_jinja.mjs TOOLS_DIR   (the package is in TOOLS_DIR/node_modules)
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const toolsDir = process.argv[2];
const entry = path.join(toolsDir, "node_modules", "@huggingface", "jinja", "dist", "index.js");
const { Template } = await import(pathToFileURL(entry).href);

const input = JSON.parse(readFileSync(0, "utf8"));
const parsed = {};
for (const [name, source] of Object.entries(input.templates)) {
  try {
    parsed[name] = { template: new Template(source) };
  } catch (e) {
    parsed[name] = { error: String(e && e.message ? e.message : e) };
  }
}
const results = input.cases.map((c) => {
  const t = parsed[c.template];
  if (t.error !== undefined) return { ok: false, error: "parse: " + t.error };
  try {
    return { ok: true, text: t.template.render(c.vars) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
