// Checks deploy/grafana/dashboards/*.json:
//   - the committed files are what deploy/grafana/generate_dashboards.mjs writes;
//   - structure: unique dashboard uids and panel ids, panels inside the 24-column
//     grid and not overlapping, every panel has a query, every query goes to
//     the ${datasource} variable, every $variable a query uses is defined;
//   - writes a `promtool test rules` file (argument PROMQL_TEST_OUT) with one
//     promql_expr_test per query (Grafana variables replaced by what Grafana
//     would send), so promtool parses and evaluates every query: a syntax
//     error fails the test.
// usage: node check_dashboards.mjs REPO_ROOT PROMQL_TEST_OUT
// Exit 0 ok, 1 problems (printed), 2 usage.
import { readFileSync, readdirSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [repo, testOut] = process.argv.slice(2);
if (!repo || !testOut) {
  console.error('usage: node check_dashboards.mjs REPO_ROOT PROMQL_TEST_OUT');
  process.exit(2);
}
const dashDir = join(repo, 'deploy', 'grafana', 'dashboards');
const problems = [];

// ---- committed == generated ---------------------------------------------------------
const regen = mkdtempSync(join(tmpdir(), 'vc-dash-'));
try {
  execFileSync('node', [join(repo, 'deploy', 'grafana', 'generate_dashboards.mjs'), regen]);
  const generated = readdirSync(regen).sort();
  const committed = readdirSync(dashDir).filter((f) => f.endsWith('.json')).sort();
  if (JSON.stringify(generated) !== JSON.stringify(committed)) {
    problems.push(`dashboard files ${committed.join(',')} != generated ${generated.join(',')}`);
  }
  for (const f of generated) {
    let a = '';
    try { a = readFileSync(join(dashDir, f), 'utf8'); } catch { continue; }
    if (a !== readFileSync(join(regen, f), 'utf8')) {
      problems.push(`${f} differs from what generate_dashboards.mjs writes: rerun ` +
        '`node deploy/grafana/generate_dashboards.mjs` and commit the result');
    }
  }
} finally {
  rmSync(regen, { recursive: true, force: true });
}

// ---- structure -----------------------------------------------------------------------------
const uids = new Set();
const exprTests = [];
const BUILTIN = new Set(['__rate_interval', '__interval', '__range', '__range_s', '__interval_ms']);
// What Grafana substitutes before the query reaches Prometheus.
const substitute = (expr) => expr
  .replaceAll('$__rate_interval', '1m').replaceAll('$__interval', '1m').replaceAll('$__range', '1h')
  .replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, '.*');

for (const file of readdirSync(dashDir).filter((f) => f.endsWith('.json')).sort()) {
  let d;
  try {
    d = JSON.parse(readFileSync(join(dashDir, file), 'utf8'));
  } catch (e) {
    problems.push(`${file}: not JSON: ${e.message}`);
    continue;
  }
  const where = (p) => `${file}: panel ${p.id} '${p.title}'`;
  if (!d.uid || uids.has(d.uid)) problems.push(`${file}: missing or duplicate uid '${d.uid}'`);
  uids.add(d.uid);
  if (!d.title) problems.push(`${file}: no title`);
  if (!Number.isInteger(d.schemaVersion)) problems.push(`${file}: no schemaVersion`);
  const vars = new Set((d.templating?.list ?? []).map((v) => v.name));
  if (!vars.has('datasource')) problems.push(`${file}: no datasource variable`);
  for (const v of d.templating?.list ?? []) {
    if (v.type === 'query') exprTests.push({ file, title: `variable ${v.name}`, expr: null, def: v.definition });
  }
  const ids = new Set();
  const cells = new Set();
  for (const p of d.panels ?? []) {
    if (!Number.isInteger(p.id) || ids.has(p.id)) problems.push(`${file}: duplicate or missing panel id ${p.id}`);
    ids.add(p.id);
    const g = p.gridPos ?? {};
    if (!(g.w > 0 && g.h > 0 && g.x >= 0 && g.y >= 0 && g.x + g.w <= 24)) {
      problems.push(`${where(p)}: gridPos ${JSON.stringify(g)} is outside the grid`);
    }
    for (let x = g.x; x < g.x + g.w; x++) {
      for (let y = g.y; y < g.y + g.h; y++) {
        if (cells.has(`${x},${y}`)) { problems.push(`${where(p)}: overlaps another panel`); x = 1e9; break; }
        cells.add(`${x},${y}`);
      }
    }
    if (p.type === 'row') continue;
    if (!p.title) problems.push(`${file}: panel ${p.id} has no title`);
    if (!Array.isArray(p.targets) || p.targets.length === 0) problems.push(`${where(p)}: no queries`);
    if (p.datasource?.uid !== '${datasource}') problems.push(`${where(p)}: datasource is not \${datasource}`);
    for (const t of p.targets ?? []) {
      if (typeof t.expr !== 'string' || !t.expr.trim()) { problems.push(`${where(p)}: empty query`); continue; }
      if (t.datasource?.uid !== '${datasource}') problems.push(`${where(p)}: query ${t.refId} datasource`);
      for (const m of t.expr.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g)) {
        if (!vars.has(m[1]) && !BUILTIN.has(m[1])) problems.push(`${where(p)}: uses undefined $${m[1]}`);
      }
      exprTests.push({ file, title: p.title, expr: t.expr });
    }
  }
}

// ---- promtool test file: every query must parse and evaluate ---------------------------
// label_values(metric{...}, label) is Grafana's, not PromQL: test its selector.
const lines = ['# Generated by tests/deploy/check_dashboards.mjs: every dashboard query.',
  'rule_files: []', 'evaluation_interval: 1m', 'tests:', '  - interval: 1m', '    input_series: []',
  '    promql_expr_test:'];
for (const t of exprTests) {
  let expr = t.expr;
  if (expr === null) {
    const m = t.def?.match(/^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$/);
    if (!m) { problems.push(`${t.file}: ${t.title}: unexpected definition '${t.def}'`); continue; }
    expr = m[1];
  }
  lines.push(`      # ${t.file}: ${t.title.replace(/\n/g, ' ')}`);
  lines.push(`      - expr: ${JSON.stringify(substitute(expr))}`);
  lines.push('        eval_time: 10m');
  lines.push('        exp_samples: []');
}
writeFileSync(testOut, `${lines.join('\n')}\n`);

if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  process.exit(1);
}
console.log(`check_dashboards: ${uids.size} dashboards, ${exprTests.length} queries, structure ok`);
