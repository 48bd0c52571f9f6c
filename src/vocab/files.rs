//! Names of files as the collectors and the analysis both judge them.

/// `libfoo.so`, `libfoo.so.1.2`, `_C.cpython-311-x86_64-linux-gnu.so`.
pub fn is_shared_object(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") || name.contains(".so.")
}
