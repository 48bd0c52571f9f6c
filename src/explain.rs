//! `gpuprof explain ID`: the documentation of each finding, from the binary
//! itself (like `rustc --explain`), so it is there wherever gpuprof is
//! installed — from a wheel, on a cluster node with no checkout of this
//! repository. The text is `docs/findings.md`, embedded at build time: one
//! `## id` section per finding.

use crate::diagnose::FindingKind;

/// `docs/findings.md` as it was when this binary was built.
pub const FINDINGS_MD: &str = include_str!("../docs/findings.md");

/// The section of `docs/findings.md` headed `## id`, heading included, up to
/// the next `## ` heading; None when there is none.
pub fn section(id: &str) -> Option<&'static str> {
    let mut start = None;
    let mut pos = 0;
    for line in FINDINGS_MD.split_inclusive('\n') {
        let heading = line.trim_end().strip_prefix("## ");
        match (start, heading) {
            (None, Some(h)) if h == id => start = Some(pos),
            (Some(s), Some(_)) => return Some(FINDINGS_MD[s..pos].trim_end()),
            _ => {}
        }
        pos += line.len();
    }
    start.map(|s| FINDINGS_MD[s..].trim_end())
}

/// The first sentence of the finding's `**What:**` paragraph.
pub fn what(kind: FindingKind) -> Option<String> {
    let text = section(kind.id())?;
    let para = text.split("\n\n").find(|p| p.starts_with("**What:**"))?;
    let para = para["**What:**".len()..].split_whitespace();
    let joined = para.collect::<Vec<_>>().join(" ");
    let end = joined.find(". ").map(|i| i + 1).unwrap_or(joined.len());
    Some(joined[..end].replace('`', ""))
}

/// Every finding id with what it means, one a line.
pub fn list() -> String {
    let width = FindingKind::ALL
        .iter()
        .map(|k| k.id().len())
        .max()
        .unwrap_or(0);
    let mut s = String::from("Findings (gpuprof explain ID prints one):\n");
    for k in FindingKind::ALL {
        s.push_str(&format!(
            "  {:width$}  {}\n",
            k.id(),
            what(k).unwrap_or_default()
        ));
    }
    s
}

/// What `gpuprof explain [ID]` prints, or the error for an unknown id.
pub fn explain(id: Option<&str>) -> Result<String, String> {
    let Some(id) = id else {
        return Ok(list());
    };
    let id = id.trim().trim_start_matches('#');
    match FindingKind::from_id(id).and_then(|k| section(k.id())) {
        Some(text) => Ok(format!("{text}\n")),
        None => {
            let ids: Vec<&str> = FindingKind::ALL.iter().map(|k| k.id()).collect();
            Err(format!(
                "no finding `{id}`: use one of {} (`gpuprof explain` lists them with what each means)",
                ids.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles only while it names every variant: a new finding must be
    /// added here, and then to `FindingKind::ALL` (checked below), so the
    /// documentation tests cover it.
    fn listed(k: FindingKind) -> bool {
        use FindingKind::*;
        match k {
            CudaDriverMismatch
            | GpuNotUsed
            | ThermalThrottling
            | PowerCapped
            | IoBound
            | SlowStorage
            | MainProcessPreprocessing
            | TooFewWorkers
            | InputPipelineBound
            | CpuOversubscribed
            | OtherProgramsCpu
            | GpuMemoryPressure
            | PcieDegraded
            | StragglerRank
            | GilContention
            | CpuLimit
            | HostMemoryPressure
            | WorkerRestarts
            | WriteStall
            | TrainingLoop
            | Compilation
            | GpuIdleUnexplained
            | LowSampleCoverage => FindingKind::ALL.contains(&k),
        }
    }

    #[test]
    fn every_finding_is_documented_in_the_binary() {
        for k in FindingKind::ALL {
            assert!(listed(k));
            let text = section(k.id())
                .unwrap_or_else(|| panic!("docs/findings.md has no `## {}` section", k.id()));
            assert!(text.starts_with(&format!("## {}\n", k.id())));
            assert!(!text[3..].contains("\n## "), "{text}");
            for part in ["**What:**", "**Fix:**"] {
                assert!(
                    text.contains(part),
                    "the section of {} has no {part}",
                    k.id()
                );
            }
            let w = what(k).unwrap();
            assert!(w.len() > 10 && w.ends_with('.'), "{}: {w}", k.id());
        }
    }

    #[test]
    fn sections_end_at_the_next_heading() {
        let a = section("io-bound").unwrap();
        assert!(a.contains("D state"));
        assert!(!a.contains("## slow-storage"));
        let last = section("low-sample-coverage").unwrap();
        assert!(!last.contains("gpuprof doctor"));
        assert_eq!(section("no-such-thing"), None);
    }

    #[test]
    fn explain_lists_prints_and_refuses() {
        let l = explain(None).unwrap();
        for k in FindingKind::ALL {
            assert!(l.contains(&format!("  {} ", k.id())), "{l}");
        }
        assert!(explain(Some("thermal-throttling"))
            .unwrap()
            .contains("clock-event reasons"));
        let e = explain(Some("gpu-is-slow")).unwrap_err();
        assert!(e.contains("gpu-is-slow") && e.contains("io-bound"), "{e}");
        assert!(!e.contains('\n'));
        // Headings that are not findings are not findings.
        assert!(explain(Some("gpuprof doctor")).is_err());
    }
}
