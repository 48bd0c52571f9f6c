//! Process roles: `main` (the job and the processes that drive GPU work),
//! `worker` (DataLoader-style input workers), `other`.
//!
//! Rules, in order:
//! 1. a process that held a GPU context is `main` (set by the GPU analysis);
//! 2. a process whose threads are named `pt_data_worker` (PyTorch ≥ 2.x names
//!    its DataLoader workers so) is a `worker`;
//! 3. a Python process started by Python's `multiprocessing` (spawn /
//!    forkserver command line) is a `worker`, except its helper processes
//!    (resource tracker, fork server itself) which are `other`;
//! 4. a Python process forked from a Python parent without exec (same
//!    command line as its parent) is a `worker` — older PyTorch versions and
//!    plain `multiprocessing.Pool`s leave workers named like their parent;
//! 5. the job itself and every other Python program (e.g. a script run by
//!    `sh -c`, or the ranks `torchrun` starts) are `main`;
//! 6. everything else (shells, compilers, `nvidia-smi` calls) is `other`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Process;
use crate::event::Pid;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Main,
    Worker,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Worker => "worker",
            Role::Other => "other",
        }
    }
    pub const ALL: [Role; 3] = [Role::Main, Role::Worker, Role::Other];
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Thread/process name PyTorch gives its DataLoader workers.
pub const TORCH_WORKER_NAME: &str = "pt_data_worker";

pub fn is_python(p: &Process) -> bool {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let looks = |s: &str| {
        let b = base(s);
        b.starts_with("python") || b.starts_with("pypy")
    };
    looks(&p.comm)
        || p.exe.as_deref().is_some_and(looks)
        || p.cmdline.first().is_some_and(|c| looks(c))
        || p.comm == TORCH_WORKER_NAME
}

fn multiprocessing_kind(p: &Process) -> Option<&'static str> {
    let cl = p.cmdline.join(" ");
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
    let snapshot: BTreeMap<Pid, (bool, Vec<String>, Pid)> = processes
        .iter()
        .map(|(pid, p)| (*pid, (is_python(p), p.cmdline.clone(), p.ppid)))
        .collect();
    for p in processes.values_mut() {
        p.role = role_of(p, job, gpu_users, &snapshot);
    }
}

pub fn assign(processes: &mut BTreeMap<Pid, Process>, job: Pid) {
    assign_with_gpu(processes, job, &BTreeSet::new());
}

fn role_of(
    p: &Process,
    job: Pid,
    gpu_users: &BTreeSet<Pid>,
    all: &BTreeMap<Pid, (bool, Vec<String>, Pid)>,
) -> Role {
    if gpu_users.contains(&p.pid) {
        return Role::Main;
    }
    if p.comm == TORCH_WORKER_NAME || p.threads.values().any(|t| t.comm == TORCH_WORKER_NAME) {
        return Role::Worker;
    }
    if p.pid == job {
        return Role::Main;
    }
    let python = is_python(p);
    match multiprocessing_kind(p) {
        Some("helper") => return Role::Other,
        Some(_) if python => return Role::Worker,
        _ => {}
    }
    let parent = all.get(&p.ppid);
    if python {
        if let Some((parent_py, parent_cmd, _)) = parent {
            if *parent_py && !p.cmdline.is_empty() && *parent_cmd == p.cmdline {
                return Role::Worker;
            }
        }
        // A Python program of its own (the script under `sh -c`, a rank
        // started by `torchrun`): it drives the work.
        return Role::Main;
    }
    Role::Other
}
