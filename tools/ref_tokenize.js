// Reference tokenizers for the tests (Node): prints the ids of a UTF-8 file as JSON.
//   node tools/ref_tokenize.js gpt3encoder|tiktoken-gpt2|tiktoken-llama3|lenml-FAMILY DATA_DIR FILE
// tiktoken-llama3 builds a tiktoken encoding from the Llama 3 tokenizer.json's own ranks and regex.
// lenml-llama2 / -qwen3 / -gemma3 run @lenml/tokenizers (transformers.js's tokenizers) on the family's
// tokenizer.json + tokenizer_config.json: encode(text, {add_special_tokens: false}).
// With a 4th argument N (bench mode) it prints {"seconds": median of N timed encodings, "tokens": n} instead.
const fs = require("fs");
const [, , which, dataArg, file, benchIters] = process.argv;
const dataDir = require("path").resolve(dataArg);
const text = fs.readFileSync(file, "utf8");
let ids, encodeFn;
if (which.startsWith("lenml-")) {
  const L = require(dataDir + "/lenml-tokenizers/package/dist/main.js");
  const models = dataDir + "/tokenizer-" + which.slice(6) + "/package/models/";
  const tok = L.TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(models + "tokenizer.json", "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(models + "tokenizer_config.json", "utf8")),
  });
  encodeFn = (t) => tok.encode(t, { add_special_tokens: false });
} else if (which === "gpt3encoder") {
  const E = require(dataDir + "/gpt-3-encoder/package/Encoder.js");
  encodeFn = (t) => E.encode(t);
} else {
  const { Tiktoken } = require(dataDir + "/tiktoken/package/lite/tiktoken.cjs");
  let ranks, pat;
  if (which === "tiktoken-gpt2") {
    const g = JSON.parse(fs.readFileSync(dataDir + "/tiktoken/package/encoders/gpt2.json", "utf8"));
    ranks = g.bpe_ranks;
    pat = g.pat_str;
  } else {
    const t = JSON.parse(fs.readFileSync(dataDir + "/tokenizer-llama3/package/models/tokenizer.json", "utf8"));
    // byte-level token strings -> bytes -> base64, in id order
    const bs = [];
    for (let b = 33; b <= 126; b++) bs.push(b);
    for (let b = 161; b <= 172; b++) bs.push(b);
    for (let b = 174; b <= 255; b++) bs.push(b);
    const cs = bs.slice();
    let n = 0;
    for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
    const inv = new Map();
    bs.forEach((b, i) => inv.set(cs[i], b));
    const vocab = Object.entries(t.model.vocab).sort((a, b) => a[1] - b[1]);
    const toks = vocab.map(([s]) => Buffer.from([...s].map((ch) => inv.get(ch.codePointAt(0)))).toString("base64"));
    ranks = "! 0 " + toks.join(" ");
    pat = t.pre_tokenizer.pretokenizers[0].pattern.Regex;
  }
  const enc = new Tiktoken(ranks, {}, pat);
  encodeFn = (t) => enc.encode_ordinary(t);
}
if (benchIters) {
  encodeFn(text);  // warm-up
  const ts = [];
  let n = 0;
  for (let i = 0; i < Number(benchIters); i++) {
    const t0 = process.hrtime.bigint();
    n = encodeFn(text).length;
    ts.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  ts.sort((a, b) => a - b);
  process.stdout.write(JSON.stringify({ seconds: ts[Math.floor(ts.length / 2)], tokens: n }));
} else {
  ids = Array.from(encodeFn(text));
  process.stdout.write(JSON.stringify(ids));
}
