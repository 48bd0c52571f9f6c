//! Rank ids of a process, read from its launcher's environment variables
//! by the Python collector and by the process-tree analysis.

use serde::Serialize;

use crate::event::RankEnv;

/// Which rank, node and world a process belongs to, from its launcher's
/// environment variables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankIds {
    /// Global rank (`RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `PMIX_RANK`,
    /// `SLURM_PROCID`, in that order).
    pub rank: Option<u32>,
    /// Rank on its node (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
    /// `SLURM_LOCALID`).
    pub local_rank: Option<u32>,
    /// Ranks in all (`WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`,
    /// `SLURM_NTASKS`).
    pub world_size: Option<u32>,
    /// The node's index (`GROUP_RANK`, `NODE_RANK`, `SLURM_NODEID`).
    pub node_rank: Option<u32>,
    /// torchrun's restart count (`TORCHELASTIC_RESTART_COUNT`).
    pub restart: Option<u32>,
    /// The variable the rank was read from.
    pub rank_source: Option<&'static str>,
}

impl RankIds {
    pub fn from_env(env: &RankEnv) -> RankIds {
        let first = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| env.get(*k).and_then(|v| v.trim().parse::<u32>().ok()))
        };
        const RANK_KEYS: [&str; 5] = [
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "PMIX_RANK",
            "SLURM_PROCID",
        ];
        let rank_source = RANK_KEYS
            .into_iter()
            .find(|k| env.get(*k).is_some_and(|v| v.trim().parse::<u32>().is_ok()));
        RankIds {
            rank: first(&RANK_KEYS),
            rank_source,
            local_rank: first(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]),
            world_size: first(&[
                "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE",
                "SLURM_NTASKS",
            ]),
            node_rank: first(&["GROUP_RANK", "NODE_RANK", "SLURM_NODEID"]),
            restart: first(&["TORCHELASTIC_RESTART_COUNT"]),
        }
    }
}
