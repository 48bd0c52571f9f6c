//! Online DWARF unwinding with framehop.
//!
//! Each process of the job has its own unwinder built from its MMAP2
//! records; a forked child starts from a copy of its parent's, and `exec`
//! starts it afresh. Unwind sections come from files mapped once and shared
//! by every process (`memmap2` + `Arc`), so a thousand workers mapping
//! libpython cost one mapping. Only addresses leave this module, translated
//! to (file, file offset) right away so that symbolization works after the
//! processes are gone.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Deref, Range};
use std::sync::Arc;

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module,
    UnwindRegsNative, Unwinder, UnwinderNative,
};
use object::{Object, ObjectSection, ObjectSegment};

use super::perfmap::{JitEntry, SharedMap};
use super::sample::{Mmap2, Sample};
use crate::event::{MonoNs, Pid};

/// Deepest stack kept; deeper ones are cut (and count as truncated).
pub const MAX_FRAMES: usize = 256;

/// Bytes of a mapped file, shared.
#[derive(Clone)]
pub struct Section {
    map: Arc<memmap2::Mmap>,
    range: Range<usize>,
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// What one ELF file offers the unwinder.
struct ElfInfo {
    map: Arc<memmap2::Mmap>,
    text: Option<(Range<u64>, Range<usize>)>,
    eh_frame: Option<(Range<u64>, Range<usize>)>,
    eh_frame_hdr: Option<(Range<u64>, Range<usize>)>,
    debug_frame: Option<Range<usize>>,
    got: Option<Range<u64>>,
    /// PT_LOAD segments: (file offset, vaddr, file size).
    loads: Vec<(u64, u64, u64)>,
}

impl ElfInfo {
    fn load(path: &str) -> Option<ElfInfo> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: the file is mapped read-only; a library rewritten in place
        // while the job runs would change the bytes under us, which the
        // unwinder treats as ordinary (possibly wrong) unwind data.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*map).ok()?;
        let sec = |name: &str| -> Option<(Range<u64>, Range<usize>)> {
            let s = elf.section_by_name(name)?;
            let (off, size) = s.file_range()?;
            let fr = off as usize..(off + size) as usize;
            if fr.end > map.len() {
                return None;
            }
            Some((s.address()..s.address() + s.size(), fr))
        };
        let text = sec(".text");
        let eh_frame = sec(".eh_frame");
        let eh_frame_hdr = sec(".eh_frame_hdr");
        let debug_frame = sec(".debug_frame").map(|(_, r)| r);
        let got = elf
            .section_by_name(".got")
            .map(|s| s.address()..s.address() + s.size());
        let loads = elf
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, s.address(), size)
            })
            .collect();
        Some(ElfInfo {
            map: Arc::new(map),
            text,
            eh_frame,
            eh_frame_hdr,
            debug_frame,
            got,
            loads,
        })
    }

    fn section(&self, r: &Range<usize>) -> Section {
        Section {
            map: self.map.clone(),
            range: r.clone(),
        }
    }

    /// Where svma 0 of this file lies in a process that mapped file offset
    /// `pgoff` at `addr`.
    fn base_avma(&self, addr: u64, pgoff: u64) -> u64 {
        for &(off, vaddr, size) in &self.loads {
            if pgoff >= off & !0xfff && pgoff < off + size.max(1) {
                // p_vaddr ≡ p_offset (mod page size), so this is exact.
                return addr
                    .wrapping_sub(pgoff)
                    .wrapping_sub(vaddr.wrapping_sub(off));
            }
        }
        addr.wrapping_sub(pgoff)
    }

    fn module(&self, name: &str, avma: Range<u64>, base_avma: u64) -> Module<Section> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.as_ref().map(|t| t.0.clone()),
            text: self.text.as_ref().map(|t| self.section(&t.1)),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|t| t.0.clone()),
            eh_frame: self.eh_frame.as_ref().map(|t| self.section(&t.1)),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|t| t.0.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|t| self.section(&t.1)),
            debug_frame: self.debug_frame.as_ref().map(|r| self.section(r)),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
        };
        Module::new(name.to_string(), avma, base_avma, info)
    }
}

/// A file known to the sampler. `id` is its `StackFile` id.
struct FileEntry {
    id: u32,
    elf: Option<Arc<ElfInfo>>,
}

/// Files by path, each opened once.
#[derive(Default)]
pub struct Files {
    by_path: HashMap<String, FileEntry>,
    /// Newly seen files, for the caller to announce (id, path).
    pub new: Vec<(u32, String)>,
}

impl Files {
    fn get(&mut self, path: &str) -> &FileEntry {
        self.get_as(path, true)
    }

    fn get_as(&mut self, path: &str, elf: bool) -> &FileEntry {
        if !self.by_path.contains_key(path) {
            let id = self.by_path.len() as u32;
            let elf = if elf && path.starts_with('/') {
                ElfInfo::load(path).map(Arc::new)
            } else {
                None
            };
            self.new.push((id, path.to_string()));
            self.by_path.insert(path.to_string(), FileEntry { id, elf });
        }
        &self.by_path[path]
    }

    /// Id of a pseudo file (`[unknown]`: addresses outside every mapping).
    pub fn id_of(&mut self, path: &str) -> u32 {
        self.get(path).id
    }

    /// Id of a file that is not an ELF file (a perf map): never parsed.
    pub fn id_of_text(&mut self, path: &str) -> u32 {
        self.get_as(path, false).id
    }
}

#[derive(Clone)]
struct Mapping {
    end: u64,
    pgoff: u64,
    file: u32,
    /// Anonymous memory (JIT code such as CPython's perf trampolines).
    anon: bool,
}

/// One process's address space, as far as code is concerned.
#[derive(Clone, Default)]
pub struct ProcessMaps {
    unwinder: UnwinderNative<Section, MayAllocateDuringUnwind>,
    maps: BTreeMap<u64, Mapping>,
    /// Seeded from /proc/PID/maps (the job's first process, whose exec
    /// mappings may predate the events).
    pub seeded: bool,
    /// Perf maps naming this process's JIT code: its own first, then those
    /// of the ancestors it was forked from (it runs their code too).
    pub jit: Vec<SharedMap>,
    /// Changes with every mapping added; 0 while there is none.
    version: u64,
}

/// Versions of [`ProcessMaps`], unique across all of them.
static MAPS_VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProcessMaps {
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Equal versions mean the same code mappings (a copy made at a fork
    /// keeps its parent's until either changes).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Add an executable mapping, replacing any it overlaps.
    pub fn add(&mut self, files: &mut Files, m: &Mmap2) {
        const PROT_EXEC: u32 = 4;
        if m.prot & PROT_EXEC == 0 || m.len == 0 {
            return;
        }
        self.version = MAPS_VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = m.addr;
        let end = m.addr.saturating_add(m.len);
        let overlapping: Vec<u64> = self
            .maps
            .range(..end)
            .filter(|(s, mp)| mp.end > start && **s < end)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            self.maps.remove(&s);
            self.unwinder.remove_module(s);
        }
        let path = if m.path.is_empty() {
            "[anon]"
        } else {
            m.path.as_str()
        };
        let anon = path.starts_with("//anon") || path.starts_with("[anon");
        let entry = files.get(path);
        let file = entry.id;
        if let Some(elf) = &entry.elf {
            let base = elf.base_avma(m.addr, m.pgoff);
            self.unwinder.add_module(elf.module(path, start..end, base));
        }
        self.maps.insert(
            start,
            Mapping {
                end,
                pgoff: m.pgoff,
                file,
                anon,
            },
        );
    }

    /// (file id, file offset) of an address, if it is in a known mapping.
    pub fn locate(&self, addr: u64) -> Option<(u32, u64)> {
        let (start, m) = self.maps.range(..=addr).next_back()?;
        (addr < m.end).then(|| (m.file, addr - start + m.pgoff))
    }

    /// Whether `addr` may be JIT code: in anonymous memory or in no known
    /// mapping.
    fn maybe_jit(&self, addr: u64) -> bool {
        match self.maps.range(..=addr).next_back() {
            Some((_, m)) if addr < m.end => m.anon,
            _ => true,
        }
    }

    /// The perf-map entry naming JIT code at `addr` (own map first, then the
    /// ancestors'), reading what the maps gained when none names it yet.
    /// `gen` identifies the sample: each map is read at most once per sample.
    fn jit_entry(&self, addr: u64, gen: u64, now: MonoNs) -> Option<(usize, JitEntry)> {
        if self.jit.is_empty() || !self.maybe_jit(addr) {
            return None;
        }
        let find = || {
            self.jit
                .iter()
                .enumerate()
                .find_map(|(i, m)| m.borrow().lookup(addr).map(|e| (i, e)))
        };
        if let Some(hit) = find() {
            return Some(hit);
        }
        let mut grew = false;
        for m in &self.jit {
            grew |= m.borrow_mut().refresh(gen, now);
        }
        if grew {
            find()
        } else {
            None
        }
    }
}

/// Read `/proc/PID/maps` into MMAP2-like records (for a process whose
/// mappings were made before sampling started).
pub fn proc_maps(pid: Pid) -> Vec<Mmap2> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", pid.0)) else {
        return Vec::new();
    };
    parse_proc_maps(pid, &text)
}

pub fn parse_proc_maps(pid: Pid, text: &str) -> Vec<Mmap2> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(off)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let (_dev, _ino) = (it.next(), it.next());
        let path = it.collect::<Vec<_>>().join(" ");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b), Ok(off)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        if !perms.contains('x') || b <= a {
            continue;
        }
        out.push(Mmap2 {
            pid,
            tid: crate::event::Tid(pid.0),
            t: Default::default(),
            addr: a,
            len: b - a,
            pgoff: off,
            prot: 4,
            path,
        });
    }
    out
}

/// The unwinding result of one sample: (file, offset) frames from the leaf
/// outwards, and whether the unwinder found the thread's root.
pub struct Unwound {
    pub frames: Vec<(u32, u64)>,
    pub complete: bool,
    /// Frames in JIT code named by a perf map: (index in `frames`, map path,
    /// entry). Their frame is (the map's file, the address).
    pub jit: Vec<(usize, String, JitEntry)>,
    /// Every frame was in a known mapping of a file: no perf map (which
    /// changes over time) was looked at.
    pub plain: bool,
    /// The deepest end (offset from the stack pointer) of a stack word the
    /// unwinding wanted beyond the end of the copy: a longer copy would
    /// have let it go on.
    pub wanted_past_copy: Option<usize>,
}

/// Shared unwind rule cache.
pub struct UnwindCache(CacheNative<MayAllocateDuringUnwind>);

impl Default for UnwindCache {
    fn default() -> Self {
        UnwindCache(CacheNative::new())
    }
}

/// Unwind a sample's user stack. Addresses outside known mappings are
/// attributed to the pseudo file `unknown_file` at their absolute address.
/// Frames in JIT code that a perf map names are stepped through with the
/// CPython trampoline rule (x86-64) when the entry is a trampoline, and are
/// attributed to the map (`map_file` gives its file id). `gen` identifies
/// the sample (perf maps are read at most once per sample).
pub fn unwind(
    procmaps: &ProcessMaps,
    cache: &mut UnwindCache,
    s: &Sample,
    unknown_file: u32,
    gen: u64,
    map_file: &mut dyn FnMut(&str) -> u32,
) -> Option<Unwound> {
    unwind_noting(procmaps, cache, s, unknown_file, gen, map_file, None)
}

/// [`unwind`], pushing onto `reads` the offset from the stack pointer of
/// each stack word read (those read successfully: a read past the copy
/// fails).
pub fn unwind_noting(
    procmaps: &ProcessMaps,
    cache: &mut UnwindCache,
    s: &Sample,
    unknown_file: u32,
    gen: u64,
    map_file: &mut dyn FnMut(&str) -> u32,
    mut reads: Option<&mut Vec<u32>>,
) -> Option<Unwound> {
    let regs = s.regs?;
    #[cfg(target_arch = "x86_64")]
    let (pc, mut uregs) = {
        let [bp, sp, ip, _] = regs;
        (ip, UnwindRegsNative::new(ip, sp, bp))
    };
    #[cfg(target_arch = "aarch64")]
    let (pc, mut uregs) = {
        let [fp, lr, sp, pc] = regs;
        (pc, UnwindRegsNative::new(lr, sp, fp))
    };
    #[cfg(target_arch = "x86_64")]
    let sp = regs[1];
    #[cfg(target_arch = "aarch64")]
    let sp = regs[2];
    let stack = &s.stack;
    let mut wanted_past_copy = None;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = addr.checked_sub(sp).ok_or(())? as usize;
        let end = off.checked_add(8).ok_or(())?;
        if end > stack.len() {
            wanted_past_copy = Some(end);
            return Err(());
        }
        let b = &stack[off..end];
        let v = u64::from_le_bytes(b.try_into().map_err(|_| ())?);
        if let Some(r) = reads.as_deref_mut() {
            r.push(off as u32);
        }
        Ok(v)
    };
    let mut frames = Vec::with_capacity(32);
    let mut jit = Vec::new();
    let mut plain = true;
    let mut address = FrameAddress::InstructionPointer(pc);
    let complete = loop {
        let lookup = address.address_for_lookup();
        plain &= !procmaps.maybe_jit(lookup);
        let entry = procmaps.jit_entry(lookup, gen, s.t);
        match &entry {
            Some((i, e)) => {
                let path = procmaps.jit[*i].borrow().path.clone();
                let file = map_file(&path);
                jit.push((frames.len(), path, e.clone()));
                frames.push((file, lookup));
            }
            None => frames.push(procmaps.locate(lookup).unwrap_or((unknown_file, lookup))),
        }
        if frames.len() >= MAX_FRAMES {
            break false;
        }
        let next = match entry {
            Some((_, e)) if cfg!(target_arch = "x86_64") && e.is_python_trampoline() => {
                step_trampoline(&e, address, &mut uregs, &mut read_stack)
            }
            _ => procmaps
                .unwinder
                .unwind_frame(address, &mut uregs, &mut cache.0, &mut read_stack),
        };
        match next {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(a) => address = a,
                None => break false,
            },
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    Some(Unwound {
        frames,
        complete,
        jit,
        plain,
        wanted_past_copy,
    })
}

/// Step out of a CPython perf trampoline (see
/// [`super::perfmap::trampoline_ra_offset`]).
#[cfg(target_arch = "x86_64")]
fn step_trampoline(
    e: &JitEntry,
    address: FrameAddress,
    regs: &mut UnwindRegsNative,
    read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, framehop::Error> {
    let leaf = !address.is_return_address();
    let off = address.address_for_lookup().wrapping_sub(e.start);
    let k = super::perfmap::trampoline_ra_offset(off, e.size, leaf);
    let sp = regs.sp();
    let at = sp.checked_add(k).ok_or(framehop::Error::IntegerOverflow)?;
    let ra = read_stack(at).map_err(|_| framehop::Error::CouldNotReadStack(at))?;
    regs.set_sp(at + 8);
    Ok(Some(ra))
}

/// Not called: on aarch64 the trampoline keeps a frame record, which the
/// unwinder's frame-pointer fallback follows.
#[cfg(not(target_arch = "x86_64"))]
fn step_trampoline(
    _e: &JitEntry,
    _address: FrameAddress,
    _regs: &mut UnwindRegsNative,
    _read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, framehop::Error> {
    Err(framehop::Error::ReturnAddressIsNull)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_maps_keeps_executable_mappings() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /usr/bin/py thon
55d0c0a01000-55d0c0a05000 r-xp 00001000 08:01 123 /usr/bin/py thon
7ffd0e5f0000-7ffd0e5f2000 r-xp 00000000 00:00 0 [vdso]
garbage line
";
        let m = parse_proc_maps(Pid(7), text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].path, "/usr/bin/py thon");
        assert_eq!(m[0].pgoff, 0x1000);
        assert_eq!(m[1].path, "[vdso]");
    }

    #[test]
    fn locate_uses_file_offsets_and_replaces_overlaps() {
        let mut files = Files::default();
        let mut pm = ProcessMaps::default();
        let mk = |addr, len, pgoff, path: &str| Mmap2 {
            pid: Pid(1),
            tid: crate::event::Tid(1),
            t: Default::default(),
            addr,
            len,
            pgoff,
            prot: 5,
            path: path.into(),
        };
        pm.add(&mut files, &mk(0x1000, 0x2000, 0x5000, "[x]"));
        assert_eq!(pm.locate(0x1800), Some((0, 0x5800)));
        assert_eq!(pm.locate(0x3000), None);
        pm.add(&mut files, &mk(0x2000, 0x1000, 0, "[y]"));
        assert_eq!(pm.locate(0x1800), None, "the old mapping was replaced");
        assert_eq!(pm.locate(0x2800), Some((1, 0x800)));
    }

    /// A forked child names JIT code from its own map first, then from its
    /// parent's (the trampolines that were running at the fork); code in a
    /// file-backed mapping is never looked up.
    #[test]
    fn jit_code_is_named_from_own_then_parent_maps() {
        use super::super::perfmap::PerfMap;
        let dir = std::env::temp_dir();
        let write = |name: &str, text: &str| {
            let p = dir.join(format!("gpuprof-unwind-{}-{name}", std::process::id()));
            std::fs::write(&p, text).unwrap();
            p.to_string_lossy().into_owned()
        };
        let parent = write(
            "parent",
            "7000 b py::outer:/x/a.py\n700b b py::shadowed:/x/a.py\n",
        );
        let child = write("child", "700b b py::inner:/x/a.py\n");
        let mut files = Files::default();
        let mut pm = ProcessMaps::default();
        let mk = |addr, len, path: &str| Mmap2 {
            pid: Pid(1),
            tid: crate::event::Tid(1),
            t: Default::default(),
            addr,
            len,
            pgoff: 0,
            prot: 5,
            path: path.into(),
        };
        pm.add(&mut files, &mk(0x7000, 0x1000, "//anon"));
        pm.add(&mut files, &mk(0x9000, 0x1000, "[z]"));
        pm.jit.push(PerfMap::shared(child.clone(), None));
        pm.jit.push(PerfMap::shared(parent.clone(), None));
        let name = |addr| {
            pm.jit_entry(addr, 1, MonoNs(0))
                .map(|(i, e)| (i, e.name.to_string()))
        };
        assert_eq!(name(0x7005), Some((1, "py::outer:/x/a.py".into())));
        assert_eq!(name(0x700c), Some((0, "py::inner:/x/a.py".into())));
        assert_eq!(name(0x7100), None);
        assert_eq!(name(0x9005), None, "file-backed code is not JIT code");
        std::fs::remove_file(parent).unwrap();
        std::fs::remove_file(child).unwrap();
    }

    /// Out of a trampoline's call: the return address is at sp + 8 and the
    /// caller's stack pointer just above it; on the first instruction, at sp.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn stepping_out_of_a_trampoline() {
        let e = JitEntry {
            start: 0x7000,
            size: 11,
            name: "py::f:/x.py".into(),
        };
        let stack: Vec<u64> = vec![0xaaaa, 0x5555_1234, 0xbbbb];
        let mut read = |addr: u64| -> Result<u64, ()> {
            stack
                .get(addr.checked_sub(0x1000).ok_or(())? as usize / 8)
                .copied()
                .ok_or(())
        };
        let mut regs = UnwindRegsNative::new(0, 0x1000, 0x4242);
        let ra = FrameAddress::from_return_address(0x7006).unwrap();
        assert_eq!(
            step_trampoline(&e, ra, &mut regs, &mut read),
            Ok(Some(0x5555_1234))
        );
        assert_eq!((regs.sp(), regs.bp()), (0x1010, 0x4242));
        let mut regs = UnwindRegsNative::new(0x7000, 0x1000, 0x4242);
        let ip = FrameAddress::InstructionPointer(0x7000);
        assert_eq!(
            step_trampoline(&e, ip, &mut regs, &mut read),
            Ok(Some(0xaaaa))
        );
        assert_eq!(regs.sp(), 0x1008);
    }
}
