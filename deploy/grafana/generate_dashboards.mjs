// Generates the Grafana dashboards in deploy/grafana/dashboards/ (plain JSON,
// importable by hand or through provisioning/dashboards.yaml). The JSON files
// are committed; tests/deploy/check_dashboards.mjs fails when they differ from
// what this script writes, so edit here and rerun:
//   node deploy/grafana/generate_dashboards.mjs
// Every query uses only metric names the daemons export (docs/operations.md,
// "Metrics reference"; checked by tests/deploy/check_metric_names.sh) and the
// labels deploy/prometheus/*.yml attach (job, pool, namespace, release).
import { writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const outDir = join(dirname(fileURLToPath(import.meta.url)), 'dashboards');
const DS = { type: 'prometheus', uid: '${datasource}' };

// Label matchers every query carries, so one Grafana can watch several
// releases; "All" is ".*", which also matches series without the label
// (daemons scraped with prometheus.yml have no namespace/release).
const SCOPE = 'namespace=~"$namespace", release=~"$release"';
const sel = (extra = '') => `{${SCOPE}${extra ? `, ${extra}` : ''}}`;
const rate = (metric, extra = '') => `rate(${metric}${sel(extra)}[$__rate_interval])`;
const quantile = (q, metric, by, extra = '') =>
  `histogram_quantile(${q}, sum by (le${by ? `, ${by}` : ''}) (${rate(`${metric}_bucket`, extra)}))`;
const mean = (metric, by, extra = '') => {
  const g = by ? `sum by (${by})` : 'sum';
  return `${g} (${rate(`${metric}_sum`, extra)}) / ${g} (${rate(`${metric}_count`, extra)})`;
};

function variables(extra = []) {
  const query = (name, label, q) => ({
    name, label, type: 'query', datasource: DS,
    definition: q, query: { query: q, refId: `${name}-var` },
    includeAll: true, allValue: '.*', multi: true,
    current: { text: 'All', value: '$__all' }, refresh: 2, sort: 1, hide: 0, options: [],
  });
  return {
    list: [
      { name: 'datasource', label: 'Data source', type: 'datasource', query: 'prometheus',
        current: {}, hide: 0, options: [], refresh: 1 },
      query('namespace', 'Namespace', 'label_values(vericache_build_info, namespace)'),
      query('release', 'Release', `label_values(vericache_build_info{namespace=~"$namespace"}, release)`),
      ...extra.map((v) => query(v.name, v.label, v.query)),
    ],
  };
}

// Panels flow left to right in rows of 24 grid units; a row header starts a
// new line.
function layout(items) {
  const panels = [];
  let x = 0, y = 0, rowH = 0, id = 1;
  for (const it of items) {
    if (it.row) {
      if (x > 0) { y += rowH; x = 0; rowH = 0; }
      panels.push({ type: 'row', title: it.row, id: id++, collapsed: false,
        gridPos: { h: 1, w: 24, x: 0, y }, panels: [] });
      y += 1;
      continue;
    }
    const w = it.w ?? 12, h = it.h ?? 8;
    if (x + w > 24) { y += rowH; x = 0; rowH = 0; }
    panels.push(panel(it, id++, { h, w, x, y }));
    x += w;
    rowH = Math.max(rowH, h);
  }
  return panels;
}

function panel(it, id, gridPos) {
  const type = it.type ?? 'timeseries';
  const targets = it.targets.map(([expr, legendFormat], i) => ({
    refId: String.fromCharCode(65 + i), datasource: DS, expr, legendFormat: legendFormat ?? '',
    ...(type === 'heatmap' ? { format: 'heatmap' } : {}),
    ...(type === 'stat' ? { instant: true } : {}),
  }));
  const defaults = { unit: it.unit ?? 'short' };
  if (it.min !== undefined) defaults.min = it.min;
  if (it.max !== undefined) defaults.max = it.max;
  if (it.thresholds) {
    defaults.thresholds = { mode: 'absolute', steps: it.thresholds.map(([value, color]) => ({ value, color })) };
    if (type === 'stat') defaults.color = { mode: 'thresholds' };
  }
  const options = {
    timeseries: { legend: { displayMode: 'list', placement: 'bottom', showLegend: true },
      tooltip: { mode: 'multi', sort: 'desc' } },
    stat: { reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      colorMode: 'value', graphMode: 'none', textMode: 'auto' },
    heatmap: { calculate: false, yAxis: { axisPlacement: 'left' }, cellGap: 1,
      color: { mode: 'scheme', scheme: 'Oranges', steps: 64 }, tooltip: { show: true } },
  }[type];
  return { type, title: it.title, description: it.description, id, gridPos, datasource: DS,
    fieldConfig: { defaults, overrides: [] }, options, targets };
}

function dashboard(uid, title, description, items, extraVars) {
  return {
    uid, title, description, tags: ['vericache'], editable: true, graphTooltip: 1,
    id: null, version: 1, schemaVersion: 39, refresh: '30s', timezone: '',
    time: { from: 'now-1h', to: 'now' }, timepicker: {},
    annotations: { list: [] },
    links: [{ title: 'VeriCache dashboards', type: 'dashboards', tags: ['vericache'],
      asDropdown: true, includeVars: true, keepTime: true }],
    templating: variables(extraVars),
    panels: layout(items),
  };
}

// ---- Overview -------------------------------------------------------------------
const overview = dashboard('vericache-overview', 'VeriCache / Overview',
  'Requests, latency and whether speculation pays off, for the whole cluster.', [
    { row: 'Traffic' },
    { title: 'Requests by mode and outcome', unit: 'reqps',
      description: 'Finished requests per second (vericache_requests_total).',
      targets: [[`sum by (mode, outcome) (${rate('vericache_requests_total')})`, '{{mode}} {{outcome}}']] },
    { title: 'Active and queued requests', w: 6,
      description: 'Requests decoding now, and requests waiting for a verify slot.',
      targets: [[`sum (vericache_active_requests${sel()})`, 'active'],
        [`sum (vericache_queue_depth${sel()})`, 'queued']] },
    { title: 'Error ratio', type: 'stat', unit: 'percentunit', w: 6,
      thresholds: [[null, 'green'], [0.01, 'orange'], [0.05, 'red']],
      description: 'Share of requests that ended with outcome=error over the last 5 minutes.',
      targets: [[`sum (rate(vericache_requests_total${sel('outcome="error"')}[5m])) / sum (rate(vericache_requests_total${sel()}[5m]))`]] },
    { title: 'Admission rejections', unit: 'reqps', w: 12,
      description: 'Requests turned away with RESOURCE_EXHAUSTED (queue full), and requests that had to queue.',
      targets: [[`sum (${rate('vericache_admission_rejections_total')})`, 'rejected'],
        [`sum (${rate('vericache_scheduler_queued_total')})`, 'queued']] },
    { title: 'Daemons up', w: 12,
      description: 'Scrape targets up, per daemon kind.',
      targets: [[`sum by (job) (up{job=~"vericache-.*", ${SCOPE}})`, '{{job}}']] },
    { row: 'Latency' },
    { title: 'Time to first token', unit: 's',
      description: 'p50 and p99 by mode (vericache_ttft_seconds).',
      targets: [[quantile(0.5, 'vericache_ttft_seconds', 'mode'), 'p50 {{mode}}'],
        [quantile(0.99, 'vericache_ttft_seconds', 'mode'), 'p99 {{mode}}']] },
    { title: 'Time per output token', unit: 's',
      description: 'p50 and p99 by mode (vericache_time_per_output_token_seconds).',
      targets: [[quantile(0.5, 'vericache_time_per_output_token_seconds', 'mode'), 'p50 {{mode}}'],
        [quantile(0.99, 'vericache_time_per_output_token_seconds', 'mode'), 'p99 {{mode}}']] },
    { row: 'Speculation' },
    { title: 'Drafts accepted per verify round (mean)', w: 8, min: 0,
      thresholds: [[null, 'red'], [1, 'orange'], [3, 'green']],
      description: 'Mean drafts accepted per verify round (0 to the draft length; the round also yields one token of the verifier). Alert VericacheAcceptanceCollapse fires below 1.',
      targets: [[mean('vericache_accepted_tokens_per_round'), 'mean']] },
    { title: 'Drafts accepted per verify round (distribution)', type: 'heatmap', w: 16,
      description: 'Histogram of vericache_accepted_tokens_per_round over time.',
      targets: [[`sum by (le) (${rate('vericache_accepted_tokens_per_round_bucket')})`, '{{le}}']] },
    { title: 'Verify rounds, fallbacks, wasted drafts', unit: 'ops', w: 12,
      description: 'Verify rounds per second, fallbacks to full-KV decoding, and drafted tokens thrown away.',
      targets: [[`sum (${rate('vericache_verify_rounds_total')})`, 'verify rounds/s'],
        [`sum (${rate('vericache_fallbacks_total')})`, 'fallbacks/s'],
        [`sum (${rate('vericache_drafted_tokens_wasted_total')})`, 'wasted drafts/s']] },
    { title: 'Lossless shadow checks (last hour)', type: 'stat', w: 12,
      thresholds: [[null, 'green'], [1, 'red']],
      description: 'Requests re-run in full_local mode and compared; any mismatch is a correctness bug.',
      targets: [[`sum by (result) (increase(vericache_lossless_check_total${sel()}[1h]))`, '{{result}}']] },
    { row: 'Versions' },
    { title: 'Build versions', type: 'stat', w: 24, h: 4,
      description: 'Pods per daemon kind and version (vericache_build_info).',
      targets: [[`count by (job, version) (vericache_build_info${sel()})`, '{{job}} {{version}}']] },
  ]);

// ---- Per pool -----------------------------------------------------------------------
const P = 'pool=~"$pool"';
const pools = dashboard('vericache-pools', 'VeriCache / Pools',
  'Verifier and drafter pools: sessions, memory, compute and KV fetches per pool.', [
    { row: 'Load' },
    { title: 'Sessions held', description: 'Sessions per pool and role (vericache_worker_sessions).',
      targets: [[`sum by (pool, role) (vericache_worker_sessions${sel(P)})`, '{{role}} {{pool}}']] },
    { title: 'Workers up', description: 'Scrape targets up per pool.',
      targets: [[`sum by (pool, job) (up{job=~"vericache-(verifier|drafter)", ${SCOPE}, ${P}})`, '{{job}} {{pool}}']] },
    { title: 'KV memory in use', unit: 'bytes',
      description: 'Worker KV bytes by tier: device (resident) and transient (full KV loaded for a verify).',
      targets: [[`sum by (pool, role, tier) (vericache_worker_kv_bytes${sel(P)})`, '{{role}} {{pool}} {{tier}}']] },
    { title: 'Transient memory booked per verifier', unit: 'bytes',
      description: 'What the coordinator has booked on each verifier (vericache_scheduler_memory_booked_bytes) and what resident prefixes hold there (vericache_scheduler_memory_resident_bytes); together they stay within --verifier-memory-bytes.',
      targets: [[`max by (verifier) (vericache_scheduler_memory_booked_bytes${sel()})`, 'booked {{verifier}}'],
        [`max by (verifier) (vericache_scheduler_memory_resident_bytes${sel()})`, 'resident {{verifier}}']] },
    { row: 'Compute' },
    { title: 'Forward pass time', unit: 's',
      description: 'p50 and p99 of one forward pass (draft step or verify) per pool.',
      targets: [[quantile(0.5, 'vericache_worker_forward_seconds', 'pool, role', P), 'p50 {{role}} {{pool}}'],
        [quantile(0.99, 'vericache_worker_forward_seconds', 'pool, role', P), 'p99 {{role}} {{pool}}']] },
    { title: 'Requests per verify batch', 
      description: 'Mean and p90 of requests verified together (vericache_verify_batch_requests).',
      targets: [[mean('vericache_verify_batch_requests', 'pool', P), 'mean {{pool}}'],
        [quantile(0.9, 'vericache_verify_batch_requests', 'pool', P), 'p90 {{pool}}']] },
    { row: 'KV fetches' },
    { title: 'KV fetched', unit: 'Bps',
      description: 'Bytes per second workers fetch from the store (vericache_worker_fetch_bytes_total).',
      targets: [[`sum by (pool, role) (${rate('vericache_worker_fetch_bytes_total', P)})`, '{{role}} {{pool}}']] },
    { title: 'Fetch time', unit: 's',
      description: 'p50 and p99 of one KV fetch.',
      targets: [[quantile(0.5, 'vericache_worker_fetch_seconds', 'pool, role', P), 'p50 {{role}} {{pool}}'],
        [quantile(0.99, 'vericache_worker_fetch_seconds', 'pool, role', P), 'p99 {{role}} {{pool}}']] },
    { title: 'Prefix loads', unit: 'ops',
      description: 'Full prefix loads per second, and loads saved because requests sharing a prefix were verified in one batch.',
      targets: [[`sum by (pool, role) (${rate('vericache_prefix_loads_total', P)})`, 'loads {{role}} {{pool}}'],
        [`sum by (pool) (${rate('vericache_prefix_load_shared_total', P)})`, 'saved {{pool}}']] },
  ], [{ name: 'pool', label: 'Pool', query: 'label_values(vericache_worker_sessions{namespace=~"$namespace"}, pool)' }]);

// ---- Per link ------------------------------------------------------------------------
const L = 'link=~"$link"';
const links = dashboard('vericache-links', 'VeriCache / Links',
  'The store->verifier (fast) and store->drafter (slow) links: traffic, utilisation and what the scheduler books.', [
    { row: 'Traffic' },
    { title: 'Bytes sent', unit: 'Bps',
      description: 'Chunk bytes per second the store sends on each link (vericache_link_bytes_total).',
      targets: [[`sum by (link) (${rate('vericache_link_bytes_total', L)})`, '{{link}}']] },
    { title: 'Utilisation (measured)', unit: 'percentunit', min: 0, max: 1,
      thresholds: [[null, 'green'], [0.9, 'red']],
      description: 'Share of time the link was sending (rate of vericache_link_busy_seconds_total); alert VericacheLinkSaturated above 0.9.',
      targets: [[`max by (link) (${rate('vericache_link_busy_seconds_total', L)})`, '{{link}}']] },
    { title: 'Booked by the scheduler', unit: 'percentunit', min: 0,
      description: 'Booked seconds / slot seconds in the current slot (vericache_scheduler_link_occupancy_ratio).',
      targets: [[`max by (link) (vericache_scheduler_link_occupancy_ratio${sel(L)})`, '{{link}}']] },
    { title: 'Throughput / paced capacity', unit: 'percentunit', min: 0,
      description: 'Bytes sent over the capacity the store paces to (links that are not paced show no line).',
      targets: [[`sum by (link) (${rate('vericache_link_bytes_total', L)}) / (max by (link) (vericache_link_capacity_bytes_per_second${sel(L)}) > 0)`, '{{link}}']] },
    { row: 'Receivers' },
    { title: 'KV fetched by role', unit: 'Bps',
      description: 'Verifiers fetch full KV over the fast link, drafters compressed KV over the slow one.',
      targets: [[`sum by (role) (${rate('vericache_worker_fetch_bytes_total')})`, '{{role}}']] },
    { title: 'Fetch time p99 by role', unit: 's',
      targets: [[quantile(0.99, 'vericache_worker_fetch_seconds', 'role'), '{{role}}']] },
    { title: 'Paced capacity', unit: 'Bps',
      description: 'vericache_link_capacity_bytes_per_second (0 = unpaced).',
      targets: [[`max by (link) (vericache_link_capacity_bytes_per_second${sel(L)})`, '{{link}}']] },
    { title: 'Requests waiting for a slot', 
      description: 'Queue depth: when a link is booked full, verifies wait here.',
      targets: [[`sum (vericache_queue_depth${sel()})`, 'queued']] },
  ], [{ name: 'link', label: 'Link', query: 'label_values(vericache_link_bytes_total{namespace=~"$namespace"}, link)' }]);

// ---- KV store --------------------------------------------------------------------------
const kvstore = dashboard('vericache-kvstore', 'VeriCache / KV store',
  'vc-kvstore: RPCs, tiers, hit ratio, evictions and RocksDB latency.', [
    { row: 'RPCs' },
    { title: 'RPCs by method and code', unit: 'reqps',
      targets: [[`sum by (method, code) (${rate('vericache_kvstore_requests_total')})`, '{{method}} {{code}}']] },
    { title: 'RPC time p99 by method', unit: 's',
      targets: [[quantile(0.99, 'vericache_kvstore_request_seconds', 'method'), '{{method}}']] },
    { title: 'Server-side error ratio', type: 'stat', unit: 'percentunit', w: 8,
      thresholds: [[null, 'green'], [0.01, 'red']],
      description: 'Same error codes as alert VericacheKvStoreErrors (NOT_FOUND is a miss, not an error).',
      targets: [[`sum (rate(vericache_kvstore_requests_total${sel('code=~"INTERNAL|UNKNOWN|DATA_LOSS|UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED"')}[5m])) / sum (rate(vericache_kvstore_requests_total${sel()}[5m]))`]] },
    { title: 'Hit ratio', type: 'stat', unit: 'percentunit', w: 8,
      description: 'Gets served from DRAM or disk over all gets, last 15 minutes.',
      targets: [[`sum (increase(vericache_kvstore_hits_total${sel()}[15m])) / (sum (increase(vericache_kvstore_hits_total${sel()}[15m])) + sum (increase(vericache_kvstore_misses_total${sel()}[15m])))`]] },
    { title: 'Hits and misses', unit: 'ops', w: 8,
      targets: [[`sum by (tier) (${rate('vericache_kvstore_hits_total')})`, 'hit {{tier}}'],
        [`sum (${rate('vericache_kvstore_misses_total')})`, 'miss']] },
    { row: 'Tiers' },
    { title: 'Bytes held by tier', unit: 'bytes',
      targets: [[`sum by (tier) (vericache_kvstore_bytes${sel()})`, '{{tier}}']] },
    { title: 'Entries by tier',
      targets: [[`sum by (tier) (vericache_kvstore_entries${sel()})`, '{{tier}}']] },
    { title: 'Evictions', unit: 'ops',
      description: 'Entries evicted (budget) or expired (TTL) per second.',
      targets: [[`sum by (tier) (${rate('vericache_kvstore_evictions_total')})`, '{{tier}}']] },
    { row: 'RocksDB' },
    { title: 'RocksDB write time', unit: 's',
      description: 'p50 and p99; alert VericacheKvStoreSlowWrites above 0.5 s at p99.',
      targets: [[quantile(0.5, 'vericache_kvstore_rocksdb_write_seconds'), 'p50'],
        [quantile(0.99, 'vericache_kvstore_rocksdb_write_seconds'), 'p99']] },
    { title: 'RocksDB read time', unit: 's',
      targets: [[quantile(0.5, 'vericache_kvstore_rocksdb_read_seconds'), 'p50'],
        [quantile(0.99, 'vericache_kvstore_rocksdb_read_seconds'), 'p99']] },
  ]);

mkdirSync(outDir, { recursive: true });
const out = { 'overview.json': overview, 'pools.json': pools, 'links.json': links, 'kvstore.json': kvstore };
const only = process.argv[2];  // optional: write into this directory instead (the test compares)
for (const [file, d] of Object.entries(out)) {
  const dir = only ?? outDir;
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, file), `${JSON.stringify(d, null, 2)}\n`);
}
