//! The types of the merged `report.json` (`gpuprof merge`): its own
//! top level and per-recording entries, with the finding of a single-run
//! report (plus the node it came from). `docs/merged-report.schema.json`
//! is generated from them; the compatibility rule and `schema_version` are
//! those of [`crate::export::report_schema`].

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::export::report_schema::Finding;

/// How the recordings were put on one clock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MergedClock {
    pub uncertainty_s: Option<f64>,
    pub uncertainty: String,
    /// The placement methods used (`reference`, `same_boot`, ...).
    pub methods: Vec<String>,
}

/// How one recording was placed on the merged axis.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeClock {
    pub method: String,
    pub method_text: String,
    pub uncertainty_s: Option<f64>,
    pub matched_boundaries: u64,
    /// Signed nanoseconds, as a string (may exceed 2^53).
    pub offset_ns: String,
    pub boot_id: Option<String>,
    pub sync: Option<Value>,
    pub anchor_error_ns: u64,
    pub wall_clock_drift_during_run_ns: Option<i64>,
}

/// One merged recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MergedNode {
    pub path: String,
    pub label: String,
    pub host: String,
    pub rank: Option<String>,
    pub rank_env: BTreeMap<String, String>,
    pub gpuprof_version: String,
    pub recording_version: u32,
    pub command: Vec<String>,
    pub complete: bool,
    pub warnings: Vec<String>,
    pub start_s: f64,
    pub duration_s: f64,
    pub processes: u64,
    pub gpus: u64,
    pub ranks: Vec<u32>,
    pub clock: NodeClock,
    pub collective_boundaries: u64,
    pub findings: u64,
}

/// An input left out, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SkippedInput {
    pub path: String,
    pub reason: String,
}

/// A finding of the merged report: the node's label (`host`; null for a
/// finding across all of them) beside a single-run finding's fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MergedFinding {
    pub host: Option<String>,
    #[serde(flatten)]
    pub finding: Finding,
}

/// The merged `report.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "gpuprof merged report.json")]
pub struct MergedReport {
    pub schema_version: u32,
    /// Always `merge`.
    pub kind: String,
    pub gpuprof_version: String,
    pub start_time: Option<String>,
    pub duration_s: f64,
    pub clock: MergedClock,
    pub recorded_by_versions: Vec<String>,
    pub nodes: Vec<MergedNode>,
    pub skipped: Vec<SkippedInput>,
    /// Per-rank figures across all recordings (open-ended).
    pub ranks: Value,
    pub findings: Vec<MergedFinding>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::report_schema::{check_shipped_schema, schema_text};

    #[test]
    fn shipped_merged_report_schema_is_current() {
        check_shipped_schema("merged-report.schema.json", &schema_text::<MergedReport>());
    }
}
