//! System-wide figures: CPU (`/proc/stat`), block devices (`/proc/diskstats`),
//! pressure stall information (`/proc/pressure/*`), memory and swap.

use std::collections::{HashMap, HashSet};

use procfs::{Current, FromRead, FromReadSI};

use crate::collect::procfs::Kept;
use crate::event::{Coverage, CpuTimes, DiskCounters, Event, MonoNs, Psi};
use crate::record::Sink;

/// On machines with many CPUs the per-CPU breakdown is recorded every Nth
/// tick only: 128 CPUs × 8 counters at 10 Hz would alone exceed the
/// recording budget, and the diagnosis works from per-thread CPU anyway.
const PER_CPU_FULL_RATE_MAX: usize = 32;

/// Memory and swap figures change slowly and `/proc/vmstat` is long
/// (~170 lines): they are read once a second, not every tick.
const MEMORY_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

pub struct SystemCollector {
    sink: Sink,
    ns_per_tick: u64,
    block_devices: HashSet<String>,
    last_disk: HashMap<String, DiskCounters>,
    psi: bool,
    ticks: u64,
    last_memory: Option<std::time::Instant>,
    /// The files read every tick, kept open (see [`Kept`]).
    files: TickFiles,
    buf: Vec<u8>,
}

#[derive(Default)]
struct TickFiles {
    stat: Kept,
    diskstats: Kept,
    psi: [Kept; 3],
}

impl TickFiles {
    fn stat(&mut self, buf: &mut Vec<u8>) -> Option<procfs::KernelStats> {
        self.stat.read(|| "/proc/stat".into(), buf).ok()?;
        procfs::KernelStats::from_read(&buf[..], procfs::current_system_info()).ok()
    }

    fn diskstats(&mut self, buf: &mut Vec<u8>) -> Option<procfs::DiskStats> {
        self.diskstats
            .read_all(|| "/proc/diskstats".into(), buf)
            .ok()?;
        procfs::DiskStats::from_read(&buf[..]).ok()
    }

    /// `/proc/pressure/{cpu,io,memory}` (index 0, 1, 2).
    fn pressure<T: FromRead>(&mut self, i: usize, buf: &mut Vec<u8>) -> Option<T> {
        let name = ["cpu", "io", "memory"][i];
        self.psi[i]
            .read(|| format!("/proc/pressure/{name}"), buf)
            .ok()?;
        T::from_read(&buf[..]).ok()
    }
}

impl SystemCollector {
    pub fn new(sink: Sink) -> SystemCollector {
        let tps = procfs::ticks_per_second().max(1);
        // Whole disks only: partitions would count the same IO twice.
        let block_devices = std::fs::read_dir("/sys/block")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with("ram"))
                    .collect()
            })
            .unwrap_or_default();
        let psi = std::path::Path::new("/proc/pressure/io").exists();
        sink.send_blocking(Event::Coverage(Coverage {
            source: "psi".into(),
            available: psi,
            detail: if psi {
                "pressure stall information from /proc/pressure".into()
            } else {
                "this kernel has no /proc/pressure (needs Linux ≥ 4.20 with CONFIG_PSI=y, or boot with psi=1): CPU/IO/memory pressure not measured".into()
            },
        }));
        SystemCollector {
            sink,
            ns_per_tick: 1_000_000_000 / tps,
            block_devices,
            last_disk: HashMap::new(),
            psi,
            ticks: 0,
            last_memory: None,
            files: TickFiles::default(),
            buf: Vec::with_capacity(4096),
        }
    }

    pub fn tick(&mut self) {
        let now = MonoNs::now();
        self.ticks += 1;
        let buf = &mut self.buf;
        if let Some(ks) = self.files.stat(buf) {
            let conv = |c: &procfs::CpuTime| CpuTimes {
                user: c.user * self.ns_per_tick,
                nice: c.nice * self.ns_per_tick,
                system: c.system * self.ns_per_tick,
                idle: c.idle * self.ns_per_tick,
                iowait: c.iowait.unwrap_or(0) * self.ns_per_tick,
                irq: c.irq.unwrap_or(0) * self.ns_per_tick,
                softirq: c.softirq.unwrap_or(0) * self.ns_per_tick,
                steal: c.steal.unwrap_or(0) * self.ns_per_tick,
            };
            let per_cpu = if ks.cpu_time.len() <= PER_CPU_FULL_RATE_MAX || self.ticks % 10 == 1 {
                ks.cpu_time.iter().map(conv).collect()
            } else {
                Vec::new()
            };
            self.sink.send(Event::SystemCpu {
                t: now,
                total: conv(&ks.total),
                per_cpu,
                procs_running: ks.procs_running.unwrap_or(0),
                procs_blocked: ks.procs_blocked.unwrap_or(0),
            });
        }
        if let Some(ds) = self.files.diskstats(buf) {
            let mut changed = Vec::new();
            for d in ds.0 {
                if !self.block_devices.contains(&d.name) {
                    continue;
                }
                let c = DiskCounters {
                    name: d.name.clone(),
                    reads: d.reads,
                    read_bytes: d.sectors_read * 512,
                    writes: d.writes,
                    write_bytes: d.sectors_written * 512,
                    io_ms: d.time_in_progress,
                };
                if self.last_disk.get(&d.name) != Some(&c) {
                    self.last_disk.insert(d.name, c.clone());
                    changed.push(c);
                }
            }
            if !changed.is_empty() {
                self.sink.send(Event::Disks {
                    t: now,
                    disks: changed,
                });
            }
        }
        if self.psi {
            let rec = |some: &procfs::PressureRecord, full: Option<&procfs::PressureRecord>| Psi {
                some_us: some.total,
                full_us: full.map(|f| f.total),
            };
            let cpu = (self.files)
                .pressure::<procfs::CpuPressure>(0, buf)
                .map(|p| rec(&p.some, Some(&p.full)));
            let io = (self.files)
                .pressure::<procfs::IoPressure>(1, buf)
                .map(|p| rec(&p.some, Some(&p.full)));
            let memory = (self.files)
                .pressure::<procfs::MemoryPressure>(2, buf)
                .map(|p| rec(&p.some, Some(&p.full)));
            self.sink.send(Event::Pressure {
                t: now,
                cpu,
                io,
                memory,
            });
        }
        if self
            .last_memory
            .is_some_and(|t| t.elapsed() < MEMORY_PERIOD)
        {
            return;
        }
        self.last_memory = Some(std::time::Instant::now());
        if let Ok(mi) = procfs::Meminfo::current() {
            let (pswpin, pswpout) = procfs::vmstat()
                .map(|v| {
                    (
                        v.get("pswpin").copied().unwrap_or(0) as u64,
                        v.get("pswpout").copied().unwrap_or(0) as u64,
                    )
                })
                .unwrap_or((0, 0));
            self.sink.send(Event::Memory {
                t: now,
                total_bytes: mi.mem_total,
                available_bytes: mi.mem_available.unwrap_or(mi.mem_free),
                swap_total_bytes: mi.swap_total,
                swap_free_bytes: mi.swap_free,
                pswpin,
                pswpout,
            });
        }
    }
}
