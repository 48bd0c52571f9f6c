//! Symbol naming: every frame of the recording (native file offset,
//! Python function, marker) resolved to one label and class.

use super::intake::{Frame, StackData};
use super::*;

/// A recorded frame of a native stack, for merging: native code, a Python
/// frame of the same instant (`true`: an entry frame), or a marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Native,
    Python(bool),
    Marker,
}

pub(super) struct Resolver<'a> {
    pub(super) d: &'a StackData,
    pub(super) native_cache: HashMap<u32, Vec<(u32, Kind)>>,
    pub(super) py_cache: HashMap<u32, Vec<(u32, bool)>>,
    pub(super) frames: Vec<FrameInfo>,
    pub(super) frame_ids: HashMap<FrameInfo, u32>,
    pub(super) native_name: HashMap<u32, u32>,
    pub(super) py_name: HashMap<u32, u32>,
}

/// `/tmp/perf-<pid>.map`: JIT code named by the process (CPython's perf
/// trampolines name Python functions `py::qualname:filename`).
pub(super) fn is_perf_map(path: &str) -> bool {
    path.strip_prefix("/tmp/perf-")
        .and_then(|r| r.strip_suffix(".map"))
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

pub(super) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The file part of a Python frame's label: the file's name, with its
/// folder where the name alone says nothing — every package has an
/// `__init__.py`, so `<module> (__init__.py)` does not say which import ran
/// (`<module> (torch/__init__.py)` does).
pub(crate) fn py_file_label(path: &str) -> &str {
    let base = basename(path);
    if !matches!(base, "__init__.py" | "__main__.py") {
        return base;
    }
    let dir = path[..path.len() - base.len()].trim_end_matches('/');
    let parent = basename(dir);
    if parent.is_empty() {
        base
    } else {
        &path[dir.len() - parent.len()..]
    }
}

impl<'a> Resolver<'a> {
    pub(super) fn intern(&mut self, f: FrameInfo) -> u32 {
        if let Some(id) = self.frame_ids.get(&f) {
            return *id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    pub(super) fn intern_python(&mut self, name: &str, file: &str) -> u32 {
        self.intern_python_at(name, file, None)
    }

    /// A Python frame, `name (file.py)`, or with `--lines`
    /// `name (file.py:LINE)` (`file.py:?` when its line could not be
    /// decoded) where the recording has its line.
    pub(super) fn intern_python_at(&mut self, name: &str, file: &str, line: Option<u32>) -> u32 {
        let file_label = clean(py_file_label(file));
        let label = match line.filter(|_| self.d.lines) {
            Some(0) => format!("{} ({file_label}:?)", clean(name)),
            Some(l) => format!("{} ({file_label}:{l})", clean(name)),
            None => format!("{} ({file_label})", clean(name)),
        };
        // Interned by line even when labelled by function: the profiles
        // keep the lines (see `Stacks::collapse_lines`).
        self.intern(FrameInfo {
            label,
            class: FrameClass::Python,
            name: name.to_string(),
            file: file.to_string(),
            eval: false,
            line,
        })
    }

    pub(super) fn native_frame_name(&mut self, frame: u32) -> u32 {
        if let Some(n) = self.native_name.get(&frame) {
            return *n;
        }
        let loc = match self.d.native_frames.get(&frame) {
            Some(Frame::Native { file, offset }) => {
                Some((self.d.files.get(file).map_or("?", |p| p.as_str()), *offset))
            }
            Some(Frame::Python {
                name, file, line, ..
            }) => {
                let (name, file, line) = (name.clone(), file.clone(), *line);
                let id = self.intern_python_at(&name, &file, line);
                self.native_name.insert(frame, id);
                return id;
            }
            Some(Frame::Marker(m)) => {
                let m = m.clone();
                let id = self.intern(FrameInfo {
                    label: clean(&m),
                    class: FrameClass::Marker,
                    name: m,
                    file: String::new(),
                    eval: false,
                    line: None,
                });
                self.native_name.insert(frame, id);
                return id;
            }
            None => None,
        };
        let sym = self.d.symbols.get(&frame);
        let id = match (sym, loc) {
            // A CPython perf trampoline: the Python function itself.
            (Some(sym), Some((path, _))) if is_perf_map(path) && sym.starts_with("py::") => {
                let rest = &sym["py::".len()..];
                let (name, file) = rest.split_once(':').unwrap_or((rest, ""));
                self.intern_python(name, file)
            }
            (Some(sym), loc) => {
                let file = loc.map_or(String::new(), |l| l.0.to_string());
                let eval = EVAL_FRAMES.contains(&sym.as_str());
                // Long C++ names shortened in the label, whole in `name`.
                self.intern(FrameInfo {
                    label: clean(&crate::analysis::symbols::short_label(sym)),
                    class: FrameClass::Native,
                    name: sym.clone(),
                    file,
                    eval,
                    line: None,
                })
            }
            (None, Some((path, offset))) => {
                let label = format!("[{}+{:#x}]", clean(basename(path)), offset);
                self.intern(FrameInfo {
                    name: String::new(),
                    label,
                    class: FrameClass::Native,
                    file: path.to_string(),
                    eval: false,
                    line: None,
                })
            }
            (None, None) => self.intern(FrameInfo {
                label: "[unknown]".into(),
                class: FrameClass::Marker,
                name: "[unknown]".into(),
                file: String::new(),
                eval: false,
                line: None,
            }),
        };
        self.native_name.insert(frame, id);
        id
    }

    pub(super) fn py_frame_name(&mut self, frame: u32) -> (u32, bool) {
        let entry = matches!(
            self.d.py_frames.get(&frame),
            Some(Frame::Python { entry: true, .. })
        );
        if let Some(n) = self.py_name.get(&frame) {
            return (*n, entry);
        }
        let id = match self.d.py_frames.get(&frame) {
            Some(Frame::Python { name, file, .. }) => {
                let (name, file) = (name.clone(), file.clone());
                self.intern_python(&name, &file)
            }
            _ => self.intern(FrameInfo {
                label: "[unknown python]".into(),
                class: FrameClass::Marker,
                name: "[unknown python]".into(),
                file: String::new(),
                eval: false,
                line: None,
            }),
        };
        self.py_name.insert(frame, id);
        (id, entry)
    }

    /// Frames of a recorded native stack, outermost first, with their kind.
    pub(super) fn native(&mut self, stack: u32) -> Vec<(u32, Kind)> {
        if let Some(v) = self.native_cache.get(&stack) {
            return v.clone();
        }
        let mut frames: Vec<u32> = super::intake::leaf_first(&self.d.native_nodes, stack).collect();
        frames.reverse();
        let v: Vec<(u32, Kind)> = frames
            .into_iter()
            .map(|f| {
                let kind = match self.d.native_frames.get(&f) {
                    Some(Frame::Python { entry, .. }) => Kind::Python(*entry),
                    Some(Frame::Marker(_)) => Kind::Marker,
                    _ => Kind::Native,
                };
                (self.native_frame_name(f), kind)
            })
            .collect();
        self.native_cache.insert(stack, v.clone());
        v
    }

    /// A native frame of the interpreter loop that runs one run of Python
    /// frames.
    pub(super) fn is_eval_loop(&self, id: u32) -> bool {
        let f = &self.frames[id as usize];
        f.class != FrameClass::Python && f.name.starts_with(EVAL_LOOP)
    }

    /// Python (frame, entry) frames, outermost first.
    pub(super) fn python(&mut self, stack: u32) -> Vec<(u32, bool)> {
        if let Some(v) = self.py_cache.get(&stack) {
            return v.clone();
        }
        let mut frames: Vec<u32> = super::intake::leaf_first(&self.d.py_nodes, stack).collect();
        frames.reverse();
        let v: Vec<(u32, bool)> = frames.into_iter().map(|f| self.py_frame_name(f)).collect();
        self.py_cache.insert(stack, v.clone());
        v
    }
}

/// Make a name safe for the folded format (`;` separates frames, the last
/// space separates the count).
pub(crate) fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' | '\t' => ' ',
            c => c,
        })
        .collect()
}
