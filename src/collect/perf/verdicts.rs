//! What the in-process agent said about each process: written by the perf
//! reader, read by the py-spy sampler (`collect::python`), which is why it
//! is a file of its own below both.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::event::Pid;

/// Which processes the in-process agent samples, from its hello records:
/// the perf reader writes, the py-spy sampler reads (it leaves those
/// processes to the agent, see `collect::python`).
#[derive(Debug)]
pub struct AgentVerdicts {
    said: std::sync::Mutex<HashMap<Pid, bool>>,
    /// Loop processes whose blocked loop thread the wall-clock sampler
    /// reads, Python frames included, with the agent's layout.
    walled: std::sync::Mutex<std::collections::HashSet<Pid>>,
    /// The agent's file, as the job's processes map it.
    file: PathBuf,
}

impl AgentVerdicts {
    pub fn new(file: PathBuf) -> AgentVerdicts {
        AgentVerdicts {
            said: Default::default(),
            walled: Default::default(),
            file,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Pid, bool>> {
        self.said.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the agent is loaded in `pid`: then it will say whether it
    /// samples it (at once when it cannot, else at its first sample).
    pub fn loaded_in(&self, pid: Pid) -> bool {
        let Some(name) = self.file.to_str() else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{}/maps", pid.0))
            .is_ok_and(|m| m.lines().any(|l| l.ends_with(name)))
    }

    /// Whether `pid`'s environment preloads the agent: right after an
    /// exec the dynamic loader has not mapped it yet ([`loaded_in`] says
    /// no), and perf's news of the exec brings the py-spy sampler to look
    /// at just that moment.
    ///
    /// [`loaded_in`]: AgentVerdicts::loaded_in
    pub fn preloaded_in(&self, pid: Pid) -> bool {
        let Some(name) = self.file.to_str() else {
            return false;
        };
        std::fs::read(format!("/proc/{}/environ", pid.0)).is_ok_and(|env| {
            env.split(|&b| b == 0)
                .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
                .any(|v| {
                    v.split(|&b| b == b' ' || b == b':')
                        .any(|lib| lib == name.as_bytes())
                })
        })
    }

    /// The agent said whether it samples `pid`.
    pub fn set(&self, pid: Pid, sampling: bool) {
        self.map().insert(pid, sampling);
    }

    /// `pid` exited or exec'd: whatever the agent said is void.
    pub fn forget(&self, pid: Pid) {
        self.map().remove(&pid);
    }

    /// Some(true): the agent samples `pid`; Some(false): it said it does
    /// not; None: it has said nothing (yet).
    pub fn get(&self, pid: Pid) -> Option<bool> {
        self.map().get(&pid).copied()
    }

    /// The wall-clock sampler reads (or no longer reads) `pid`'s loop
    /// thread, Python frames included, with the agent's layout: a rank's
    /// waits in collectives then come from its looks, and py-spy leaves the
    /// rank's main process to the agent (`collect::python`).
    pub fn set_walled(&self, pid: Pid, walled: bool) {
        let mut w = self.walled.lock().unwrap_or_else(|e| e.into_inner());
        if walled {
            w.insert(pid);
        } else {
            w.remove(&pid);
        }
    }

    /// Whether the wall-clock sampler reads `pid`'s loop thread with the
    /// agent's layout.
    pub fn walled(&self, pid: Pid) -> bool {
        self.walled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pid)
    }
}
