//! Process roles and ranks.
//!
//! Roles: `main` (the job and the processes that drive GPU work), `worker`
//! (DataLoader-style input workers), `launcher` (torchrun's agent, `mpirun`,
//! a wrapper script: processes that start the ranks), `other`.
//!
//! Ranks come from each process's own environment (the launcher's
//! variables, [`crate::event::RANK_ENV_KEYS`]): `RANK`, then
//! `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `PMIX_RANK`, then `SLURM_PROCID`.
//! A process whose descendants carry a different rank than its own (or
//! carry one while it has none) is a launcher: torchrun's agent has no
//! `RANK`, and under `srun … torchrun` its `SLURM_PROCID` numbers the node,
//! not a rank. A process whose environment could not be read belongs to
//! the rank of its nearest ancestor that has one.
//!
//! Role rules, in order:
//! 1. a process that held a GPU context is `main` (set by the GPU analysis);
//! 2. a launcher (above) is `launcher`;
//! 3. a process whose threads are named `pt_data_worker` (PyTorch ≥ 2.x names
//!    its DataLoader workers so) is a `worker`;
//!    torch.compile's compile workers (Inductor's sidecar,
//!    `torch/_inductor/compile_worker/__main__.py`, and the workers it
//!    forks with its command line, one per core up to 32) are `other`
//!    after that: they compile kernels, and as `worker`s they would pass
//!    for an input pipeline that keeps up;
//! 4. a Python process started by Python's `multiprocessing` (spawn /
//!    forkserver command line) is a `worker`, except its helper processes
//!    (resource tracker, fork server itself) which are `other`;
//! 5. a Python process forked from a Python parent without exec (same
//!    command line as its parent) is a `worker` — older PyTorch versions and
//!    plain `multiprocessing.Pool`s leave workers named like their parent;
//! 6. a Python interpreter that a Python process of the job started with
//!    inline code (`python -c CODE`: a probe, such as those Inductor and
//!    Triton run to check the compiler and the CPU) is `other`;
//! 7. the job itself and every other Python program (e.g. a script run by
//!    `sh -c`, or the ranks `torchrun` starts) are `main`;
//! 8. everything else (shells, compilers, `nvidia-smi` calls) is `other`.
//!
//! A main process with a rank is shown as "rank N", a worker as "worker of
//! rank N" ([`Process::label`](super::Process::label)).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Process;
use crate::event::Pid;
use crate::vocab::ranks::RankIds;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Main,
    Worker,
    Launcher,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Worker => "worker",
            Role::Launcher => "launcher",
            Role::Other => "other",
        }
    }
    /// Plural for counts ("2 workers", "1 launcher", "3 other").
    pub fn plural(self, n: usize) -> String {
        match (self, n) {
            (Role::Other, _) => format!("{n} other"),
            (r, 1) => format!("1 {}", r.as_str()),
            (Role::Main, n) => format!("{n} main"),
            (r, n) => format!("{n} {}s", r.as_str()),
        }
    }
    pub const ALL: [Role; 4] = [Role::Main, Role::Worker, Role::Launcher, Role::Other];
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Thread/process name PyTorch gives its DataLoader workers.
pub const TORCH_WORKER_NAME: &str = "pt_data_worker";

/// What the role rules look at in one process: the same rules classify the
/// recording's processes (below) and the live figures while recording
/// (`crate::live`).
#[derive(Clone, Copy, Debug)]
pub struct RoleFacts<'a> {
    pub pid: Pid,
    pub ppid: Pid,
    pub comm: &'a str,
    pub exe: Option<&'a str>,
    pub cmdline: &'a [String],
    /// A thread of the process is named like a DataLoader worker.
    pub worker_thread: bool,
}

impl<'a> RoleFacts<'a> {
    pub fn of(p: &'a Process) -> RoleFacts<'a> {
        RoleFacts {
            pid: p.pid,
            ppid: p.ppid,
            comm: &p.comm,
            exe: p.exe.as_deref(),
            cmdline: &p.cmdline,
            worker_thread: p.threads.values().any(|t| t.comm == TORCH_WORKER_NAME),
        }
    }

    pub fn is_python(&self) -> bool {
        let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
        let looks = |s: &str| {
            let b = base(s);
            b.starts_with("python") || b.starts_with("pypy")
        };
        looks(self.comm)
            || self.exe.is_some_and(looks)
            || self.cmdline.first().is_some_and(|c| looks(c))
            || self.comm == TORCH_WORKER_NAME
    }
}

pub fn is_python(p: &Process) -> bool {
    RoleFacts::of(p).is_python()
}

/// Inductor's compile-worker sidecar or one of the workers it forks (they
/// keep its command line).
fn is_compile_worker(cmdline: &[String]) -> bool {
    cmdline.iter().take(3).any(|a| {
        a.contains("/torch/_inductor/compile_worker/") || a == "torch._inductor.compile_worker"
    })
}

/// A Python interpreter given its program inline (`python -c CODE`,
/// after any options of the interpreter's own).
fn runs_inline_code(cmdline: &[String]) -> bool {
    let mut args = cmdline.iter().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-c" => return true,
            // Options that take the next argument.
            "-W" | "-X" => {
                args.next();
            }
            _ if a.starts_with('-') && !a.starts_with("--") && a.len() > 1 => {
                // Single-letter flags, possibly joined (`-uc CODE`).
                if a.ends_with('c') && a[1..].chars().all(|c| c.is_ascii_alphabetic()) {
                    return true;
                }
            }
            _ => return false,
        }
    }
    false
}

fn multiprocessing_kind(cmdline: &[String]) -> Option<&'static str> {
    let cl = cmdline.join(" ");
    if !cl.contains("multiprocessing") {
        return None;
    }
    if cl.contains("resource_tracker")
        || cl.contains("forkserver import main")
        || cl.contains("semaphore_tracker")
    {
        Some("helper")
    } else {
        Some("child")
    }
}

/// Assign roles to every process. `gpu_users` are PIDs that held a GPU
/// context (rule 1); pass an empty set when no GPU data exists.
pub fn assign_with_gpu(
    processes: &mut BTreeMap<Pid, Process>,
    job: Pid,
    gpu_users: &BTreeSet<Pid>,
) {
    let launchers = assign_ranks(processes, gpu_users);
    let snapshot: BTreeMap<Pid, (bool, Vec<String>)> = processes
        .iter()
        .map(|(pid, p)| (*pid, (is_python(p), p.cmdline.clone())))
        .collect();
    for p in processes.values_mut() {
        p.role = if launchers.contains(&p.pid) && !gpu_users.contains(&p.pid) {
            Role::Launcher
        } else {
            let parent = snapshot.get(&p.ppid).map(|(py, cmd)| (*py, cmd.as_slice()));
            classify(&RoleFacts::of(p), job, gpu_users.contains(&p.pid), parent)
        };
    }
}

/// Set every process's rank (see the module documentation); returns the
/// launchers.
fn assign_ranks(
    processes: &mut BTreeMap<Pid, Process>,
    gpu_users: &BTreeSet<Pid>,
) -> BTreeSet<Pid> {
    let own: BTreeMap<Pid, Option<RankIds>> = processes
        .iter()
        .map(|(pid, p)| (*pid, p.rank_env.as_ref().map(RankIds::from_env)))
        .collect();
    // An ancestor whose environment was read and holds another rank (or
    // none); unknown environments decide nothing.
    let differs =
        |pid: &Pid, r: u32| matches!(own.get(pid), Some(Some(ids)) if ids.rank != Some(r));
    // Walk up from every process with a rank of its own: each ancestor with
    // a different rank (or none) started ranks, so it is a launcher.
    let mut launchers = BTreeSet::new();
    for (pid, ids) in &own {
        let Some(r) = ids.and_then(|i| i.rank) else {
            continue;
        };
        let mut cur = processes[pid].ppid;
        for _ in 0..64 {
            let Some(parent) = processes.get(&cur) else {
                break;
            };
            if differs(&cur, r) && !gpu_users.contains(&cur) {
                launchers.insert(cur);
            }
            cur = parent.ppid;
        }
    }
    // Ranks: a process's own, else its nearest ancestor's (not across a
    // launcher). A process that only carries its launcher's own variable
    // (a helper of `srun … torchrun`'s agent, with the node's
    // SLURM_PROCID) is no rank.
    let mut ids_of: BTreeMap<Pid, RankIds> = BTreeMap::new();
    for pid in processes.keys() {
        let mut cur = *pid;
        let mut found = RankIds::default();
        for _ in 0..64 {
            if launchers.contains(&cur) {
                break;
            }
            if let Some(Some(ids)) = own.get(&cur) {
                found = *ids;
                break;
            }
            match processes.get(&cur) {
                Some(p) if p.ppid != cur => cur = p.ppid,
                _ => break,
            }
        }
        let mut up = processes.get(pid).map(|p| p.ppid);
        for _ in 0..64 {
            let Some(anc) = up else { break };
            if launchers.contains(&anc) {
                if let Some(Some(l)) = own.get(&anc) {
                    if l.rank.is_some()
                        && l.rank == found.rank
                        && l.rank_source == found.rank_source
                    {
                        found.rank = None;
                        found.rank_source = None;
                    }
                }
                break;
            }
            up = processes.get(&anc).map(|p| p.ppid).filter(|pp| *pp != anc);
        }
        ids_of.insert(*pid, found);
    }
    for (pid, p) in processes.iter_mut() {
        let ids = if launchers.contains(pid) {
            // A launcher is no rank; it keeps its node's index.
            RankIds {
                rank: None,
                rank_source: None,
                ..own.get(pid).copied().flatten().unwrap_or_default()
            }
        } else {
            ids_of.get(pid).copied().unwrap_or_default()
        };
        p.rank = ids.rank;
        p.rank_ids = ids;
    }
    launchers
}

pub fn assign(processes: &mut BTreeMap<Pid, Process>, job: Pid) {
    assign_with_gpu(processes, job, &BTreeSet::new());
}

/// The role of one process that is not a launcher. `gpu_user`: it held a
/// GPU context; `parent`: whether its parent is a Python process, and the
/// parent's command line, when the parent is known.
pub fn classify(
    p: &RoleFacts,
    job: Pid,
    gpu_user: bool,
    parent: Option<(bool, &[String])>,
) -> Role {
    if gpu_user {
        return Role::Main;
    }
    if p.comm == TORCH_WORKER_NAME || p.worker_thread {
        return Role::Worker;
    }
    if p.pid == job {
        return Role::Main;
    }
    if is_compile_worker(p.cmdline) {
        return Role::Other;
    }
    let python = p.is_python();
    match multiprocessing_kind(p.cmdline) {
        Some("helper") => return Role::Other,
        Some(_) if python => return Role::Worker,
        _ => {}
    }
    if python {
        if let Some((parent_py, parent_cmd)) = parent {
            if parent_py && !p.cmdline.is_empty() && parent_cmd == p.cmdline {
                return Role::Worker;
            }
            // Inline code that a Python program of the job runs in a child
            // interpreter is a probe or a helper: Inductor and Triton
            // check the C compiler and the CPU so while the loop compiles.
            if parent_py && runs_inline_code(p.cmdline) {
                return Role::Other;
            }
        }
        // A Python program of its own (the script under `sh -c`, a rank
        // started by `torchrun`): it drives the work.
        return Role::Main;
    }
    Role::Other
}
