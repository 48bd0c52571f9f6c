//! The layer rule of `docs/architecture.md`, checked on the source: no
//! module imports from a layer above its own, `event` and `units` import
//! nothing of the product, and no two files import each other, directly or
//! through others.
//!
//! Imports are read with a small parser: every `crate::`, `super::` and
//! `self::` path outside comments, strings and `#[cfg(test)]` items (unit
//! tests build their fixtures with whatever layer they need), resolved to
//! the deepest source file its segments name. A file declared as
//! `#[cfg(test)] mod name;` is test code as a whole. A folder's `mod.rs` declares
//! its children, so an edge from a module to one of its own descendants is
//! not an import for the circle rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers, lowest first: a module may import from its own layer and the
/// ones before it. Top-level modules not named here are the application
/// layer (`session`, `live`, `cli`, `outputs`, ...), which may import all.
const LAYERS: &[&[&str]] = &[
    &["event", "units"],
    &["vocab", "selfcost", "outdir"],
    &["record"],
    &["collect", "agent", "launch"],
    &["analysis"],
    &["diagnose"],
    &["export"],
];

/// Modules that import nothing else of the product.
const LEAVES: &[&str] = &["event", "units"];

/// File circles known and left for now, each with its reason. Every entry
/// must still be a circle (the test says when one can go).
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[(
    &["collect/perf/dump.rs", "collect/perf/offcpu.rs"],
    "offcpu.rs is being reworked on another branch; move copy_memory, \
     parse_syscall and syscall_marker below both after that merge",
)];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `analysis/stacks/merge.rs` → `["analysis", "stacks", "merge"]`;
/// `mod.rs` and `lib.rs` name their folder.
fn module_of(rel: &str) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// The source with comments, string and char literals blanked out.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident_byte(b, i) {
            // Raw string r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let mut close = vec![b'"'];
            close.resize(1 + hashes, b'#');
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\''), else a lifetime or label.
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else {
                let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch_len) == Some(&b'\'') {
                    i += ch_len + 2;
                    out.push_str("' '");
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn ident_byte(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The stripped source without `#[cfg(test)]` items.
fn without_tests(src: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = src;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let item = &rest[at + ATTR.len()..];
        let b = item.as_bytes();
        let mut i = 0;
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        rest = &item[i..];
    }
    out.push_str(rest);
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Paths of a use tree `a::b::{c, d::{e, f}}`, each as its segments.
fn use_tree(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_tree(prefix, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if !inner[start..].trim().is_empty() {
            use_tree(prefix, &inner[start..], out);
        }
        return;
    }
    let name = ident(tree);
    let mut path = prefix.to_vec();
    if name.is_empty() {
        out.push(path);
        return;
    }
    path.push(name.to_string());
    match tree[name.len()..].trim_start().strip_prefix("::") {
        Some(rest) => use_tree(&path, rest, out),
        None => out.push(path),
    }
}

/// Every product path in a stripped source: `use` trees and inline
/// `crate::`/`super::`/`self::` paths.
fn paths(src: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let word_start = !ident_byte(b, i) && (i == 0 || b[i - 1] != b':');
        if word_start && src[i..].starts_with("use ") {
            let end = src[i..].find(';').map_or(b.len(), |e| i + e);
            let tree = src[i + 4..end].trim();
            if ["crate", "super", "self"].contains(&ident(tree)) {
                let tree: String = tree.split_whitespace().collect();
                use_tree(&[], &tree, &mut out);
            }
            i = end;
            continue;
        }
        if word_start {
            let w = ident(&src[i..]);
            if ["crate", "super", "self"].contains(&w) && src[i + w.len()..].starts_with("::") {
                let mut j = i;
                let mut segs = Vec::new();
                loop {
                    let s = ident(&src[j..]);
                    if s.is_empty() {
                        break;
                    }
                    segs.push(s.to_string());
                    j += s.len();
                    if src[j..].starts_with("::") {
                        j += 2;
                    } else {
                        break;
                    }
                }
                out.push(segs);
                i = j;
                continue;
            }
        }
        i += 1;
    }
    out
}

struct Source {
    /// File → files it imports.
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn read_sources() -> Source {
    let root = src_dir();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let rel: Vec<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let modules: BTreeMap<Vec<String>, String> = rel
        .iter()
        .filter(|r| r.as_str() != "main.rs")
        .map(|r| (module_of(r), r.clone()))
        .collect();
    let texts: Vec<String> = files
        .iter()
        .map(|p| strip(&std::fs::read_to_string(p).unwrap()))
        .collect();
    // Files that are unit tests as a whole (`#[cfg(test)] mod tests;`).
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for (text, r) in texts.iter().zip(&rel) {
        let here = if r == "main.rs" {
            Vec::new()
        } else {
            module_of(r)
        };
        for part in text.split("#[cfg(test)]").skip(1) {
            let decl = part.trim_start();
            if let Some(rest) = decl.strip_prefix("mod ") {
                let name = ident(rest.trim_start());
                if rest.trim_start()[name.len()..]
                    .trim_start()
                    .starts_with(';')
                {
                    let mut m = here.clone();
                    m.push(name.to_string());
                    test_modules.push(m);
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (text, r) in texts.iter().zip(&rel) {
        let here = if r == "main.rs" {
            Vec::new()
        } else {
            module_of(r)
        };
        if test_modules.iter().any(|t| here.starts_with(t)) {
            continue;
        }
        let set = edges.entry(r.clone()).or_default();
        for p in paths(&without_tests(text)) {
            let mut segs: Vec<String> = match p[0].as_str() {
                "crate" => Vec::new(),
                "self" => here.clone(),
                _ => {
                    let ups = p.iter().take_while(|s| *s == "super").count();
                    here[..here.len().saturating_sub(ups)].to_vec()
                }
            };
            segs.extend(
                p.iter()
                    .skip_while(|s| ["crate", "self", "super"].contains(&s.as_str()))
                    .cloned(),
            );
            let target = (0..=segs.len())
                .rev()
                .find_map(|n| modules.get(&segs[..n]))
                .unwrap();
            if target != r {
                set.insert(target.clone());
            }
        }
    }
    Source { edges }
}

fn top(file: &str) -> &str {
    file.split('/').next().unwrap().trim_end_matches(".rs")
}

fn layer(file: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&top(file)))
        .unwrap_or(LAYERS.len())
}

fn layer_name(file: &str) -> String {
    match LAYERS.get(layer(file)) {
        Some(l) => l.join("/"),
        None => "application".into(),
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = read_sources();
    let mut bad = Vec::new();
    for (from, tos) in &src.edges {
        for to in tos {
            if top(from) == top(to) {
                continue;
            }
            if LEAVES.contains(&top(from)) {
                bad.push(format!(
                    "{from} imports {to}: {} imports nothing of the product",
                    top(from)
                ));
            } else if layer(to) > layer(from) {
                bad.push(format!(
                    "{from} ({}) imports {to} ({}), a layer above it",
                    layer_name(from),
                    layer_name(to)
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "layer rule broken (docs/architecture.md):\n{}",
        bad.join("\n")
    );
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn no_two_files_import_each_other() {
    let src = read_sources();
    // A module declaring its children is not an import of them.
    let edges: BTreeMap<String, BTreeSet<String>> = src
        .edges
        .iter()
        .map(|(from, tos)| {
            let m = module_of(from);
            let tos = tos
                .iter()
                .filter(|to| {
                    let t = module_of(to);
                    !(from != "main.rs" && t.len() > m.len() && t.starts_with(&m))
                })
                .cloned()
                .collect();
            (from.clone(), tos)
        })
        .collect();
    let found = circles(&edges);
    let known: Vec<Vec<String>> = KNOWN_CIRCLES
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|c| !known.contains(c))
        .map(|c| c.join(" ↔ "))
        .collect();
    assert!(
        new.is_empty(),
        "files that import each other (move what they share into one lower file):\n{}",
        new.join("\n")
    );
    for k in &known {
        assert!(
            found.contains(k),
            "{} is no longer a circle: drop it from KNOWN_CIRCLES",
            k.join(" ↔ ")
        );
    }
}

#[test]
fn the_parser_reads_use_trees_and_skips_comments_strings_and_tests() {
    let src = "use crate::a::{b, c::{d, e}};\n// crate::x::y\nlet s = \"crate::z\";\n\
               let c = '\"'; f(super::g::h);\n#[cfg(test)]\nmod tests { use crate::t; }\n";
    let p = paths(&without_tests(&strip(src)));
    let p: Vec<String> = p.iter().map(|s| s.join("::")).collect();
    assert_eq!(
        p,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "super::g::h"
        ]
    );
}

/// The only files that may name clap: the command line is parsed in
/// `cli.rs` (and run from `main.rs`); below them configuration is
/// clap-free (`config.rs`, docs/architecture.md).
const CLAP_FILES: &[&str] = &["main.rs", "cli.rs"];

/// Whether a source names the `clap` crate (outside comments and strings).
fn names_clap(src: &str) -> bool {
    let text = strip(src);
    let b = text.as_bytes();
    text.match_indices("clap").any(|(i, _)| {
        let end = i + "clap".len();
        !ident_byte(b, i) && !(end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_'))
    })
}

#[test]
fn only_main_and_cli_import_clap() {
    let users: Vec<String> = sources()
        .into_iter()
        .filter(|(rel, text)| !CLAP_FILES.contains(&rel.as_str()) && names_clap(text))
        .map(|(rel, _)| rel)
        .collect();
    assert!(
        users.is_empty(),
        "clap is named outside main.rs and cli.rs: {users:?}; parse flags in cli.rs into the clap-free types of config.rs"
    );
    assert!(names_clap("use clap::Parser;"));
    assert!(names_clap("#[derive(clap::ValueEnum)]"));
    assert!(!names_clap(
        "// clap is not used here\nlet s = \"clap\"; let clapper = 1;"
    ));
}

/// Longest file and function in `src/` (docs/architecture.md, "Sizes").
const MAX_FILE_LINES: usize = 1500;
const MAX_FN_LINES: usize = 150;

fn sources() -> Vec<(String, String)> {
    let root = src_dir();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect()
}

/// Functions of a rustfmt-formatted source and their lengths in lines,
/// from the `fn` line to the closing brace at the same indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let indent = l.len() - l.trim_start().len();
        let mut rest = l.trim_start();
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
            "extern \"C\" ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        if l.trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(end) = lines[i..].iter().position(|x| x.starts_with(&close)) else {
            continue;
        };
        out.push((ident(sig).to_string(), i + 1, end + 1));
    }
    out
}

#[test]
fn no_file_in_src_is_over_1500_lines() {
    let long: Vec<String> = sources()
        .into_iter()
        .map(|(f, t)| (f, t.lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(f, n)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by job, see docs/architecture.md):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_in_src_is_over_150_lines() {
    let mut long = Vec::new();
    for (f, t) in sources() {
        for (name, line, n) in functions(&t) {
            if n > MAX_FN_LINES {
                long.push(format!("{f}:{line}: {name} is {n} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn function_lengths_are_counted_to_the_closing_brace() {
    let src = "fn a() {\n    x();\n}\n\nimpl T {\n    pub fn b(\n        y: u32,\n    ) -> u32 {\n        y\n    }\n    fn c();\n}\n";
    assert_eq!(
        functions(src),
        [("a".to_string(), 1, 3), ("b".to_string(), 6, 5)]
    );
}
