// Validates the manifests that `helm template` rendered from helm/vericache,
// offline: every object against the Kubernetes API schemas (kubernetes-models'
// validate()), the ServiceMonitor structurally (its CRD is not in
// kubernetes-models), then the cross-object rules an API server would only
// catch at run time (selectors that select nothing, named ports that do not
// exist, $(VAR) references that would reach the daemon unexpanded, ...) and the
// chart's own policy (non-root, read-only root filesystem, no capabilities,
// memory limits, gRPC probes).
//
// usage: node validate_manifests.mjs --tools DIR [--args-out FILE] RENDERED.yaml
//   --tools     where deploy/scripts/install_tools.sh installed the npm tools
//   --args-out  write [{daemon, container, object, args}] with $(VAR)s expanded
//               from the rendered ConfigMaps and env (check_chart_flags.sh
//               feeds them to each daemon's flag parser)
// Exit 0: all valid; 1: problems (each printed); 2: bad usage.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';

function usage(msg) {
  console.error(`validate_manifests: ${msg}`);
  console.error('usage: node validate_manifests.mjs --tools DIR [--args-out FILE] RENDERED.yaml');
  process.exit(2);
}

let toolsDir = process.env.VC_TOOLS_DIR || '/opt/vericache-tools';
let argsOut = null;
let input = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--tools') toolsDir = argv[++i];
  else if (argv[i] === '--args-out') argsOut = argv[++i];
  else if (argv[i].startsWith('--')) usage(`unknown flag ${argv[i]}`);
  else if (input === null) input = argv[i];
  else usage('one input file only');
}
if (!input) usage('no input file');
const modelsDir = join(toolsDir, 'node_modules', 'kubernetes-models');
const yamlEntry = join(toolsDir, 'node_modules', 'yaml', 'dist', 'index.js');
if (!existsSync(modelsDir) || !existsSync(yamlEntry)) {
  usage(`kubernetes-models or yaml not found under ${toolsDir}; run deploy/scripts/install_tools.sh`);
}
const YAML = (await import(pathToFileURL(yamlEntry).href)).default;

const problems = [];
const problem = (obj, msg) => problems.push(`${obj ? describe(obj) : '(render)'}: ${msg}`);
const describe = (o) => `${o.kind ?? '?'}/${o.metadata?.name ?? '?'}`;

// ---- parse --------------------------------------------------------------------
const docs = YAML.parseAllDocuments(readFileSync(input, 'utf8'), { prettyErrors: true });
const objects = [];
for (const doc of docs) {
  if (doc.errors.length) {
    for (const e of doc.errors) problem(null, `YAML error: ${e.message}`);
    continue;
  }
  const obj = doc.toJS();
  if (obj === null || obj === undefined) continue;  // empty document between ---
  if (typeof obj !== 'object' || Array.isArray(obj)) {
    problem(null, `a document is not an object: ${JSON.stringify(obj).slice(0, 80)}`);
    continue;
  }
  objects.push(obj);
}
if (objects.length === 0) problem(null, 'no objects rendered');

// ---- schema validation -----------------------------------------------------------
// apiVersion "group/version" -> kubernetes-models/<group>/<version>/<Kind>.js;
// the core group ("v1") lives in kubernetes-models/v1/.
// (4.x ships ESM as .mjs beside CommonJS .js; 5.x ESM as .js.)
async function modelClass(apiVersion, kind) {
  for (const ext of ['.mjs', '.js']) {
    const file = join(modelsDir, ...apiVersion.split('/'), `${kind}${ext}`);
    if (!existsSync(file)) continue;
    const mod = await import(pathToFileURL(file).href);
    const cls = mod[kind] ?? mod.default?.[kind];
    if (cls) return cls;
  }
  return null;
}

const DURATION = /^[0-9]+(ms|s|m|h)$/;
function validateServiceMonitor(o) {
  const s = o.spec;
  if (o.apiVersion !== 'monitoring.coreos.com/v1') problem(o, `apiVersion ${o.apiVersion}`);
  if (!s || typeof s !== 'object') return problem(o, 'no spec');
  if (!s.selector?.matchLabels || !Object.keys(s.selector.matchLabels).length) {
    problem(o, 'spec.selector.matchLabels is empty (would select every Service)');
  }
  if (!Array.isArray(s.endpoints) || s.endpoints.length === 0) problem(o, 'no spec.endpoints');
  for (const [i, ep] of (s.endpoints ?? []).entries()) {
    if (typeof ep.port !== 'string' || !ep.port) problem(o, `endpoints[${i}].port must name a port`);
    for (const k of ['interval', 'scrapeTimeout']) {
      if (ep[k] !== undefined && !DURATION.test(ep[k])) problem(o, `endpoints[${i}].${k} '${ep[k]}'`);
    }
    for (const [j, r] of (ep.relabelings ?? []).entries()) {
      if (!Array.isArray(r.sourceLabels) && r.action !== 'replace') {
        problem(o, `endpoints[${i}].relabelings[${j}] has no sourceLabels`);
      }
      if (r.targetLabel !== undefined && !/^[a-zA-Z_][a-zA-Z0-9_]*$/.test(r.targetLabel)) {
        problem(o, `endpoints[${i}].relabelings[${j}].targetLabel '${r.targetLabel}'`);
      }
    }
  }
  return undefined;
}

// cert-manager's Certificate (its CRD is not in kubernetes-models either):
// the fields the daemons depend on.
function validateCertificate(o) {
  const s = o.spec;
  if (o.apiVersion !== 'cert-manager.io/v1') problem(o, `apiVersion ${o.apiVersion}`);
  if (!s || typeof s !== 'object') return problem(o, 'no spec');
  if (!s.secretName) problem(o, 'no spec.secretName');
  if (!s.issuerRef?.name) problem(o, 'no spec.issuerRef.name');
  if (!Array.isArray(s.dnsNames) || s.dnsNames.length === 0) problem(o, 'no spec.dnsNames');
  for (const u of ['server auth', 'client auth']) {
    if (!(s.usages ?? []).includes(u)) problem(o, `spec.usages lacks '${u}' (mutual TLS needs both)`);
  }
  for (const k of ['duration', 'renewBefore']) {
    if (s[k] !== undefined && !DURATION.test(s[k])) problem(o, `spec.${k} '${s[k]}'`);
  }
  return undefined;
}

for (const o of objects) {
  if (typeof o.apiVersion !== 'string' || typeof o.kind !== 'string') {
    problem(o, 'missing apiVersion or kind');
    continue;
  }
  if (o.kind === 'ServiceMonitor') {
    validateServiceMonitor(o);
    continue;
  }
  if (o.kind === 'Certificate') {
    validateCertificate(o);
    continue;
  }
  const Model = await modelClass(o.apiVersion, o.kind);
  if (!Model) {
    problem(o, `unknown kind ${o.apiVersion} ${o.kind} (not in kubernetes-models)`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    const details = (e.errors ?? []).map((x) => `${x.instancePath} ${x.message ?? x.keyword}`);
    problem(o, `schema: ${details.length ? details.join('; ') : e.message}`);
  }
}

// ---- names -------------------------------------------------------------------------
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const seen = new Set();
for (const o of objects) {
  const name = o.metadata?.name;
  if (!name) { problem(o, 'no metadata.name'); continue; }
  const key = `${o.apiVersion}/${o.kind}/${name}`;
  if (seen.has(key)) problem(o, 'rendered twice');
  seen.add(key);
  const labelName = ['Service', 'StatefulSet'].includes(o.kind);  // pod hostnames, DNS labels
  if (labelName ? !(DNS1123_LABEL.test(name) && name.length <= 63)
                : !(DNS1123_SUBDOMAIN.test(name) && name.length <= 253)) {
    problem(o, `invalid name '${name}'`);
  }
  for (const [k, v] of Object.entries(o.metadata.labels ?? {})) {
    if (typeof v !== 'string' || v.length > 63 || !/^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/.test(v)) {
      problem(o, `label ${k}='${v}' is not a valid label value`);
    }
  }
}

// ---- workloads ------------------------------------------------------------------------
const byKind = (k) => objects.filter((o) => o.kind === k);
const configMaps = new Map(byKind('ConfigMap').map((c) => [c.metadata.name, c.data ?? {}]));
const workloads = objects.filter((o) => ['Deployment', 'StatefulSet'].includes(o.kind));
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => (labels ?? {})[k] === v);
const DAEMONS = ['vc-kvstore', 'vc-coordinator', 'vc-verifier', 'vc-drafter'];
// HTTP daemons: probed over HTTP(S) (readiness GET /health) instead of gRPC.
const HTTP_DAEMONS = ['vc-openai'];
const daemonArgs = [];

function checkContainer(o, podSpec, c, isInit, claimNames) {
  const where = `${isInit ? 'initContainer' : 'container'} ${c.name}`;
  const sc = c.securityContext ?? {};
  const podSc = podSpec.securityContext ?? {};
  if (!(sc.runAsNonRoot ?? podSc.runAsNonRoot)) problem(o, `${where}: runAsNonRoot is not set`);
  if ((sc.runAsUser ?? podSc.runAsUser) === 0) problem(o, `${where}: runs as uid 0`);
  if (sc.readOnlyRootFilesystem !== true) problem(o, `${where}: root filesystem is writable`);
  if (sc.allowPrivilegeEscalation !== false) problem(o, `${where}: allowPrivilegeEscalation is not false`);
  if (!(sc.capabilities?.drop ?? []).includes('ALL')) problem(o, `${where}: capabilities do not drop ALL`);
  if (sc.privileged) problem(o, `${where}: privileged`);
  if (!c.resources?.requests?.memory || !c.resources?.limits?.memory) {
    problem(o, `${where}: needs memory requests and limits`);
  }
  const gpuReq = c.resources?.requests?.['nvidia.com/gpu'];
  const gpuLim = c.resources?.limits?.['nvidia.com/gpu'];
  if (gpuReq !== gpuLim) problem(o, `${where}: nvidia.com/gpu requests ${gpuReq} != limits ${gpuLim}`);

  const volumes = new Set([...(podSpec.volumes ?? []).map((v) => v.name), ...claimNames]);
  for (const m of c.volumeMounts ?? []) {
    if (!volumes.has(m.name)) problem(o, `${where}: mounts unknown volume '${m.name}'`);
  }
  const portNames = new Set();
  for (const p of c.ports ?? []) {
    if (!(p.containerPort >= 1 && p.containerPort <= 65535)) problem(o, `${where}: port ${p.containerPort}`);
    if (p.name !== undefined) {
      if (p.name.length > 15 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(p.name)) {
        problem(o, `${where}: bad port name '${p.name}'`);
      }
      if (portNames.has(p.name)) problem(o, `${where}: duplicate port name '${p.name}'`);
      portNames.add(p.name);
    }
  }

  // Environment as Kubernetes expands $(VAR) in args: explicit env, then
  // envFrom ConfigMaps (only keys that are valid variable names).
  const env = new Map();
  for (const ef of c.envFrom ?? []) {
    if (ef.configMapRef) {
      const data = configMaps.get(ef.configMapRef.name);
      if (!data) { problem(o, `${where}: envFrom unknown ConfigMap '${ef.configMapRef.name}'`); continue; }
      for (const [k, v] of Object.entries(data)) env.set((ef.prefix ?? '') + k, String(v));
    } else if (ef.secretRef) {
      // Secrets are not rendered by the chart; their keys are unknown here.
    }
  }
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env.set(e.name, String(e.value));
    else if (e.valueFrom?.fieldRef?.fieldPath === 'status.podIP') env.set(e.name, '10.0.0.10');
    else if (e.valueFrom?.configMapKeyRef) {
      const data = configMaps.get(e.valueFrom.configMapKeyRef.name);
      const v = data?.[e.valueFrom.configMapKeyRef.key];
      if (v === undefined) problem(o, `${where}: env ${e.name} refers to a missing ConfigMap key`);
      else env.set(e.name, String(v));
    } else env.set(e.name, '<from-elsewhere>');
  }
  const expand = (s) => String(s).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (all, name) => {
    if (!env.has(name)) {
      problem(o, `${where}: '${s}' refers to $(${name}), which is not in the container's env`);
      return all;
    }
    return env.get(name);
  });
  const args = (c.args ?? []).map(expand);
  (c.command ?? []).forEach(expand);

  if (!isInit) {
    const daemon = (c.command ?? [])[0];
    if (DAEMONS.includes(daemon)) {
      daemonArgs.push({ daemon, container: c.name, object: describe(o), args });
      const grpcPort = (c.ports ?? []).find((p) => p.name === 'grpc')?.containerPort;
      if (!grpcPort) problem(o, `${where}: no port named grpc`);
      // Kubernetes' gRPC probes speak plaintext: with TLS on (--tls-ca) the
      // probes are TCP probes of the same port.
      const tls = args.some((a) => a.startsWith('--tls-ca='));
      const tlsFlags = ['--tls-cert=', '--tls-key=', '--tls-ca='].filter((f) => args.some((a) => a.startsWith(f)));
      if (tlsFlags.length !== 0 && tlsFlags.length !== 3) {
        problem(o, `${where}: --tls-cert, --tls-key and --tls-ca go together (has ${tlsFlags.join(' ')})`);
      }
      for (const probe of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
        const pr = c[probe];
        const kind = tls ? 'tcpSocket' : 'grpc';
        if (!pr?.[kind]) problem(o, `${where}: ${probe} is not a ${tls ? 'TCP (TLS is on)' : 'gRPC'} probe`);
        else if (pr[kind].port !== grpcPort) problem(o, `${where}: ${probe} probes port ${pr[kind].port}, gRPC is ${grpcPort}`);
      }
    } else if (HTTP_DAEMONS.includes(daemon)) {
      daemonArgs.push({ daemon, container: c.name, object: describe(o), args });
      // With a certificate the listener is HTTPS only: the port is named
      // https and the readiness probe speaks HTTPS; the coordinator (TLS
      // then too) is reached with the CA.
      const tls = args.some((a) => a.startsWith('--tls-cert='));
      if (tls !== args.some((a) => a.startsWith('--tls-key='))) problem(o, `${where}: --tls-cert and --tls-key go together`);
      if (tls && !args.some((a) => a.startsWith('--coordinator-tls-ca='))) {
        problem(o, `${where}: HTTPS on but no --coordinator-tls-ca for the coordinator's TLS port`);
      }
      const portName = tls ? 'https' : 'http';
      const scheme = tls ? 'HTTPS' : 'HTTP';
      if (!(c.ports ?? []).some((p) => p.name === portName)) problem(o, `${where}: no port named ${portName}`);
      const ready = c.readinessProbe?.httpGet;
      if (!ready || ready.path !== '/health' || ready.port !== portName || (ready.scheme ?? 'HTTP') !== scheme) {
        problem(o, `${where}: readinessProbe is not ${scheme} GET /health on port ${portName}`);
      }
      if (!c.livenessProbe) problem(o, `${where}: no livenessProbe`);
    }
  }
  return portNames;
}

const podTemplates = [];  // {o, labels, portNames, ports}
for (const o of workloads) {
  const spec = o.spec ?? {};
  const tmpl = spec.template ?? {};
  const labels = tmpl.metadata?.labels ?? {};
  if (!matches(spec.selector?.matchLabels, labels) || !Object.keys(spec.selector?.matchLabels ?? {}).length) {
    problem(o, 'spec.selector.matchLabels does not select the pod template');
  }
  const podSpec = tmpl.spec ?? {};
  if (podSpec.automountServiceAccountToken !== false) problem(o, 'mounts a service account token');
  const ports = new Map();
  // A StatefulSet's volumeClaimTemplates provide volumes by name.
  const claimNames = (spec.volumeClaimTemplates ?? []).map((v) => v.metadata?.name);
  for (const c of podSpec.initContainers ?? []) checkContainer(o, podSpec, c, true, claimNames);
  for (const c of podSpec.containers ?? []) {
    checkContainer(o, podSpec, c, false, claimNames);
    for (const p of c.ports ?? []) ports.set(p.name ?? String(p.containerPort), p.containerPort);
  }
  podTemplates.push({ o, labels, ports });
  if (o.kind === 'StatefulSet') {
    const svc = byKind('Service').find((s) => s.metadata.name === spec.serviceName);
    if (!svc) problem(o, `serviceName '${spec.serviceName}' is not a rendered Service`);
    else if (svc.spec?.clusterIP !== 'None') problem(o, `serviceName '${spec.serviceName}' is not headless`);
  }
}
for (const s of byKind('Service')) {
  const sel = s.spec?.selector;
  if (!sel || !Object.keys(sel).length) { problem(s, 'no selector'); continue; }
  const targets = podTemplates.filter((p) => matches(sel, p.labels));
  if (targets.length === 0) { problem(s, 'selects no pod template'); continue; }
  for (const port of s.spec.ports ?? []) {
    if (typeof port.targetPort === 'string' && !targets.every((t) => t.ports.has(port.targetPort))) {
      problem(s, `targetPort '${port.targetPort}' is not a named port of the selected pods`);
    }
  }
}
// Trust: only the coordinator's API may leave the cluster, and alone.
for (const s of byKind('Service')) {
  const component = s.metadata?.labels?.['app.kubernetes.io/component'];
  const type = s.spec?.type ?? 'ClusterIP';
  if (type === 'ClusterIP') continue;
  if (component !== 'coordinator') {
    problem(s, `an internal Service (${component}) is of type ${type}: only the coordinator's API may be exposed`);
  } else if ((s.spec.ports ?? []).some((p) => p.name !== 'grpc')) {
    problem(s, `type ${type} exposes more than the API port (${(s.spec.ports ?? []).map((p) => p.name).join(', ')})`);
  }
}
const policies = byKind('NetworkPolicy');
for (const np of policies) {
  if (!podTemplates.some((t) => matches(np.spec?.podSelector?.matchLabels, t.labels))) {
    problem(np, 'selects no pod template');
  }
}
if (policies.length) {
  for (const t of podTemplates) {
    if (!policies.some((np) => matches(np.spec?.podSelector?.matchLabels, t.labels))) {
      problem(t.o, 'no NetworkPolicy selects its pods');
    }
  }
}

for (const p of byKind('PodDisruptionBudget')) {
  if (!podTemplates.some((t) => matches(p.spec?.selector?.matchLabels, t.labels))) {
    problem(p, 'selects no pod template');
  }
  if ((p.spec?.minAvailable === undefined) === (p.spec?.maxUnavailable === undefined)) {
    problem(p, 'needs exactly one of minAvailable and maxUnavailable');
  }
}
for (const m of byKind('ServiceMonitor')) {
  const sel = m.spec?.selector?.matchLabels ?? {};
  const svcs = byKind('Service').filter((s) => matches(sel, s.metadata.labels));
  if (!svcs.length) problem(m, 'selects no rendered Service');
  for (const ep of m.spec?.endpoints ?? []) {
    for (const s of svcs) {
      if (!(s.spec.ports ?? []).some((p) => p.name === ep.port)) {
        problem(m, `Service ${s.metadata.name} has no port named '${ep.port}'`);
      }
    }
  }
}

if (argsOut) writeFileSync(argsOut, JSON.stringify(daemonArgs, null, 1));

const kinds = {};
for (const o of objects) kinds[o.kind] = (kinds[o.kind] ?? 0) + 1;
const summary = Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(', ');
if (problems.length) {
  for (const p of problems) console.error(`FAIL ${p}`);
  console.error(`validate_manifests: ${problems.length} problem(s) in ${objects.length} objects (${summary})`);
  process.exit(1);
}
console.log(`validate_manifests: ${objects.length} objects valid (${summary})`);
