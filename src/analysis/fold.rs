//! The Python view of a merged stack: what a flamegraph of a Python program
//! shows by default.
//!
//! A merged stack is a list of frames, each a Python function (name, source
//! file) or native code (name, the library or executable it lies in). The
//! Python view keeps the program's own structure and folds away the
//! interpreter's plumbing, deciding from the file each frame belongs to —
//! never from a list of function names:
//!
//! - **Interpreter frames** (native code of libpython, of the `python`
//!   executable, or of any binary holding the interpreter loop) are dropped
//!   wherever they are: between two Python frames they are the call
//!   machinery (`_PyEval_*`, `PyObject_Vectorcall`, `type_call` …), below
//!   the innermost Python frame their time becomes that function's self
//!   time (`PyNumber_And`, `_PyLong_Multiply` … inside `augment`).
//! - **Native code of extensions and libraries** (zlib, OpenSSL, libjpeg,
//!   Pillow, NumPy, libtorch, the CUDA runtime) stays, in place: `pack →
//!   zlib_compress → deflate`.
//! - **Process and thread start** — the frames before the first Python or
//!   library frame, in the interpreter or the C runtime (`_start`,
//!   `__libc_start_main`, `Py_BytesMain` … `PyEval_EvalCode`, `clone3`,
//!   `start_thread`) — fold into the process root.
//! - **Launcher plumbing**: in a process or thread started by the standard
//!   library's launchers (`multiprocessing`'s `BaseProcess._bootstrap`, as
//!   DataLoader workers are, or `threading`'s `Thread._bootstrap`), everything
//!   up to the target function — the parent's stack at the fork, the
//!   bootstrap and `run` — folds into the process root.
//! - Native code that its file does not name (`static` functions of a
//!   stripped library) shows as its library, `[libz.so.1]`, one frame for
//!   consecutive ones, rather than one box per address.
//! - A stack that ran Python code (it has an interpreter loop frame) but
//!   has no Python frame attached gets `[python: not sampled]` in their
//!   place, so unattributed native time stays visible.
//! - The interpreter running no Python code at all (start-up, finalizing
//!   modules and collecting garbage at exit) is one frame,
//!   `[python interpreter]`.
//!
//! Stacks of processes that never ran Python are left as sampled.

use serde::Serialize;

/// What a frame is, for folding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameClass {
    /// A Python function.
    Python,
    /// Native code of the Python interpreter itself.
    Interpreter,
    /// The C runtime: libc, libpthread, the dynamic loader.
    Runtime,
    /// Other native code: extensions, libraries, the program itself.
    Native,
    /// A frame made up by the analysis (`[python: not sampled]`, …).
    Marker,
}

/// One frame as the folding sees it.
#[derive(Clone, Copy, Debug)]
pub struct FoldFrame<'a> {
    pub class: FrameClass,
    /// Python: the function's (qualified) name; native: the symbol, empty
    /// when the file does not name the code.
    pub name: &'a str,
    /// Python: the source file; native: the library or executable.
    pub file: &'a str,
    /// A frame of the interpreter loop, which runs Python frames.
    pub eval: bool,
}

/// A frame of the Python view: one of the input frames, the library of an
/// input frame that has no name, or a made-up one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewFrame {
    Input(usize),
    Library(usize),
    Made(&'static str),
}

/// Shown where Python ran but no Python frame is attached to the sample.
pub const NOT_SAMPLED: &str = "[python: not sampled]";
/// Above the Python frames of a sample that has none of its own instant,
/// when the Python view shows its thread's py-spy stack, read the same just
/// before and just after the sample.
pub const PYSPY_BRACKETED: &str = "[python: py-spy, same stack before and after]";
/// Between a sample's same-instant Python frames and the native frames
/// that were unwound, when unwinding stopped before the interpreter.
pub const NATIVE_UNKNOWN: &str = "[native frames unknown]";
/// The pseudo file of addresses outside every mapping.
const UNKNOWN_FILE: &str = "[unknown]";
/// Shown for the interpreter running no Python code (start-up, shutdown).
pub const INTERPRETER_ONLY: &str = "[python interpreter]";

/// What folding a stack did, for the flamegraph's subtitle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldNotes {
    /// Interpreter frames were dropped.
    pub interpreter: bool,
    /// Process or thread start frames folded into the root.
    pub start: bool,
    /// The launcher whose plumbing folded into the root.
    pub launcher: Option<Launcher>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Launcher {
    Multiprocessing,
    Threading,
}

impl Launcher {
    pub fn as_str(self) -> &'static str {
        match self {
            Launcher::Multiprocessing => "multiprocessing",
            Launcher::Threading => "threading",
        }
    }

    /// The standard-library module that starts the process or thread.
    fn of_file(file: &str) -> Option<Launcher> {
        let f = file.replace('\\', "/");
        if f.ends_with("/multiprocessing/process.py") {
            Some(Launcher::Multiprocessing)
        } else if f.ends_with("/threading.py") {
            Some(Launcher::Threading)
        } else {
            None
        }
    }
}

/// The last component of a dotted qualified name (`BaseProcess.run` →
/// `run`).
fn short_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// A launcher's entry point: `_bootstrap` of `multiprocessing/process.py`
/// or `threading.py`.
fn launcher_entry(f: &FoldFrame) -> Option<Launcher> {
    if f.class != FrameClass::Python || short_name(f.name) != "_bootstrap" {
        return None;
    }
    Launcher::of_file(f.file)
}

/// The launcher's own frames between its entry and the target function:
/// `_bootstrap_inner` and `run` of the same module (a `run` overridden in
/// the program's own file is the program's code and stays).
fn launcher_step(f: &FoldFrame, l: Launcher) -> bool {
    f.class == FrameClass::Python
        && Launcher::of_file(f.file) == Some(l)
        && matches!(short_name(f.name), "_bootstrap_inner" | "run")
}

/// The Python view of one stack (outermost frame first).
pub fn python_view(frames: &[FoldFrame]) -> (Vec<ViewFrame>, FoldNotes) {
    use FrameClass::*;
    let mut notes = FoldNotes::default();
    let has_python = frames.iter().any(|f| f.class == Python);
    let has_eval = frames.iter().any(|f| f.eval);
    let has_marker = frames.iter().any(|f| f.class == Marker);

    // Launcher plumbing: up to the innermost launcher entry and its own
    // frames after it (interpreter and C runtime frames in between).
    let mut begin = 0;
    if let Some((b, l)) = frames
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, f)| launcher_entry(f).map(|l| (i, l)))
    {
        let mut last = b;
        for (j, f) in frames.iter().enumerate().skip(b + 1) {
            match f.class {
                Interpreter | Runtime => {}
                Python if launcher_step(f, l) => last = j,
                _ => break,
            }
        }
        begin = last + 1;
        notes.launcher = Some(l);
    }

    // Process and thread start: interpreter and C runtime frames before the
    // first frame that stays.
    let mut k = begin;
    while k < frames.len() && matches!(frames[k].class, Interpreter | Runtime) {
        k += 1;
    }
    notes.start = k > begin;
    let mut out = Vec::with_capacity(frames.len() - k + 1);
    if has_eval && !has_python && !has_marker {
        out.push(ViewFrame::Made(NOT_SAMPLED));
    } else if k == frames.len()
        && begin == 0
        && !has_python
        && frames.iter().any(|f| f.class == Interpreter)
    {
        // The interpreter outside any Python code: start-up, shutdown
        // (finalizing modules, the last garbage collections), which can
        // take seconds in a big program.
        out.push(ViewFrame::Made(INTERPRETER_ONLY));
    }
    let mut after_unknown = false;
    for (i, f) in frames.iter().enumerate().skip(k) {
        // Addresses outside every mapping just below `[native frames
        // unknown]` are where the unwinder lost its way: that frame says so.
        let lost = after_unknown && f.name.is_empty() && f.file == UNKNOWN_FILE;
        after_unknown = (f.class == Marker && f.name == NATIVE_UNKNOWN) || lost;
        if lost {
            continue;
        }
        if f.class == Interpreter {
            notes.interpreter = true;
        } else if f.name.is_empty() && f.class != Python && f.class != Marker {
            let same =
                matches!(out.last(), Some(ViewFrame::Library(j)) if frames[*j].file == f.file);
            if !same {
                out.push(ViewFrame::Library(i));
            }
        } else {
            out.push(ViewFrame::Input(i));
        }
    }
    if frames[begin..k].iter().any(|f| f.class == Interpreter) {
        notes.interpreter = true;
    }
    (out, notes)
}

/// The class of a native frame's file, by what the file is: the
/// interpreter (`libpython*`, a `python*` executable, or a file that holds
/// the interpreter loop — `interp`), the C runtime, or other native code.
pub fn native_class(path: &str, holds_interpreter_loop: bool) -> FrameClass {
    let base = path.rsplit('/').next().unwrap_or(path);
    if holds_interpreter_loop || base.starts_with("libpython") || is_python_executable(base) {
        FrameClass::Interpreter
    } else if is_runtime(base) {
        FrameClass::Runtime
    } else {
        FrameClass::Native
    }
}

/// `python`, `python3`, `python3.12`, `python3.13t`, `python3.12d`.
fn is_python_executable(base: &str) -> bool {
    let Some(rest) = base.strip_prefix("python") else {
        return false;
    };
    rest.chars()
        .all(|c| c.is_ascii_digit() || c == '.' || c.is_ascii_lowercase())
        && rest.chars().next().map_or(true, |c| c.is_ascii_digit())
}

/// The C library, its threads and the dynamic loader (glibc and musl).
fn is_runtime(base: &str) -> bool {
    [
        "libc.so",
        "libc-",
        "libpthread",
        "libdl.so",
        "libdl-",
        "ld-linux",
        "ld-musl",
        "ld.so",
    ]
    .iter()
    .any(|p| base.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use FrameClass::*;

    fn f<'a>(class: FrameClass, name: &'a str, file: &'a str) -> FoldFrame<'a> {
        FoldFrame {
            class,
            name,
            file,
            eval: name.starts_with("_PyEval_EvalFrame"),
        }
    }

    fn names(frames: &[FoldFrame], v: &[ViewFrame]) -> Vec<String> {
        v.iter()
            .map(|x| match x {
                ViewFrame::Input(i) => frames[*i].name.to_string(),
                ViewFrame::Library(i) => format!("[{}]", frames[*i].file),
                ViewFrame::Made(s) => s.to_string(),
            })
            .collect()
    }

    #[test]
    fn files_are_classified_by_what_they_are() {
        assert_eq!(
            native_class("/usr/lib/libpython3.12.so.1.0", false),
            Interpreter
        );
        assert_eq!(native_class("/opt/py/bin/python3.12", false), Interpreter);
        assert_eq!(native_class("/usr/bin/python3", false), Interpreter);
        assert_eq!(native_class("/opt/app/bin/server", true), Interpreter);
        assert_eq!(native_class("/opt/app/bin/python-config", false), Native);
        assert_eq!(
            native_class("/lib/x86_64-linux-gnu/libc.so.6", false),
            Runtime
        );
        assert_eq!(native_class("/lib64/ld-linux-x86-64.so.2", false), Runtime);
        assert_eq!(
            native_class("/lib/x86_64-linux-gnu/libz.so.1.2.13", false),
            Native
        );
        assert_eq!(
            native_class("/x/lib-dynload/zlib.cpython-312-x86_64-linux-gnu.so", false),
            Native
        );
    }

    #[test]
    fn interpreter_and_start_fold_extension_leaves_stay() {
        let fr = [
            f(Interpreter, "_start", "/bin/python3"),
            f(Runtime, "__libc_start_main", "/lib/libc.so.6"),
            f(Interpreter, "Py_BytesMain", "/lib/libpython3.12.so"),
            f(
                Interpreter,
                "_PyEval_EvalFrameDefault",
                "/lib/libpython3.12.so",
            ),
            f(Python, "<module>", "/x/job.py"),
            f(Interpreter, "PyObject_Vectorcall", "/lib/libpython3.12.so"),
            f(Python, "pack", "/x/job.py"),
            f(Native, "zlib_compress", "/x/zlib.cpython-312.so"),
            f(
                Interpreter,
                "PyBytes_FromStringAndSize",
                "/lib/libpython3.12.so",
            ),
            f(Runtime, "malloc", "/lib/libc.so.6"),
        ];
        let (v, n) = python_view(&fr);
        assert_eq!(
            names(&fr, &v),
            ["<module>", "pack", "zlib_compress", "malloc"]
        );
        assert!(n.interpreter && n.start && n.launcher.is_none());
    }

    #[test]
    fn forked_worker_bootstrap_folds_into_the_root() {
        let mp = "/py/lib/python3.12/multiprocessing/process.py";
        let fr = [
            f(Python, "<module>", "/x/train.py"),
            f(
                Python,
                "Popen._launch",
                "/py/lib/python3.12/multiprocessing/popen_fork.py",
            ),
            f(
                Interpreter,
                "_PyEval_EvalFrameDefault",
                "/lib/libpython3.12.so",
            ),
            f(Python, "BaseProcess._bootstrap", mp),
            f(Interpreter, "PyObject_Call", "/lib/libpython3.12.so"),
            f(Python, "BaseProcess.run", mp),
            f(
                Python,
                "_worker_loop",
                "/venv/torch/utils/data/_utils/worker.py",
            ),
            f(Python, "augment", "/x/train.py"),
            f(Interpreter, "PyNumber_And", "/lib/libpython3.12.so"),
        ];
        let (v, n) = python_view(&fr);
        assert_eq!(names(&fr, &v), ["_worker_loop", "augment"]);
        assert_eq!(n.launcher, Some(Launcher::Multiprocessing));
    }

    #[test]
    fn a_run_method_of_the_program_stays() {
        let fr = [
            f(
                Python,
                "Thread._bootstrap",
                "/py/lib/python3.12/threading.py",
            ),
            f(
                Python,
                "Thread._bootstrap_inner",
                "/py/lib/python3.12/threading.py",
            ),
            f(Python, "Loader.run", "/x/train.py"),
        ];
        let (v, _) = python_view(&fr);
        assert_eq!(names(&fr, &v), ["Loader.run"]);
    }

    #[test]
    fn python_that_ran_unattributed_is_said() {
        let fr = [
            f(Interpreter, "_start", "/bin/python3"),
            f(
                Interpreter,
                "_PyEval_EvalFrameDefault",
                "/lib/libpython3.12.so",
            ),
            f(Native, "deflate", "/lib/libz.so.1"),
        ];
        let (v, _) = python_view(&fr);
        assert_eq!(names(&fr, &v), [NOT_SAMPLED, "deflate"]);
        // A marker from the merge already says it.
        let fr2 = [
            f(Interpreter, "_start", "/bin/python3"),
            f(Marker, "[python: not sampled]", ""),
            f(
                Interpreter,
                "_PyEval_EvalFrameDefault",
                "/lib/libpython3.12.so",
            ),
        ];
        let (v, _) = python_view(&fr2);
        assert_eq!(names(&fr2, &v), [NOT_SAMPLED]);
    }

    #[test]
    fn addresses_where_unwinding_lost_its_way_fold_into_the_unknown_marker() {
        let fr = [
            f(Python, "main", "train.py"),
            f(Python, "relu", "functional.py"),
            f(Marker, NATIVE_UNKNOWN, ""),
            f(Native, "", UNKNOWN_FILE),
            f(Native, "", UNKNOWN_FILE),
            f(Native, "at::native::relu", "/lib/libtorch_cpu.so"),
            f(Native, "", UNKNOWN_FILE),
        ];
        let (v, _) = python_view(&fr);
        assert_eq!(
            names(&fr, &v),
            [
                "main",
                "relu",
                NATIVE_UNKNOWN,
                "at::native::relu",
                "[[unknown]]"
            ]
        );
    }

    #[test]
    fn unnamed_library_code_is_one_frame() {
        let fr = [
            f(Python, "pack", "/x/job.py"),
            f(Native, "deflate", "libz.so.1"),
            f(Native, "", "libz.so.1"),
            f(Native, "", "libz.so.1"),
            f(Native, "adler32_z", "libz.so.1"),
            f(Native, "", "libz.so.1"),
        ];
        let (v, _) = python_view(&fr);
        assert_eq!(
            names(&fr, &v),
            ["pack", "deflate", "[libz.so.1]", "adler32_z", "[libz.so.1]"]
        );
    }

    #[test]
    fn native_threads_lose_only_their_start() {
        let fr = [
            f(Runtime, "clone3", "/lib/libc.so.6"),
            f(Runtime, "start_thread", "/lib/libc.so.6"),
            f(Native, "gomp_thread_start", "/lib/libgomp.so.1"),
            f(Runtime, "syscall", "/lib/libc.so.6"),
        ];
        let (v, n) = python_view(&fr);
        assert_eq!(names(&fr, &v), ["gomp_thread_start", "syscall"]);
        assert!(n.start && !n.interpreter);
        // Interpreter start-up or shutdown without Python code.
        let fr = [
            f(Interpreter, "_start", "/bin/python3"),
            f(Interpreter, "Py_FinalizeEx", "/lib/libpython3.12.so"),
            f(Interpreter, "finalize_modules", "/lib/libpython3.12.so"),
        ];
        let (v, _) = python_view(&fr);
        assert_eq!(names(&fr, &v), [INTERPRETER_ONLY]);
    }
}
