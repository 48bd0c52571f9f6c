//! `gpuprof doctor`: which stack sampler a recording here would use, and
//! what each privilege it lacks would add (issue 33). The common settings:
//! root or `perf_event_paranoid` ≤ 2 (perf events), Ubuntu's default 4 and
//! Docker's or Kubernetes' default profiles (perf events refused: the
//! in-process timer sampler), CAP_SYS_PTRACE dropped (no `attach`).

use super::{check, with_fix, Check, Status};
use crate::collect::perf;

/// Capability bits of `/proc/self/status` `CapEff`.
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;

/// What this process may do, as far as sampling goes.
struct Setting {
    caps: u64,
    /// A seccomp filter is active (`Seccomp: 2`).
    seccomp: bool,
    container: Option<&'static str>,
    paranoid: Option<i32>,
}

impl Setting {
    fn read() -> Setting {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        let caps = field("CapEff:")
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
            .unwrap_or(0);
        let seccomp = field("Seccomp:").is_some_and(|v| v == "2");
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let container = if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            || cgroup.contains("kubepods")
        {
            Some("a Kubernetes pod")
        } else if std::path::Path::new("/.dockerenv").exists() || cgroup.contains("docker") {
            Some("a Docker container")
        } else if std::path::Path::new("/run/.containerenv").exists() || cgroup.contains("libpod") {
            Some("a Podman container")
        } else {
            None
        };
        Setting {
            caps,
            seccomp,
            container,
            paranoid: perf::perf_event_paranoid(),
        }
    }

    fn has(&self, cap: u32) -> bool {
        self.caps & (1 << cap) != 0
    }

    /// "paranoid 2, CAP_PERFMON, seccomp filter, in a Docker container".
    fn describe(&self) -> String {
        let mut v = vec![format!(
            "perf_event_paranoid = {}",
            self.paranoid.map_or("unknown".into(), |p| p.to_string())
        )];
        for (bit, name) in [
            (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
            (CAP_PERFMON, "CAP_PERFMON"),
            (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        ] {
            if self.has(bit) {
                v.push(name.to_string());
            }
        }
        if self.seccomp {
            v.push("a seccomp filter".into());
        }
        if let Some(c) = self.container {
            v.push(format!("in {c}"));
        }
        v.join(", ")
    }
}

/// Whether a per-thread CPU-time timer can be made here (what the
/// in-process timer sampler makes in every thread of the job).
fn timers_allowed() -> Result<(), std::io::Error> {
    let mut id: libc::timer_t = std::ptr::null_mut();
    let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
    sev.sigev_notify = libc::SIGEV_NONE;
    // SAFETY: valid pointers to a sigevent and a timer id for the call.
    let rc = unsafe { libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut id) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: id was just created.
    unsafe { libc::timer_delete(id) };
    Ok(())
}

/// The `stacks` checks: the sampler a recording would use, and why.
pub(super) fn stack_checks(out: &mut Vec<Check>) {
    let s = Setting::read();
    let tick_hz = crate::collect::stacks::timer_frequency(perf::MAX_FREQUENCY);
    match perf::self_sampling_refusal() {
        None => out.push(check(
            "stacks",
            Status::Ok,
            format!(
                "perf events allowed ({}): native stacks of every process of the job from its first instruction, with the Python frames of the same instant (--sampler auto uses perf events)",
                s.describe()
            ),
        )),
        Some(e) => {
            let what = match timers_allowed() {
                Ok(()) => format!(
                    "perf_event_open is refused ({e}; {}): recordings use the in-process timer sampler — every thread of the processes that load gpuprof's agent samples itself on its CPU-time clock (native stacks and the Python frames of the same instant, no privilege needed, at most {tick_hz} Hz here)",
                    s.describe()
                ),
                Err(te) => format!(
                    "perf_event_open is refused ({e}) and per-thread CPU-time timers too ({te}; {}): recordings have no native stacks, only py-spy's Python stacks",
                    s.describe()
                ),
            };
            let mut fix = String::from(
                "what each privilege would add: CAP_PERFMON (or CAP_SYS_ADMIN; outside a container `sudo sysctl kernel.perf_event_paranoid=2` is enough; in a container the seccomp profile must also allow perf_event_open, e.g. `docker run --cap-add PERFMON`, or a pod's securityContext.capabilities.add: [PERFMON]) gives perf events: processes that do not load the agent (static programs, launchers that clear LD_PRELOAD) sampled too, every process from its first instruction, up to 1000 Hz, no kernel time counted at the system call that spent it, and native stacks under `gpuprof attach`",
            );
            if !s.has(CAP_SYS_PTRACE) {
                fix.push_str("; CAP_SYS_PTRACE (`docker run --cap-add SYS_PTRACE`; Kubernetes drops it) lets `gpuprof attach` read the Python stacks of processes it did not start");
            }
            let status = if what.contains("in-process timer sampler") {
                Status::Warning
            } else {
                Status::Problem
            };
            out.push(with_fix(check("stacks", status, what), fix));
        }
    }
}
