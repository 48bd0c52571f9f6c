// Load a gpuprof profile.speedscope.json with speedscope's own importer
// (the one its viewer runs, from the `speedscope` npm package's bundle) and
// print what the test compares with the folded files, as JSON.
// Usage: node read_speedscope.js NODE_MODULES_DIR profile.speedscope.json
//
// The package ships the viewer as one browser bundle: the importer of
// speedscope's own format is found in it by the message it logs
// ("Importing as speedscope json file"), exposed, and the bundle is run
// with stand-ins for the browser's objects (the viewer itself fails to
// start without a page, after the importer is defined).
'use strict';
const fs = require('fs');
const path = require('path');
const vm = require('vm');

const rel = path.join(process.argv[2], 'speedscope', 'dist', 'release');
const bundle = fs.readdirSync(rel).find(f => /^speedscope-.*\.js$/.test(f));
if (!bundle) throw new Error(`no speedscope bundle in ${rel}`);
let src = fs.readFileSync(path.join(rel, bundle), 'utf8');
const m = src.match(/console\.log\("Importing as speedscope json file"\),([\w$]+)\(/);
if (!m) throw new Error('speedscope importer not found in ' + bundle);
const head = '"use strict";(()=>{';
if (!src.startsWith(head)) throw new Error('unexpected bundle layout');
src = head + 'globalThis.__gpuprofImport=' + m[1] + ';' + src.slice(head.length);
const stub = () => new Proxy(function () {}, {
  get: (t, k) => (k === Symbol.toPrimitive ? () => '' : stub()),
  apply: () => stub(),
  construct: () => stub(),
});
const quiet = { log() {}, warn() {}, error() {}, info() {} };
// Timers never fire: nothing of the viewer runs after the bundle's load.
const ctx = { console: quiet, window: stub(), document: stub(), navigator: stub(), location: stub(),
  setTimeout: () => 0, clearTimeout: () => {}, setInterval: () => 0, clearInterval: () => {},
  URL, TextDecoder, TextEncoder };
ctx.globalThis = ctx;
ctx.self = ctx;
vm.createContext(ctx);
try { vm.runInContext(src, ctx); } catch (e) { /* the viewer needs a page */ }
if (typeof ctx.__gpuprofImport !== 'function') throw new Error('speedscope importer not exposed');

const file = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const schema = JSON.parse(fs.readFileSync(path.join(rel, 'file-format-schema.json'), 'utf8'));
const group = ctx.__gpuprofImport(file);
const out = {
  schema: file.$schema,
  schema_title: schema.title || null,
  version: JSON.parse(fs.readFileSync(path.join(process.argv[2], 'speedscope', 'package.json'))).version,
  name: group.name,
  active: group.indexToView,
  // Per profile: its weight, and its stacks as speedscope's own call tree
  // holds them (root to leaf; frames as [name, file, line]) with their
  // self weight.
  profiles: group.profiles.map(p => {
    const stacks = [];
    const walk = (node, path) => {
      const here = node.frame && node.parent ? [...path, [node.frame.name, node.frame.file === undefined ? null : node.frame.file, node.frame.line === undefined ? null : node.frame.line]] : path;
      if (node.getSelfWeight() > 0 && here.length > 0) stacks.push([here, node.getSelfWeight()]);
      for (const c of node.children) walk(c, here);
    };
    walk(p.getGroupedCalltreeRoot(), []);
    return { name: p.getName(), unit: p.getWeightUnit(), total: p.getTotalWeight(), stacks };
  }),
};
process.stdout.write(JSON.stringify(out));
