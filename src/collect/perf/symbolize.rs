//! Symbolization of native frames when recording ends.
//!
//! Frames are (file, file offset) pairs, so the processes need not exist any
//! more: blazesym reads the ELF file (`Source::Elf` + `Input::FileOffset`),
//! once per file, with demangling. Frames it cannot name get no entry; the
//! analysis shows them as `[file+0xoffset]`.

use std::collections::BTreeMap;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

/// Names for `(frame id, offset)` lists grouped by file path. Returns
/// (frame id, name) for every frame that could be named.
pub fn symbolize(by_file: &BTreeMap<String, Vec<(u32, u64)>>) -> Vec<(u32, String)> {
    let symbolizer = Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .build();
    let mut out = Vec::new();
    for (path, frames) in by_file {
        if !path.starts_with('/') || frames.is_empty() {
            continue;
        }
        let mut elf = Elf::new(path.as_str());
        // DWARF would add names of static functions in binaries that keep
        // their debug info, at a large parsing cost for big libraries; the
        // ELF symbol tables name almost every hot function.
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let offsets: Vec<u64> = frames.iter().map(|f| f.1).collect();
        let Ok(syms) = symbolizer.symbolize(&src, Input::FileOffset(&offsets)) else {
            continue;
        };
        for ((id, _), sym) in frames.iter().zip(syms) {
            if let Symbolized::Sym(s) = sym {
                out.push((*id, s.name.into_owned()));
            }
        }
    }
    out.sort();
    out
}
