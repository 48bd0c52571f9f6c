//! Placeholders in `-o DIR`, so that every node and rank of a distributed
//! job can write into one shared folder with one command line:
//! `srun gpuprof -o /shared/prof/{job}/{host}-{rank} -- python train.py`.
//!
//! Values come from gpuprof's own environment (the launcher's variables,
//! the same as [`crate::event::RANK_ENV_KEYS`]) and the host. A placeholder
//! whose value is unknown is an error before the job starts: silently
//! writing every rank into the same folder would lose all but one.

use std::collections::BTreeMap;

/// Each placeholder, the variables it reads (first set wins), and what it
/// means, for the documentation and the error messages.
pub const PLACEHOLDERS: &[(&str, &[&str], &str)] = &[
    ("host", &[], "short host name"),
    (
        "rank",
        &[
            "RANK",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "PMIX_RANK",
            "SLURM_PROCID",
        ],
        "global rank (or Slurm task id)",
    ),
    (
        "local_rank",
        &["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"],
        "rank on this node",
    ),
    (
        "node",
        &["GROUP_RANK", "NODE_RANK", "SLURM_NODEID"],
        "node index",
    ),
    ("job", &["SLURM_JOB_ID"], "Slurm job id"),
    ("step", &["SLURM_STEP_ID"], "Slurm step id"),
    ("time", &[], "start time, YYYYmmdd-HHMMSS"),
    ("pid", &[], "gpuprof's process id"),
];

/// Values available for expansion, by placeholder name.
#[derive(Clone, Debug, Default)]
pub struct Values(pub BTreeMap<String, String>);

impl Values {
    /// From gpuprof's environment, host name and clock.
    pub fn current(host: &str) -> Values {
        let mut v = BTreeMap::new();
        for (name, keys, _) in PLACEHOLDERS {
            if let Some(val) = keys
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|s| !s.trim().is_empty()))
            {
                v.insert(name.to_string(), val.trim().to_string());
            }
        }
        v.insert("host".into(), host.to_string());
        v.insert(
            "time".into(),
            chrono::Local::now().format("%Y%m%d-%H%M%S").to_string(),
        );
        v.insert("pid".into(), std::process::id().to_string());
        Values(v)
    }
}

/// Whether `s` holds a placeholder at all.
pub fn has_placeholders(s: &str) -> bool {
    s.contains('{')
}

/// Replace every `{name}` in `template`; `{{` and `}}` stand for braces.
/// Errors name the placeholder and how to fix it.
pub fn expand(template: &str, values: &Values) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let c = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&c) {
            out.push(c as char);
            rest = &after[1..];
            continue;
        }
        if c == b'}' {
            return Err(format!(
                "-o {template}: unmatched `}}` (write `}}}}` for a literal brace)"
            ));
        }
        let Some(end) = after.find('}') else {
            return Err(format!(
                "-o {template}: unclosed `{{` (write `{{{{` for a literal brace)"
            ));
        };
        let name = &after[..end];
        let Some((_, keys, _)) = PLACEHOLDERS.iter().find(|p| p.0 == name) else {
            let known: Vec<String> = PLACEHOLDERS
                .iter()
                .map(|p| format!("{{{}}}", p.0))
                .collect();
            return Err(format!(
                "-o {template}: unknown placeholder {{{name}}}; use {}",
                known.join(", ")
            ));
        };
        match values.0.get(name) {
            Some(v) => out.push_str(&sanitize(v)),
            None => {
                return Err(format!(
                    "-o {template}: {{{name}}} is unknown here: none of {} is set in gpuprof's environment (start gpuprof under the launcher, e.g. `srun gpuprof -o … -- CMD`, or leave {{{name}}} out)",
                    keys.join(", ")
                ))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A value becomes one path component: separators and control characters
/// are replaced, so `{host}` cannot climb out of the folder.
pub(crate) fn sanitize(v: &str) -> String {
    let s: String = v
        .chars()
        .map(|c| {
            if c == '/' || c == '\0' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if s == "." || s == ".." {
        s.replace('.', "_")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(kv: &[(&str, &str)]) -> Values {
        Values(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn placeholders_expand_from_the_launchers_variables() {
        let v = vals(&[("host", "gpu-07"), ("rank", "13"), ("job", "4242")]);
        assert_eq!(
            expand("/shared/{job}/{host}-rank{rank}", &v).unwrap(),
            "/shared/4242/gpu-07-rank13"
        );
        assert_eq!(expand("plain/dir", &v).unwrap(), "plain/dir");
        assert_eq!(expand("a{{b}}c", &v).unwrap(), "a{b}c");
    }

    #[test]
    fn unknown_or_unset_placeholders_are_explained() {
        let v = vals(&[("host", "h")]);
        let e = expand("out-{rank}", &v).unwrap_err();
        assert!(e.contains("RANK") && e.contains("SLURM_PROCID"), "{e}");
        let e = expand("out-{nodes}", &v).unwrap_err();
        assert!(
            e.contains("unknown placeholder {nodes}") && e.contains("{node}"),
            "{e}"
        );
        assert!(expand("out-{host", &v).unwrap_err().contains("unclosed"));
        assert!(expand("out-}", &v).unwrap_err().contains("unmatched"));
    }

    #[test]
    fn values_cannot_add_path_components() {
        let v = vals(&[("host", "../../etc"), ("job", "..")]);
        assert_eq!(expand("o/{host}/{job}", &v).unwrap(), "o/.._.._etc/__");
    }
}
