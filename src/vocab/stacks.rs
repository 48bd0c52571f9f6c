//! Stack vocabulary shared by the samplers that write stacks and the
//! analysis that reads them: marker frames, sampler names, the rule that
//! picks the agent's samples of a thread over perf's, and the files of
//! Python's import machinery.

/// `stacks.sampler` in report.json: which sampler took the native stacks.
pub const SAMPLER_PERF: &str = "perf-events";
pub const SAMPLER_TIMER: &str = "in-process-timer";

/// Wall-clock samples of a thread on a CPU (perf and the agent have its
/// stack) and of a blocked thread whose read raced its waking up.
pub const MARKER_ON_CPU: &str = "[on cpu]";
pub const MARKER_RACED: &str = "[blocked: woke while read, dropped]";

/// Markers of agent samples whose Python frames are missing or cut.
pub const MARKER_UNREADABLE: &str = "[python: unreadable]";
pub const MARKER_TRUNCATED: &str = "[python: truncated]";
/// A perf sample of a thread the agent was sampling at the time: not
/// unwound (the agent's sample of the same thread is used; if the analysis
/// falls back to perf's samples of the thread, the thread's nearest agent
/// sample stands in for it, and this shows only where there is none).
pub const MARKER_NOT_UNWOUND: &str = "[perf: not unwound, the agent sampled this thread]";

/// The agent's samples of a thread are used unless they are far fewer than
/// perf's. Both sample the thread's CPU time at the same rate, but with
/// timers of their own: on a loaded machine their counts differ by up to
/// ~10% (measured). Far fewer means the agent missed the thread (it blocked
/// SIGTRAP, or the agent's ring overflowed), and perf's samples are used.
pub fn agent_covers(agent: u64, perf: u64) -> bool {
    agent > 0 && 2 * agent + 5 >= perf
}

/// Least share of the Python processes' CPU time (sampled, and counted
/// unsampled) that ended unsampled in the kernel for the diagnosis and the
/// flame graphs to say what the stacks leave out.
pub const MIN_UNSAMPLED_KERNEL_SHARE: f64 = 0.05;

/// Least CPU time in the kernel not sampled that is said at all: the
/// figures are given to a tenth of a CPU-s, and "at least 0.0 CPU-s" says
/// nothing.
pub const MIN_UNSAMPLED_KERNEL_S: f64 = 0.05;

/// Is this the file of Python's import machinery (`<frozen
/// importlib._bootstrap>`, or its source when not frozen)? Every import —
/// an `import` statement, `importlib.import_module`, a C extension's
/// `PyImport_Import` — runs the module's body under its frames, and
/// nothing else does: a module body alone is no sign, since a launcher
/// (`runpy`, `exec` of a script, a notebook's cell) runs the program's own
/// module body under another.
pub fn is_import_file(file: &str) -> bool {
    let f = file.trim_start_matches("<frozen ").trim_end_matches('>');
    f == "importlib._bootstrap"
        || f == "importlib._bootstrap_external"
        || f.ends_with("importlib/_bootstrap.py")
        || f.ends_with("importlib/_bootstrap_external.py")
}

/// A Python frame whose presence on a stack means that the framework is
/// compiling the program rather than running it: torch.compile's frame
/// conversion (TorchDynamo's `convert_frame`, under which it traces,
/// runs AOTAutograd and the backend's compile of the forward graph) and
/// Inductor's `compile_fx` (where a graph is compiled, the backward graph
/// lazily at the first backward pass too). A compiled model's runs go
/// through neither: a guard hit calls the compiled code directly. A
/// module body (`<module>`) is the file being imported, not a compile.
pub fn is_compile_frame(name: &str, file: &str) -> bool {
    name != "<module>"
        && (file.ends_with("/torch/_dynamo/convert_frame.py")
            || file.ends_with("/torch/_inductor/compile_fx.py"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_files_are_torch_compiles_own() {
        let site = "/venv/lib/python3.11/site-packages";
        let conv = format!("{site}/torch/_dynamo/convert_frame.py");
        assert!(is_compile_frame("_compile", &conv));
        assert!(is_compile_frame(
            "compile_fx_inner",
            &format!("{site}/torch/_inductor/compile_fx.py")
        ));
        // Importing the compiler, running the compiled code, or a
        // program's own file of that name.
        assert!(!is_compile_frame("<module>", &conv));
        assert!(!is_compile_frame(
            "_fn",
            &format!("{site}/torch/_dynamo/eval_frame.py")
        ));
        assert!(!is_compile_frame(
            "call",
            &format!("{site}/torch/_inductor/output_code.py")
        ));
        assert!(!is_compile_frame(
            "_compile",
            "/home/u/proj/convert_frame.py"
        ));
    }

    #[test]
    fn import_machinery_files() {
        assert!(is_import_file("<frozen importlib._bootstrap>"));
        assert!(is_import_file("<frozen importlib._bootstrap_external>"));
        assert!(is_import_file("/usr/lib/python3.9/importlib/_bootstrap.py"));
        assert!(!is_import_file("/usr/lib/python3.11/importlib/__init__.py"));
        assert!(!is_import_file("torch/__init__.py"));
        assert!(!is_import_file("my_bootstrap.py"));
        assert!(!is_import_file("<frozen runpy>"));
    }
}
