// The OpenAI API of a real `vericache local` cluster, driven by the official
// `openai` npm client (tests/services/openai/openai_client_test.sh starts the
// cluster and passes its endpoints file). Checks: the models list;
// completions and chat completions, streamed and not, whose text equals the
// decode of single-process greedy full-KV decoding (`vericache generate
// --mode full`) of the same prompt ids (ids and text from the independent
// @huggingface/tokenizers); usage and finish_reason; bad requests get 400 (and
// an unknown model 404); a client that disconnects mid-stream gets its
// request cancelled and its KV freed (checked in the daemons' metrics). On a
// secure cluster the URL is https, verified by the cluster CA (the runner
// sets NODE_EXTRA_CA_CERTS; a client without it is refused), and a wrong API
// key gets 401. VC_OPENAI_QUICK=1 (the --insecure run): a short subset.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const [endpointsFile, vericache, modelDir, toolsDir] = process.argv.slice(2);
const { default: OpenAI } = await import(path.join(toolsDir, "node_modules/openai/index.js"));
const { Tokenizer } = await import(
  path.join(toolsDir, "node_modules/@huggingface/tokenizers/dist/tokenizers.mjs"));

const endpoints = JSON.parse(fs.readFileSync(endpointsFile, "utf8"));
const secure = Boolean(endpoints.tls_ca);
const quick = process.env.VC_OPENAI_QUICK === "1";
// https exactly when the cluster has TLS (its CA in the endpoints file).
assert.match(endpoints.openai, secure ? /^https:\/\/127\.0\.0\.1:\d+\/v1$/ : /^http:\/\/127\.0\.0\.1:\d+\/v1$/,
  `endpoints file has the openai URL (${secure ? "https" : "http"})`);
// A demo tenant's key when the cluster has API keys (the default); any value
// otherwise (vericache local --insecure).
const apiKey = endpoints.api_keys ? endpoints.api_keys["tenant-a"] : "any-key";
const client = new OpenAI({ baseURL: endpoints.openai, apiKey, maxRetries: 0, timeout: 300000 });
const modelName = path.basename(modelDir);
const tokenizer = new Tokenizer(
  JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8")));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const generationConfig = JSON.parse(fs.readFileSync(path.join(modelDir, "generation_config.json"), "utf8"));
const eosIds = [generationConfig.eos_token_id].flat();

let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// Single-process greedy full-KV decoding of `ids`: the generated ids (up to
// and including the first EOS id) and their text.
function reference(ids, maxNew) {
  const out = execFileSync(vericache, ["generate", "--model", modelDir, "--mode", "full",
    "--prompt-ids", ids.join(" "), "--max-new-tokens", String(maxNew), "--ignore-eos", "--json"],
    { encoding: "utf8" });
  let tokens = JSON.parse(out).tokens;
  const stop = tokens.findIndex((t) => eosIds.includes(t));
  if (stop >= 0) tokens = tokens.slice(0, stop + 1);
  return { tokens, text: tokenizer.decode(tokens, { skip_special_tokens: true }),
           finish: stop >= 0 ? "stop" : "length" };
}

async function metric(address, name, labels = "") {
  const text = await (await fetch(`http://${address}/metrics`)).text();
  let sum = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith(name + (labels ? "{" : "")) && line.includes(labels)) {
      const value = Number(line.trim().split(/\s+/).pop());
      if (Number.isFinite(value)) sum += value;
    }
  }
  return sum;
}

const prompt = "Once upon a time, there was a little dog named";
const promptIds = tokenizer.encode(prompt, { add_special_tokens: true }).ids;
const maxTokens = 40;
const ref = reference(promptIds, maxTokens);
console.log(`reference: ${ref.tokens.length} tokens, ${JSON.stringify(ref.text)}`);

await check("models.list", async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, modelName);
  assert.equal(models[0].object, "model");
});

await check("completions (greedy) equal single-process decoding", async () => {
  const r = await client.completions.create({ model: modelName, prompt, max_tokens: maxTokens, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, ref.text);
  assert.equal(r.choices[0].finish_reason, ref.finish);
  assert.equal(r.usage.prompt_tokens, promptIds.length);
  assert.equal(r.usage.completion_tokens, ref.tokens.length);
  assert.equal(r.usage.total_tokens, promptIds.length + ref.tokens.length);
});

if (quick) {
  await check("health", async () => {
    const r = await fetch(`${endpoints.openai.replace(/\/v1$/, "")}/health`);
    assert.equal(r.status, 200);
  });
  process.exit(failures ? 1 : 0);
}

await check("completions streamed equal the same text, with usage", async () => {
  const stream = await client.completions.create({ model: modelName, prompt, max_tokens: maxTokens,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2, `several chunks (${chunks})`);
  assert.equal(text, ref.text);
  assert.equal(finish, ref.finish);
  assert.equal(usage.prompt_tokens, promptIds.length);
  assert.equal(usage.completion_tokens, ref.tokens.length);
});

await check("stop strings end the text (streamed and not)", async () => {
  const cut = ref.text.indexOf(" ", 10);
  assert.ok(cut > 0, "the reference text has a space after position 10");
  const stop = ref.text.slice(cut, cut + 3);
  const expected = ref.text.slice(0, ref.text.indexOf(stop));
  const r = await client.completions.create({ model: modelName, prompt, max_tokens: maxTokens,
    temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, "stop");
  const stream = await client.completions.create({ model: modelName, prompt, max_tokens: maxTokens,
    temperature: 0, stop: stop, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, expected);
});

// The chat template (tests/data/openai/tinystories_chat.jinja) by hand: the
// BOS string, then the user messages trimmed; encoded without specials.
const userText = "  Lily went to the park to play with her ball.  ";
const chatIds = tokenizer.encode(tokenizerConfig.bos_token + userText.trim(), { add_special_tokens: false }).ids;
const chatRef = reference(chatIds, 30);

await check("chat.completions equal single-process decoding of the rendered template", async () => {
  const r = await client.chat.completions.create({ model: modelName, temperature: 0,
    max_completion_tokens: 30, messages: [{ role: "system", content: "ignored" }, { role: "user", content: userText }] });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].message.content, chatRef.text);
  assert.equal(r.choices[0].finish_reason, chatRef.finish);
  assert.equal(r.usage.prompt_tokens, chatIds.length);
  assert.equal(r.usage.completion_tokens, chatRef.tokens.length);
});

await check("chat.completions streamed", async () => {
  const stream = await client.chat.completions.create({ model: modelName, temperature: 0,
    max_tokens: 30, messages: [{ role: "user", content: userText }], stream: true });
  let text = "", role = null, finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.equal(text, chatRef.text);
  assert.equal(finish, chatRef.finish);
});

await check("seeded sampling is reproducible", async () => {
  const req = { model: modelName, prompt, max_tokens: 20, temperature: 0.8, top_p: 0.9, seed: 1234 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

async function expectStatus(status, fn, needle) {
  try {
    await fn();
  } catch (e) {
    assert.equal(e.status, status, `${e}`);
    if (needle) assert.match(String(e.message), needle);
    return;
  }
  assert.fail(`expected HTTP ${status}`);
}

await check("bad requests get 400 naming the problem; an unknown model 404", async () => {
  await expectStatus(400, () => client.completions.create({ model: modelName, prompt, n: 2 }), /\bn\b/);
  await expectStatus(400, () => client.completions.create({ model: modelName, prompt, logprobs: 2 }), /logprobs/);
  await expectStatus(400, () => client.completions.create({ model: modelName, prompt, echo: true }), /echo/);
  await expectStatus(400, () => client.chat.completions.create({ model: modelName,
    messages: [{ role: "user", content: "x" }], tools: [{ type: "function", function: { name: "f" } }] }), /tools/);
  await expectStatus(400, () => client.chat.completions.create({ model: modelName,
    messages: [{ role: "user", content: "x" }], response_format: { type: "json_object" } }), /response_format/);
  await expectStatus(400, () => client.completions.create({ model: modelName, prompt, temperature: 5 }), /temperature/);
  await expectStatus(400, () => client.completions.create({ model: modelName, prompt, max_tokens: 100000 }),
    /context/);
  await expectStatus(404, () => client.completions.create({ model: "no-such-model", prompt }));
});

await check("a client that disconnects mid-stream frees its KV", async () => {
  const coord = endpoints.coordinator_metrics;
  const workers = [endpoints.verifier_metrics, endpoints.drafter_metrics];
  const cancelledBefore = await metric(coord, "vericache_requests_total", 'outcome="cancelled"');
  const controller = new AbortController();
  const stream = await client.completions.create({ model: modelName, prompt, max_tokens: 400,
    temperature: 0, stream: true, ignore_eos: true }, { signal: controller.signal });
  let got = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices.length && chunk.choices[0].text) got++;
      if (got >= 2) controller.abort();
    }
  } catch (e) {
    if (!controller.signal.aborted) throw e;
  }
  assert.ok(controller.signal.aborted, "the stream was still running when the client left");
  // The gateway notices the hang-up and cancels; the coordinator releases
  // the sessions. Bounded wait, no timing assertion.
  let state;
  for (let i = 0; i < 300; i++) {
    state = {
      active: await metric(coord, "vericache_active_requests"),
      sessions: (await Promise.all(workers.map((w) => metric(w, "vericache_worker_sessions")))).reduce((a, b) => a + b),
      kv: (await Promise.all(workers.map((w) => metric(w, "vericache_worker_kv_bytes")))).reduce((a, b) => a + b),
      cancelled: await metric(coord, "vericache_requests_total", 'outcome="cancelled"'),
    };
    if (state.active === 0 && state.sessions === 0 && state.cancelled > cancelledBefore) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(state.active, 0, `coordinator requests still active: ${JSON.stringify(state)}`);
  assert.equal(state.sessions, 0, `worker sessions still open: ${JSON.stringify(state)}`);
  assert.ok(state.cancelled > cancelledBefore, `the request was cancelled, not finished: ${JSON.stringify(state)}`);
});

await check("health", async () => {
  const base = endpoints.openai.replace(/\/v1$/, "");
  const r = await fetch(`${base}/health`);
  assert.equal(r.status, 200);
});

if (secure) {
  await check("the https URL is verified by the cluster CA (a client without it is refused)", async () => {
    // A fresh node without NODE_EXTRA_CA_CERTS: the system CAs only.
    const env = { ...process.env };
    delete env.NODE_EXTRA_CA_CERTS;
    const probe = `fetch(${JSON.stringify(endpoints.openai + "/models")}).then(` +
      `() => { console.log("connected"); process.exit(0); }, ` +
      `(e) => { console.log(String(e.cause && e.cause.code)); process.exit(3); })`;
    let code = 0, out = "";
    try {
      out = execFileSync(process.execPath, ["-e", probe], { env, encoding: "utf8" });
    } catch (e) {
      code = e.status;
      out = e.stdout;
    }
    assert.equal(code, 3, `the probe connected: ${out}`);
    assert.match(out, /CERT|SIGNED|ISSUER|VERIFY/, `a certificate error: ${out}`);
  });
}

if (endpoints.api_keys) {
  await check("a wrong API key gets 401", async () => {
    const bad = new OpenAI({ baseURL: endpoints.openai, apiKey: "wrong-key", maxRetries: 0 });
    await expectStatus(401, () => bad.completions.create({ model: modelName, prompt, max_tokens: 2 }));
    await expectStatus(401, () => bad.models.list());
  });
} else {
  console.log("skip a wrong API key gets 401: the cluster runs without API keys (no \"api_keys\" in the endpoints file)");
}

process.exit(failures ? 1 : 0);
