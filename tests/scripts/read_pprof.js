// Decode a gpuprof profile.pb.gz with the `pprof-format` npm package (a
// pprof reader written independently of gpuprof) and print what the test
// compares with the folded files, as JSON.
// Usage: node read_pprof.js NODE_MODULES_DIR profile.pb.gz
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const { Profile } = require(path.join(process.argv[2], 'pprof-format'));

const p = Profile.decode(zlib.gunzipSync(fs.readFileSync(process.argv[3])));
const str = i => p.stringTable.strings[Number(i)];
const num = v => Number(v);

// The folded files' frame label of a location: a Python function (no
// mapping, a source file) is `name (file)`, where file is the basename, or
// `dir/__init__.py` for package files; anything else is its name.
const clean = s => s.replace(/;/g, ':').replace(/[\n\r\t]/g, ' ');
function pyFileLabel(file) {
  const parts = file.split('/');
  const base = parts[parts.length - 1];
  if (base !== '__init__.py' && base !== '__main__.py') return base;
  const parent = parts.length > 1 ? parts[parts.length - 2] : '';
  return parent ? parent + '/' + base : base;
}
const functions = new Map(p.function.map(f => [num(f.id), f]));
const mappings = new Map(p.mapping.map(m => [num(m.id), m]));
const locations = new Map();
for (const loc of p.location) {
  if (loc.line.length !== 1) throw new Error(`location ${loc.id} has ${loc.line.length} lines`);
  const f = functions.get(num(loc.line[0].functionId));
  if (!f) throw new Error(`location ${loc.id}: no function ${loc.line[0].functionId}`);
  const name = str(f.name);
  const file = str(f.filename);
  const m = num(loc.mappingId) ? mappings.get(num(loc.mappingId)) : null;
  if (num(loc.mappingId) && !m) throw new Error(`location ${loc.id}: no mapping ${loc.mappingId}`);
  const label = !m && file ? `${clean(name)} (${clean(pyFileLabel(file))})` : clean(name);
  // The folded files' label with --lines: a Python function at a known
  // line is `name (file:LINE)` (line 0 is pprof's "unknown").
  const line = num(loc.line[0].line);
  const lineLabel = !m && file && line > 0
    ? `${clean(name)} (${clean(pyFileLabel(file))}:${line})` : label;
  locations.set(num(loc.id), {
    label, lineLabel, name, file, line,
    library: m ? str(m.filename) : null, address: num(loc.address),
  });
}

const out = {
  sample_types: p.sampleType.map(t => [str(t.type), str(t.unit)]),
  period_type: [str(p.periodType.type), str(p.periodType.unit)],
  period: num(p.period),
  default_sample_type: str(p.defaultSampleType),
  time_nanos: num(p.timeNanos),
  duration_nanos: num(p.durationNanos),
  samples: 0,
  cpu_ns: 0,
  // Per role ("all" too): recorded samples, and per frame label [self,
  // total], by function (`functions`) and by line (`lines`).
  roles: {},
  pids: {},
  label_keys: [],
  frames: [...locations.values()],
};
const keys = new Set();
for (const s of p.sample) {
  const [n, ns] = s.value.map(num);
  out.samples += n;
  out.cpu_ns += ns;
  const labels = {};
  for (const l of s.label) {
    keys.add(str(l.key));
    labels[str(l.key)] = num(l.str) ? str(l.str) : num(l.num);
  }
  out.pids[labels.pid] = (out.pids[labels.pid] || 0) + n;
  for (const role of ['all', labels.role]) {
    const r = out.roles[role] || (out.roles[role] = { samples: 0, functions: {}, lines: {} });
    r.samples += n;
    for (const [key, into] of [['label', r.functions], ['lineLabel', r.lines]]) {
      const stack = s.locationId.map(id => locations.get(num(id))[key]);
      const seen = new Set();
      stack.forEach((label, i) => {
        const e = into[label] || (into[label] = [0, 0]);
        if (i === 0) e[0] += n; // location_id[0] is the leaf
        if (!seen.has(label)) { seen.add(label); e[1] += n; }
      });
    }
  }
}
out.label_keys = [...keys].sort();
process.stdout.write(JSON.stringify(out));
