//! Builds the in-process agents (`src/agent/*.c`) into shared objects that
//! are embedded in the gpuprof binary (see `src/agent/mod.rs`).
//!
//! They are C because they run inside the job's processes (signal handlers,
//! preloaded into every process the job starts): no runtime of their own,
//! nothing that allocates or locks behind their back. The compiler is the
//! one the `cc` crate finds — the same `cc` that links every Rust program on
//! Linux — so building gpuprof needs nothing more than it did.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts"));
    let src = Path::new("src/agent");
    println!("cargo:rerun-if-changed={}", src.display());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(src)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "c"))
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    if let Ok(d) = std::fs::read_dir(src) {
        for e in d.flatten() {
            println!("cargo:rerun-if-changed={}", e.path().display());
        }
    }
    let mut table = String::from(
        "/// Agents built from `src/agent/*.c`: (name, shared object).\npub static EMBEDDED: &[(&str, &[u8])] = &[\n",
    );
    for c in &sources {
        let stem = c.file_stem().unwrap().to_string_lossy().into_owned();
        let so = out.join(format!("libgpuprof_{stem}.so"));
        let compiler = cc::Build::new()
            .opt_level(2)
            .pic(true)
            .warnings(true)
            .extra_warnings(true)
            .get_compiler();
        let mut cmd = compiler.to_command();
        cmd.args([
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            "-std=gnu11",
            "-fvisibility=hidden",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(src)
        .arg("-o")
        .arg(&so)
        .arg(c)
        .args(["-ldl", "-lpthread"]);
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler for {}: {e}", c.display()));
        assert!(status.success(), "compiling {} failed", c.display());
        writeln!(
            table,
            "    ({stem:?}, include_bytes!({:?})),",
            so.display().to_string()
        )
        .unwrap();
    }
    table.push_str("];\n");
    std::fs::write(out.join("agents.rs"), table).expect("write agents.rs");
}
