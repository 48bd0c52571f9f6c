//! Golden files for the flamegraph views: hand-built merged stacks
//! (`tests/data/flame/*.stacks`) through the stack analysis and the
//! flamegraph exporter, compared byte for byte with `tests/data/flame/<case>/`.
//! Re-bless with `GPUPROF_BLESS=1 cargo test --test flame_golden` (see the
//! README there).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use gpuprof::analysis::stacks::{self, ProcMeta, StackData, View};
use gpuprof::analysis::Role;
use gpuprof::event::{Event, MonoNs, Pid, SampleBatch, StackKind, StackStats, Tid};
use gpuprof::export::flame;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/flame")
}

/// Builds the stack events of a recording from the input format.
#[derive(Default)]
struct Builder {
    files: HashMap<String, u32>,
    frames: HashMap<(u32, String), u32>,
    next_frame: u32,
    /// Per file, the next offset given to a frame.
    next_offset: HashMap<u32, u64>,
    nodes: HashMap<(Option<u32>, u32), u32>,
    events: Vec<Event>,
    symbols: Vec<(u32, String)>,
    samples: BTreeMap<i32, Vec<u32>>,
    meta: BTreeMap<i32, (String, String)>,
}

impl Builder {
    fn file(&mut self, path: &str) -> u32 {
        if let Some(id) = self.files.get(path) {
            return *id;
        }
        let id = self.files.len() as u32;
        self.files.insert(path.to_string(), id);
        self.events.push(Event::StackFile {
            id,
            path: path.to_string(),
        });
        id
    }

    /// A frame; unnamed native frames get a new address each time.
    fn frame(&mut self, file: u32, symbol: &str) -> u32 {
        let key = (file, symbol.to_string());
        if !symbol.is_empty() {
            if let Some(id) = self.frames.get(&key) {
                return *id;
            }
        }
        let off = self.next_offset.entry(file).or_insert(0x1000);
        *off += 0x40;
        let offset = *off;
        let id = self.next_frame;
        self.next_frame += 1;
        self.events.push(Event::NativeFrame { id, file, offset });
        if !symbol.is_empty() {
            self.symbols.push((id, symbol.to_string()));
            self.frames.insert(key, id);
        }
        id
    }

    fn line(&mut self, line: &str) {
        let mut parts = line.split('\t');
        let (head, count, stack) = (
            parts.next().expect("head"),
            parts.next().expect("count"),
            parts.next().expect("stack"),
        );
        let mut h = head.split(' ');
        let pid: i32 = h.next().unwrap().parse().expect("pid");
        let role = h.next().expect("role").to_string();
        let name = h.next().expect("name").to_string();
        self.meta.insert(pid, (name, role));
        let mut parent = None;
        for f in stack.split(';') {
            let (file, symbol) = match f.strip_prefix("py:") {
                Some(py) => {
                    // A CPython perf trampoline, named from the map.
                    let (file, name) = py.split_once('!').expect("py:FILE!NAME");
                    (format!("/tmp/perf-{pid}.map"), format!("py::{name}:{file}"))
                }
                None => {
                    let (file, sym) = f.split_once('!').expect("FILE!SYMBOL");
                    (file.to_string(), sym.to_string())
                }
            };
            let file = self.file(&file);
            let frame = self.frame(file, &symbol);
            let next = self.nodes.len() as u32;
            let id = *self.nodes.entry((parent, frame)).or_insert_with(|| {
                self.events.push(Event::StackNode {
                    kind: StackKind::Native,
                    id: next,
                    parent,
                    frame,
                });
                next
            });
            parent = Some(id);
        }
        let n: usize = count.parse().expect("count");
        let leaf = parent.expect("a stack has frames");
        self.samples
            .entry(pid)
            .or_default()
            .extend(std::iter::repeat(leaf).take(n));
    }

    fn finish(mut self) -> (Vec<Event>, BTreeMap<i32, (String, String)>) {
        self.events.push(Event::Symbols {
            names: std::mem::take(&mut self.symbols),
            unnamed: Vec::new(),
        });
        for (pid, stacks) in std::mem::take(&mut self.samples) {
            self.events.push(Event::Samples(SampleBatch {
                kind: StackKind::Native,
                pid: Pid(pid),
                tid: Tid(pid),
                t0: MonoNs(1_000_000_000),
                dt_us: std::iter::once(0)
                    .chain(std::iter::repeat(10_000))
                    .take(stacks.len())
                    .collect(),
                stacks,
                incomplete: vec![],
                source: Default::default(),
            }));
        }
        self.events.push(Event::StackStats(StackStats {
            kind: Some(StackKind::Native),
            interval_ns: 10_000_000,
            ..Default::default()
        }));
        (self.events, self.meta)
    }
}

fn role(r: &str) -> Role {
    match r {
        "main" => Role::Main,
        "worker" => Role::Worker,
        "launcher" => Role::Launcher,
        _ => Role::Other,
    }
}

/// Every output the flamegraph exporter writes for a case, by file name.
fn outputs(input: &str) -> BTreeMap<String, Vec<u8>> {
    let mut b = Builder::default();
    for line in input.lines() {
        if !line.trim().is_empty() && !line.starts_with('#') {
            b.line(line);
        }
    }
    let (events, meta) = b.finish();
    let mut d = StackData::new();
    for e in &events {
        d.add(e);
    }
    let meta_of = |pid: Pid| {
        let (name, r) = &meta[&pid.0];
        ProcMeta {
            name: name.clone(),
            role: role(r),
        }
    };
    let st = stacks::analyze(&mut d, (MonoNs(0), MonoNs(u64::MAX)), &meta_of);
    let mut out = BTreeMap::new();
    for (view, suffix) in [(View::Python, ""), (View::Native, "native-view/")] {
        let mut write = |p: &Path, bytes: &[u8]| -> anyhow::Result<()> {
            let name = p.file_name().unwrap().to_string_lossy();
            out.insert(format!("{suffix}{name}"), bytes.to_vec());
            Ok(())
        };
        flame::write_role_outputs(
            &st,
            Path::new("/"),
            view,
            flame::DEFAULT_SVG_MAX_BYTES,
            &mut write,
        )
        .unwrap();
    }
    // The native-view run writes the same folded files with every frame;
    // keep its SVGs only.
    out.retain(|k, _| !(k.starts_with("native-view/") && k.ends_with("-native.folded")));
    let top = serde_json::to_vec_pretty(&st.report.roles).unwrap();
    out.insert("top-functions.json".into(), top);
    out
}

fn check(case: &str) {
    let dir = data_dir();
    let input = std::fs::read_to_string(dir.join(format!("{case}.stacks"))).unwrap();
    let got = outputs(&input);
    let expected_dir = dir.join(case);
    if std::env::var_os("GPUPROF_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&expected_dir);
        for (name, bytes) in &got {
            let p = expected_dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        return;
    }
    let mut failures = Vec::new();
    for (name, bytes) in &got {
        match std::fs::read(expected_dir.join(name)) {
            Ok(want) if want == *bytes => {}
            Ok(_) => failures.push(format!("{name} differs")),
            Err(_) => failures.push(format!("{name} is not blessed")),
        }
    }
    let mut blessed = Vec::new();
    for e in walk(&expected_dir) {
        let rel = e
            .strip_prefix(&expected_dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        blessed.push(rel);
    }
    for name in blessed {
        if !got.contains_key(&name) {
            failures.push(format!("{name} is no longer written"));
        }
    }
    assert!(
        failures.is_empty(),
        "{case}: {} (GPUPROF_BLESS=1 re-blesses after an intended change)",
        failures.join("; ")
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn dataloader_workers_fold_to_the_program() {
    check("dataloader");
}

#[test]
fn threads_static_interpreter_and_non_python_processes() {
    check("threads");
}
