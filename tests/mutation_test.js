// Mutation test (issue 16): a finished run's folder is copied, one file is damaged at random, and `trainer
// info`, `trainer train --resume_from_checkpoint`, fine-tuning and `trainer eval` run on the copy. Each run must
// exit 0 (the damage was harmless) or exit non-zero with a message naming the damaged file; a signal, a hang,
// a sanitizer report or an uncaught-exception message is a failure.
//
//   node tests/mutation_test.js TRAINER TOKENIZER_DIR CORPUS WORKDIR [CASES=300] [SEED=1]
//        [--only N] [--keep] [--jobs J] [--timeout S] [--verbose]
//
// --only N     run case N alone (the same damage as in the full run of that seed), printing its commands
// --keep       keep WORKDIR (the base run and each case's damaged copy) instead of deleting it; env
//              MUTATION_KEEP=1 does the same
// --jobs J     cases run in parallel (default: the CPU count, env MUTATION_JOBS); each trainer gets one thread
// --timeout S  seconds before a run counts as a hang (default 60, env MUTATION_TIMEOUT)
// --verbose    one line per case (file, damage, each run's exit status), not only the failures
//
// Case N's damage depends only on (SEED, N) and the base run's files, so a failure reproduces with --only N.
// Exit status: 0 when no case failed, 1 otherwise (also when the base run fails), 2 on a usage error.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const crypto = require("crypto");
const { spawn, spawnSync } = require("child_process");

// ---- arguments ---------------------------------------------------------------------------------------------
const positional = [];
const opt = {
  only: null,
  keep: process.env.MUTATION_KEEP === "1",
  jobs: Number(process.env.MUTATION_JOBS) || (os.availableParallelism ? os.availableParallelism() : os.cpus().length),
  timeout: Number(process.env.MUTATION_TIMEOUT) || 60,
  verbose: false,
};
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--only") opt.only = Number(argv[++i]);
    else if (a === "--keep") opt.keep = true;
    else if (a === "--jobs") opt.jobs = Number(argv[++i]);
    else if (a === "--timeout") opt.timeout = Number(argv[++i]);
    else if (a === "--verbose" || a === "-v") opt.verbose = true;
    else if (a.startsWith("--")) usage(`unknown option ${a}`);
    else positional.push(a);
  }
}
function usage(msg) {
  if (msg) console.error(`mutation_test: ${msg}`);
  console.error(
    "usage: node tests/mutation_test.js TRAINER TOKENIZER_DIR CORPUS WORKDIR [CASES=300] [SEED=1] " +
      "[--only N] [--keep] [--jobs J] [--timeout S] [--verbose]");
  process.exit(2);
}
if (positional.length < 4 || positional.length > 6) usage();
const [trainerArg, tokArg, corpusArg, workArg] = positional;
const CASES = positional[4] !== undefined ? Number(positional[4]) : 300;
const SEED = positional[5] !== undefined ? Number(positional[5]) : 1;
if (!Number.isInteger(CASES) || CASES < 1) usage(`bad CASES ${positional[4]}`);
if (!Number.isInteger(SEED)) usage(`bad SEED ${positional[5]}`);
if (opt.only !== null && !(Number.isInteger(opt.only) && opt.only >= 1)) usage("bad --only");
if (!(opt.jobs >= 1)) opt.jobs = 1;
const TRAINER = path.resolve(trainerArg);
const TOK = path.resolve(tokArg);
const CORPUS = path.resolve(corpusArg);
const WORK = path.resolve(workArg);
for (const [what, p] of [["TRAINER", TRAINER], ["TOKENIZER_DIR", TOK], ["CORPUS", CORPUS]])
  if (!fs.existsSync(p)) usage(`${what} ${p} does not exist`);

// ---- deterministic randomness ------------------------------------------------------------------------------
// splitmix32-style mixing of (seed, case) into the state of mulberry32: case N never depends on other cases.
function mix(a, b) {
  let h = (Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(b + 0x632be5ab, 0xc2b2ae35)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d) >>> 0;
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}
function makeRng(seed, n) {
  let s = mix(seed >>> 0, n >>> 0);
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n) => Math.floor(next() * n),  // 0 .. n-1
    pick: (xs) => xs[Math.floor(next() * xs.length)],
    weighted: (pairs) => {  // [[value, weight], ...]
      const total = pairs.reduce((s, p) => s + p[1], 0);
      let r = next() * total;
      for (const [v, w] of pairs) if ((r -= w) < 0) return v;
      return pairs[pairs.length - 1][0];
    },
  };
}

// ---- JSON with source spans ----------------------------------------------------------------------------------
// Parses JSON text (decoded as latin1, so offsets are byte offsets) into nodes {kind, start, end, kids}; kids of
// an object are {key, keyStart, node}, of an array {node}. Edits splice the original text, so everything not
// damaged keeps its exact bytes (big integers, float spellings, key order).
function parseSpans(text) {
  let i = 0;
  const ws = () => { while (i < text.length && " \t\r\n".includes(text[i])) ++i; };
  const fail = (m) => { throw new Error(`JSON parse: ${m} at ${i}`); };
  function str() {
    if (text[i] !== '"') fail("string expected");
    const s = i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    if (i >= text.length) fail("unterminated string");
    ++i;
    return [s, i];
  }
  function value() {
    ws();
    const start = i, c = text[i];
    if (c === "{") {
      ++i;
      const kids = [];
      ws();
      if (text[i] === "}") { ++i; return { kind: "object", start, end: i, kids }; }
      for (;;) {
        ws();
        const [ks, ke] = str();
        const key = JSON.parse(Buffer.from(text.slice(ks, ke), "latin1").toString("utf8"));
        ws();
        if (text[i++] !== ":") fail("':' expected");
        kids.push({ key, keyStart: ks, node: value() });
        ws();
        if (text[i] === ",") { ++i; continue; }
        if (text[i] === "}") { ++i; return { kind: "object", start, end: i, kids }; }
        fail("',' or '}' expected");
      }
    }
    if (c === "[") {
      ++i;
      const kids = [];
      ws();
      if (text[i] === "]") { ++i; return { kind: "array", start, end: i, kids }; }
      for (;;) {
        kids.push({ node: value() });
        ws();
        if (text[i] === ",") { ++i; continue; }
        if (text[i] === "]") { ++i; return { kind: "array", start, end: i, kids }; }
        fail("',' or ']' expected");
      }
    }
    if (c === '"') { str(); return { kind: "string", start, end: i }; }
    const m = /^(-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null)/.exec(text.slice(i, i + 400));
    if (!m) fail("value expected");
    i += m[0].length;
    return { kind: "scalar", start, end: i };
  }
  const root = value();
  ws();
  if (i !== text.length) fail("trailing text");
  return root;
}

const HOSTILE = [
  "-1", "0", "4611686018427387904", "1e308", '"hostile"', "null", "[]", "[1,2]", "{}", '{"a":1}',
  // beyond the issue's list: 2^64 (past uint64), its negation, a fraction, a boolean, an empty string
  "18446744073709551616", "-4611686018427387904", "0.5", "true", '""',
];

const shortKey = (k) => {
  const s = /^[A-Za-z_][A-Za-z0-9_]*$/.test(k) ? `.${k}` : `[${JSON.stringify(k)}]`;
  return s.length > 40 ? s.slice(0, 37) + "...]" : s;
};

// A random node: walks down from the root, stopping at a container with some probability (so whole objects and
// arrays get replaced too, not only leaves) and always at a leaf. Returns {node, parent, index, path}.
function pickNode(root, rng, { allowRoot }) {
  let node = root, parent = null, index = -1, p = "$";
  for (;;) {
    const container = node.kind === "object" || node.kind === "array";
    if (!container || node.kids.length === 0) break;
    const stop = node === root ? (allowRoot ? 0.03 : 0) : 0.25;
    if (rng.next() < stop) break;
    index = rng.int(node.kids.length);
    const kid = node.kids[index];
    p += node.kind === "object" ? shortKey(kid.key) : `[${index}]`;
    parent = node;
    node = kid.node;
  }
  if (node === root && !allowRoot) return null;  // an empty root container: nothing to delete
  return { node, parent, index, path: p };
}

// Splices `replacement` over node's span.
function replaceNode(text, node, replacement) {
  return text.slice(0, node.start) + replacement + text.slice(node.end);
}

// Removes kid `index` of `parent` (a member with its key, or an element) and one adjacent comma.
function deleteKid(text, parent, index) {
  const kid = parent.kids[index];
  let s = kid.keyStart !== undefined ? kid.keyStart : kid.node.start, e = kid.node.end;
  let j = e;
  while (" \t\r\n".includes(text[j])) ++j;
  if (text[j] === ",") e = j + 1;
  else {
    let k = s - 1;
    while (k >= 0 && " \t\r\n".includes(text[k])) --k;
    if (text[k] === ",") s = k;
  }
  return text.slice(0, s) + text.slice(e);
}

// One JSON damage on `text`: a hostile value for a random node, or a deleted member/element.
// Returns {text, desc} or null when the text is not JSON we can parse.
function mutateJsonText(text, rng, kind) {
  let root;
  try { root = parseSpans(text); } catch (e) { return null; }
  if (kind === "delete") {
    const p = pickNode(root, rng, { allowRoot: false });
    if (!p) return null;
    return { text: deleteKid(text, p.parent, p.index), desc: `delete ${p.path}` };
  }
  const p = pickNode(root, rng, { allowRoot: true });
  const v = rng.pick(HOSTILE);
  return { text: replaceNode(text, p.node, v), desc: `${p.path} = ${v}` };
}

// ---- the damage ----------------------------------------------------------------------------------------------
// Weights: files a command reads get most cases; checkpoint-2 is resumed from explicitly, less often.
function fileWeight(rel) {
  const base = path.basename(rel), dir = path.dirname(rel);
  const read = {
    "config.json": 6, "model.safetensors": 6, "optimizer.safetensors": 6, "trainer_state.json": 6,
    "scheduler.json": 5, "rng_state.json": 5, "scaler.json": 5, "tokenizer.json": 5, "metrics.jsonl": 2,
  };
  let w = read[base] !== undefined ? read[base] : 1;
  if (dir === ".") {
    if (base === "trainer_state.json" || base === "optimizer.safetensors") w = 1;  // not read from the top
  } else if (base === "tokenizer.json" || base === "training_args.json") {
    w = 1;  // a checkpoint's tokenizer and args are checked for presence only
  }
  if (dir !== "." && dir !== LAST_CKPT) w *= 0.35;
  return w;
}

function flipBits(buf, rng, lo, hi, n) {
  const bits = [];
  for (let k = 0; k < n; ++k) {
    const bit = lo * 8 + rng.int((hi - lo) * 8);
    buf[bit >> 3] ^= 1 << (bit & 7);
    bits.push(bit);
  }
  return bits;
}

// Damages `file` (relative path `rel`) in place; returns a description of the damage.
function damage(file, rel, rng) {
  const buf = fs.readFileSync(file);
  const isSt = rel.endsWith(".safetensors"), isJsonl = rel.endsWith(".jsonl"), isJson = rel.endsWith(".json");
  const hlen = isSt && buf.length >= 8 ? Number(buf.readBigUInt64LE(0)) : 0;
  const hend = isSt ? Math.min(buf.length, 8 + hlen) : 0;
  const kinds = isSt
    ? [["truncate", 2], ["flip", 2.5], ["header-value", 5], ["header-delete", 2], ["length", 1.2], ["remove", 0.3]]
    : isJson
    ? [["truncate", 1.5], ["flip", 1.5], ["json-value", 5], ["json-delete", 2], ["remove", 0.3]]
    : isJsonl
    ? [["truncate", 1.5], ["flip", 1.5], ["line-value", 3], ["remove", 0.3]]
    : [["truncate", 1], ["flip", 1], ["remove", 0.3]];
  const kind = rng.weighted(kinds);
  const write = (b) => fs.writeFileSync(file, b);
  if (kind === "remove") {
    fs.rmSync(file);
    return "remove";
  }
  if (kind === "truncate") {
    let len;
    if (isSt) {
      const where = rng.weighted([["zero", 1], ["length", 1], ["header", 3], ["data", 2]]);
      len = where === "zero" ? 0
        : where === "length" ? 1 + rng.int(7)
        : where === "header" ? 8 + rng.int(Math.max(1, hend - 8))
        : hend + rng.int(Math.max(1, buf.length - hend));
    } else {
      len = rng.next() < 0.25 ? 0 : rng.int(Math.max(1, buf.length));
    }
    write(buf.subarray(0, len));
    return `truncate to ${len} of ${buf.length} bytes`;
  }
  if (kind === "flip") {
    const n = 1 + rng.int(8);
    const b = Buffer.from(buf);
    let where = "";
    if (isSt && rng.next() < 0.75) {
      flipBits(b, rng, 0, Math.max(1, hend), n);
      where = " in the length/header";
    } else {
      flipBits(b, rng, 0, Math.max(1, b.length), n);
    }
    write(b);
    return `flip ${n} bit${n > 1 ? "s" : ""}${where}`;
  }
  if (kind === "length") {  // the 8-byte header length replaced
    const choices = [
      ["0", 0n], ["1", 1n], ["header-1", BigInt(hlen - 1)], ["header+1", BigInt(hlen + 1)],
      ["file size", BigInt(buf.length)], ["2^62", 1n << 62n], ["2^64-1", (1n << 64n) - 1n],
      ["2^63", 1n << 63n], ["100 MB", 100000000n],
    ];
    const [name, v] = rng.pick(choices);
    const b = Buffer.from(buf);
    b.writeBigUInt64LE(BigInt.asUintN(64, v), 0);
    write(b);
    return `header length = ${name}`;
  }
  if (kind === "header-value" || kind === "header-delete") {  // an edit of the JSON header, length kept consistent
    const header = buf.subarray(8, hend).toString("latin1");
    const m = mutateJsonText(header, rng, kind === "header-delete" ? "delete" : "value");
    if (!m) return damageFallback(file, buf, rng);
    let h = m.text;
    while ((h.length - header.length) % 8 !== 0) h += " ";  // keep the data's alignment as it was
    const hb = Buffer.from(h, "latin1");
    const lb = Buffer.alloc(8);
    lb.writeBigUInt64LE(BigInt(hb.length), 0);
    write(Buffer.concat([lb, hb, buf.subarray(hend)]));
    return `header ${m.desc}`;
  }
  if (kind === "json-value" || kind === "json-delete") {
    const m = mutateJsonText(buf.toString("latin1"), rng, kind === "json-delete" ? "delete" : "value");
    if (!m) return damageFallback(file, buf, rng);
    write(Buffer.from(m.text, "latin1"));
    return m.desc;
  }
  if (kind === "line-value") {  // one JSON line of metrics.jsonl
    const lines = buf.toString("latin1").split("\n");
    const idx = [];
    lines.forEach((l, i) => { if (l.trim()) idx.push(i); });
    if (!idx.length) return damageFallback(file, buf, rng);
    const i = rng.pick(idx);
    const m = mutateJsonText(lines[i], rng, rng.next() < 0.3 ? "delete" : "value");
    if (!m) return damageFallback(file, buf, rng);
    lines[i] = m.text;
    write(Buffer.from(lines.join("\n"), "latin1"));
    return `line ${i + 1}: ${m.desc}`;
  }
  throw new Error(`unknown damage ${kind}`);
}

function damageFallback(file, buf, rng) {  // an empty or unparsable file: truncate instead
  const len = rng.int(Math.max(1, buf.length));
  fs.writeFileSync(file, buf.subarray(0, len));
  return `truncate to ${len} of ${buf.length} bytes`;
}

// ---- processes -----------------------------------------------------------------------------------------------
const CHILD_ENV = Object.assign({}, process.env, {
  OPENBLAS_CORETYPE: process.env.OPENBLAS_CORETYPE || "Haswell",
  OMP_NUM_THREADS: "1",  // tiny model: parallel cases beat parallel kernels
});

function runAsync(args, timeoutS) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const child = spawn(TRAINER, args, { env: CHILD_ENV, stdio: ["ignore", "pipe", "pipe"] });
    let out = "", err = "", timedOut = false;
    const cap = (s, d) => (s.length < 1 << 20 ? s + d : s);
    child.stdout.on("data", (d) => (out = cap(out, d.toString())));
    child.stderr.on("data", (d) => (err = cap(err, d.toString())));
    const timer = setTimeout(() => { timedOut = true; child.kill("SIGKILL"); }, timeoutS * 1000);
    child.on("error", (e) => { err += `spawn error: ${e.message}`; });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, timedOut, stdout: out, stderr: err, seconds: (Date.now() - t0) / 1000 });
    });
  });
}

const BAD_OUTPUT = [
  "AddressSanitizer", "LeakSanitizer", "runtime error:", "ThreadSanitizer", "UndefinedBehaviorSanitizer",
  "terminate called", "json.exception", "Segmentation", "double free", "malloc(): ", "free(): ",
  "corrupted size", "corrupted double-linked", "corrupted top", "corrupted unsorted", "stack smashing",
  "std::bad_alloc", "bad_array_new_length", "basic_string::", "vector::_M", "stoll", "stoull",
];

// The line of stderr worth quoting: the error line if any, else the last non-empty one.
function keyLine(stderr) {
  const lines = stderr.split(/[\r\n]+/).map((l) => l.trim()).filter(Boolean);
  const bad = lines.find((l) => BAD_OUTPUT.some((b) => l.includes(b)));
  const e = bad || lines.find((l) => /error/i.test(l)) || lines[lines.length - 1] || "(no stderr)";
  return e.length > 220 ? e.slice(0, 217) + "..." : e;
}

// Verdict of one run: "ok" (exit 0), "rejected" (non-zero, names the file) or "FAIL: why".
function verdict(r, rel, removed, copyDir) {
  const bad = BAD_OUTPUT.find((b) => r.stderr.includes(b) || r.stdout.includes(b));
  if (r.timedOut) return `hang (killed after ${opt.timeout} s)`;
  if (r.signal) return `killed by ${r.signal}`;
  if (r.code >= 128) return `exit ${r.code} (a signal?)`;
  if (bad) return `exit ${r.code} with "${bad}" in its output`;
  if (r.code === 0) return "ok";
  // The message must name the damaged file: its path, or its folder (as a path of its own, not as the start of
  // another file's path: checkpoint-4/config.json does not name the top-level config.json) and its name. A
  // removed file may be named by its folder alone.
  const folder = path.join(copyDir, path.dirname(rel));
  const esc = folder.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const folderNamed = new RegExp(`${esc}/?(?![\\w./-])`).test(r.stderr);
  if (r.stderr.includes(path.join(copyDir, rel))) return "rejected";
  if (folderNamed && (removed || r.stderr.includes(path.basename(rel)))) return "rejected";
  return `exit ${r.code}, message does not name ${rel}`;
}

// ---- the base run --------------------------------------------------------------------------------------------
const BASE = path.join(WORK, "base");
const TRAIN_FILE = path.join(WORK, "corpus.txt");
const CFG = path.join(WORK, "cfg.json");
const EVAL_FILE = path.join(WORK, "eval.txt");
// fp16: the checkpoints also hold scaler.json (the loss scaler's state), read back on resume.
const COMMON = ["--tokenizer_name", TOK, "--train_file", TRAIN_FILE, "--block_size", "16",
  "--per_device_train_batch_size", "2", "--do_eval", "--validation_split_percentage", "10", "--fp16", "--use_cpu"];
// A resumed run saves a checkpoint and rotates the oldest away (which reads best_model_checkpoint).
const RESUME = ["train", "--config_name", CFG, ...COMMON, "--save_steps", "2", "--save_total_limit", "2"];
let LAST_CKPT = "checkpoint-4";

function makeBase() {
  fs.rmSync(WORK, { recursive: true, force: true });
  fs.mkdirSync(WORK, { recursive: true });
  fs.writeFileSync(CFG, JSON.stringify({ model_type: "gpt2", vocab_size: 50257, n_embd: 32, n_layer: 2, n_head: 2,
    n_positions: 32 }) + "\n");
  // 6 KB of the corpus: ~1400 tokens, 10% held out for evaluation, ~40 batches of 2 x 16 tokens (small steps:
  // the runs' time goes to loading, which is what is under test). `trainer eval` reads the first 1 KB.
  const text = fs.readFileSync(CORPUS);
  fs.writeFileSync(TRAIN_FILE, text.subarray(0, Math.min(text.length, 6000)));
  fs.writeFileSync(EVAL_FILE, text.subarray(0, Math.min(text.length, 1000)));
  const args = ["train", "--config_name", CFG, ...COMMON, "--output_dir", BASE, "--max_steps", "4",
    "--save_steps", "2", "--logging_steps", "1"];
  const r = spawnSync(TRAINER, args, { env: CHILD_ENV, encoding: "utf8", timeout: 300000 });
  if (r.status !== 0) {
    console.log(`mutation: FAIL: the base run failed (status ${r.status}, signal ${r.signal}):\n` +
      `${TRAINER} ${args.join(" ")}\n${r.stderr}`);
    process.exit(1);
  }
  // Timings vary from run to run; fixed, they keep the files' bytes (so each case's damage) the same per seed.
  const timed = ["metrics.jsonl", "trainer_state.json", "train_results.json", "eval_results.json", "all_results.json"];
  for (const rel of listFiles(BASE).filter((f) => timed.includes(path.basename(f)))) {
    const f = path.join(BASE, rel);
    const t = fs.readFileSync(f, "latin1");
    const u = t.replace(/("[a-z_]*(?:runtime|per_second)": ?)-?[0-9][0-9.eE+-]*/g, "$1100.5");
    if (u !== t) fs.writeFileSync(f, u, "latin1");
  }
  for (const f of ["config.json", "model.safetensors", "tokenizer.json", "trainer_state.json",
    "checkpoint-2/optimizer.safetensors", "checkpoint-4/trainer_state.json", "checkpoint-4/scaler.json"])
    if (!fs.existsSync(path.join(BASE, f))) {
      console.log(`mutation: FAIL: the base run lacks ${f}`);
      process.exit(1);
    }
}

function listFiles(dir, rel = ".") {
  const out = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true }).sort((a, b) =>
    a.name < b.name ? -1 : a.name > b.name ? 1 : 0)) {
    if (e.name.startsWith(".")) continue;  // the run lock, temp folders
    const r = rel === "." ? e.name : path.join(rel, e.name);
    if (e.isDirectory()) out.push(...listFiles(dir, r));
    else if (e.isFile()) out.push(r);
  }
  return out;
}

// Copies the base run: the big files (safetensors, tokenizer.json) hard-linked except the one to damage - the
// trainer replaces those by rename, never in place, and the base's hashes are checked at the end - the others
// copied (metrics.jsonl, trainer_state.json, ... are rewritten in place by a resumed run).
const LINKED = (rel) => rel.endsWith(".safetensors") || path.basename(rel) === "tokenizer.json";
function copyBase(dst, damaged) {
  for (const rel of FILES) {
    const to = path.join(dst, rel);
    fs.mkdirSync(path.dirname(to), { recursive: true });
    if (LINKED(rel) && rel !== damaged) fs.linkSync(path.join(BASE, rel), to);
    else fs.copyFileSync(path.join(BASE, rel), to);
  }
}

function hashBase() {
  const h = crypto.createHash("sha256");
  for (const rel of FILES) h.update(rel).update(fs.readFileSync(path.join(BASE, rel)));
  return h.digest("hex");
}

// ---- one case ------------------------------------------------------------------------------------------------
let FILES = [];
const q = (s) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

async function runCase(n) {
  const rng = makeRng(SEED, n);
  const rel = rng.weighted(FILES.map((f) => [f, fileWeight(f)]));
  const caseDir = path.join(WORK, `case-${n}`);
  const copy = path.join(caseDir, "run");
  fs.rmSync(caseDir, { recursive: true, force: true });
  copyBase(copy, rel);
  const desc = damage(path.join(copy, rel), rel, rng);
  const removed = desc === "remove";
  const dir = path.dirname(rel);
  // The commands that read the damaged file's folder; the ones that only read go first (resume writes).
  const runs = [];
  if (dir === ".") {
    runs.push(["info", ["info", copy]]);
    runs.push(["finetune", ["train", "--model_name_or_path", copy, "--train_file", TRAIN_FILE, "--block_size", "16",
      "--per_device_train_batch_size", "2", "--max_steps", "1", "--save_strategy", "no", "--use_cpu", "--output_dir",
      path.join(caseDir, "finetune")]]);
    if (["config.json", "model.safetensors", "tokenizer.json"].includes(rel))
      runs.push(["eval", ["eval", "--model_name_or_path", copy, "--validation_file", EVAL_FILE, "--block_size",
        "16", "--per_device_eval_batch_size", "16", "--use_cpu", "--output_dir", path.join(caseDir, "eval")]]);
    runs.push(["resume", [...RESUME, "--output_dir", copy, "--resume_from_checkpoint", "true", "--max_steps", "5"]]);
  } else {
    const ckpt = path.join(copy, dir);
    const step = Number(dir.replace("checkpoint-", ""));
    runs.push(["info", ["info", ckpt]]);
    const from = dir === LAST_CKPT ? "true" : ckpt;  // checkpoint-2: named explicitly
    runs.push(["resume", [...RESUME, "--output_dir", copy, "--resume_from_checkpoint", from, "--max_steps",
      String(step + 1)]]);
  }
  const results = [];
  for (const [name, args] of runs) {
    if (opt.only !== null) console.log(`case ${n}: ${name}: ${q(TRAINER)} ${args.map(q).join(" ")}`);
    const r = await runAsync(args, opt.timeout);
    const v = verdict(r, rel, removed, copy);
    results.push({ name, v, line: keyLine(r.stderr), r });
    if (opt.only !== null) console.log(`case ${n}: ${name}: exit ${r.code}${r.signal ? " " + r.signal : ""}, ` +
      `${r.seconds.toFixed(1)} s: ${v}` + (r.stderr.trim() ? "\n" + r.stderr.trim().split(/\r?\n|\r/)
        .map((l) => "    " + l).join("\n") : ""));
  }
  if (!opt.keep) fs.rmSync(caseDir, { recursive: true, force: true });
  const failed = results.filter((x) => x.v !== "ok" && x.v !== "rejected");
  const outcome = failed.length ? "failure" : results.some((x) => x.v === "rejected") ? "rejected" : "harmless";
  return { n, rel, desc, results, failed, outcome };
}

// ---- main ----------------------------------------------------------------------------------------------------
async function main() {
  const t0 = Date.now();
  makeBase();
  FILES = listFiles(BASE);
  const ckpts = FILES.map((f) => path.dirname(f)).filter((d) => /^checkpoint-\d+$/.test(d));
  LAST_CKPT = ckpts.sort((a, b) => Number(a.slice(11)) - Number(b.slice(11))).pop() || LAST_CKPT;
  const baseHash = hashBase();
  const ids = opt.only !== null ? [opt.only] : Array.from({ length: CASES }, (_, i) => i + 1);
  const per = new Map();
  for (const f of FILES) per.set(path.dirname(f), (per.get(path.dirname(f)) || 0) + 1);
  console.log(`mutation: seed ${SEED}, ${ids.length} case(s) over the ${FILES.length} files of a finished run (` +
    [...per].map(([d, k]) => `${k} in ${d === "." ? "the top folder" : d}`).join(", ") + `): ${BASE}`);
  const done = new Array(ids.length);
  let next = 0, printed = 0;
  const flush = () => {  // in case order, whatever order they finish in
    while (printed < ids.length && done[printed]) {
      const c = done[printed++];
      if (c.failed.length) {
        for (const f of c.failed)
          console.log(`FAIL case ${c.n}: ${c.rel}: ${c.desc}: ${f.name}: ${f.v}: ${f.line}`);
      } else if (opt.verbose) {
        console.log(`case ${c.n}: ${c.rel}: ${c.desc}: ` +
          c.results.map((x) => `${x.name} ${x.v === "ok" ? "ok" : "rejected (" + x.line + ")"}`).join("; "));
      }
    }
  };
  const worker = async () => {
    while (next < ids.length) {
      const k = next++;
      done[k] = await runCase(ids[k]);
      flush();
    }
  };
  await Promise.all(Array.from({ length: Math.min(opt.jobs, ids.length) }, worker));
  const cases = done;
  // Per-file table: what each file's damage came to.
  const byFile = new Map();
  for (const c of cases) {
    const e = byFile.get(c.rel) || { cases: 0, rejected: 0, harmless: 0, failure: 0 };
    e.cases++;
    e[c.outcome]++;
    byFile.set(c.rel, e);
  }
  if (opt.only === null) {
    const w = Math.max(...[...byFile.keys()].map((k) => k.length), 4);
    console.log(`${"file".padEnd(w)}  cases  rejected  harmless  failures`);
    for (const rel of [...byFile.keys()].sort()) {
      const e = byFile.get(rel);
      console.log(`${rel.padEnd(w)}  ${String(e.cases).padStart(5)}  ${String(e.rejected).padStart(8)}  ` +
        `${String(e.harmless).padStart(8)}  ${String(e.failure).padStart(8)}`);
    }
  }
  let failures = cases.filter((c) => c.outcome === "failure").length;
  if (hashBase() !== baseHash) {
    console.log("FAIL: the base run's files changed: a run wrote into a hard-linked file in place");
    ++failures;
  }
  const count = (o) => cases.filter((c) => c.outcome === o).length;
  const runs = cases.reduce((s, c) => s + c.results.length, 0);
  console.error(`mutation: ${runs} trainer runs in ${((Date.now() - t0) / 1000).toFixed(0)} s with ${opt.jobs} job(s)`);
  console.log(`mutation: ${cases.length} cases: ${count("rejected")} rejected naming the file, ` +
    `${count("harmless")} harmless, ${failures} failures`);
  if (!opt.keep && failures === 0) fs.rmSync(WORK, { recursive: true, force: true });
  process.exit(failures ? 1 : 0);
}

main().catch((e) => {
  console.log(`mutation: FAIL: ${e.stack || e}`);
  process.exit(2);
});
