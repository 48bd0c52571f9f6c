//! The job's software and storage environment, from the recording: the
//! shared objects each process mapped (framework build, CUDA runtime), the
//! regular files it held open and the filesystem and device behind them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::event::{Event, MountInfo, OpenFile, Pid};

/// Filesystem types served over the network (or by a userspace daemon that
/// usually is): reads pay a round trip and share a link.
pub const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "ceph",
    "fuse.ceph",
    "glusterfs",
    "fuse.glusterfs",
    "lustre",
    "beegfs",
    "gpfs",
    "fuse.sshfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.goofys",
    "fuse.rclone",
    "fuse.blobfuse",
    "fuse.juicefs",
    "afs",
    "virtiofs",
];

pub fn is_network_fs(fs_type: &str) -> bool {
    NETWORK_FS.contains(&fs_type)
}

#[derive(Debug, Clone, Default)]
pub struct Environment {
    pub mounts: Vec<MountInfo>,
    /// Shared objects mapped, per process (union over the run).
    pub libraries: BTreeMap<Pid, BTreeSet<String>>,
    /// Regular files held open, per process (bounded by the collector).
    pub open_files: BTreeMap<Pid, Vec<OpenFile>>,
    /// Whether the recording had a `Libraries`/`Mounts` event at all (older
    /// recordings do not): absence of a library is only evidence if the
    /// maps were read.
    pub maps_recorded: bool,
    pub mounts_recorded: bool,
}

/// A CUDA runtime library mapped by the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CudaRuntime {
    pub pid: i32,
    pub path: String,
    /// (major, minor) when the file name carries it (`libcudart.so.12.4.127`
    /// gives 12.4, `libcudart.so.12` gives 12 with minor unknown).
    pub major: u32,
    pub minor: Option<u32>,
}

/// A deep-learning framework's native library mapped by the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Framework {
    pub pid: i32,
    pub name: &'static str,
    pub path: String,
}

/// Files of one filesystem that the job held open.
#[derive(Debug, Clone)]
pub struct FilesOnMount<'a> {
    pub mount: Option<&'a MountInfo>,
    pub dev: String,
    /// Distinct (pid, path) pairs (capped by the collector).
    pub files: usize,
    /// Their total size (when first seen).
    pub bytes: u64,
    pub example: String,
    pub pids: BTreeSet<Pid>,
}

/// File names of native libraries that identify a framework.
const FRAMEWORK_LIBS: &[(&str, &str)] = &[
    ("libtorch_cpu.so", "PyTorch"),
    ("libtorch.so", "PyTorch"),
    ("libtensorflow_framework.so", "TensorFlow"),
    ("xla_extension.so", "JAX"),
    ("libjax_common.so", "JAX"),
    ("libpaddle", "PaddlePaddle"),
];

/// File names that show CUDA support is loaded.
const CUDA_LIBS: &[&str] = &[
    "libcudart",
    "libcuda.so",
    "libtorch_cuda",
    "libcublas",
    "libcudnn",
    "libnccl",
    "libc10_cuda",
];

fn longest_prefix<'a>(cands: &[&'a MountInfo], path: &str) -> Option<&'a MountInfo> {
    cands
        .iter()
        .filter(|m| {
            let mp = m.mount_point.trim_end_matches('/');
            mp.is_empty() || path == mp || path.starts_with(&format!("{mp}/"))
        })
        .max_by_key(|m| m.mount_point.len())
        .copied()
}

/// Files that are not training data: source and bytecode, shared objects,
/// `.pth` path hooks, anything inside a Python installation or virtual
/// environment (site-packages, lib/pythonX.Y).
pub fn is_code_or_environment(path: &str) -> bool {
    let name = file_name(path);
    name.ends_with(".py")
        || name.ends_with(".pyc")
        || name.ends_with(".pth")
        || crate::vocab::files::is_shared_object(path)
        || path.contains("/site-packages/")
        || path.contains("/dist-packages/")
        || path.split('/').any(|c| {
            c.strip_prefix("python")
                .is_some_and(|v| v.starts_with(|ch: char| ch.is_ascii_digit()))
        }) && path.contains("/lib/")
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `libcudart.so.12.4.127` → (12, Some(4)); `libcudart-ab12cd.so.11.0` →
/// (11, Some(0)); `libcudart.so.12` → (12, None); `libcudart.so` → None.
pub fn cudart_version(path: &str) -> Option<(u32, Option<u32>)> {
    let name = file_name(path);
    if !name.starts_with("libcudart") {
        return None;
    }
    let (_, ver) = name.split_once(".so.")?;
    let mut parts = ver.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok());
    Some((major, minor))
}

impl Environment {
    pub fn event(&mut self, ev: &Event) {
        match ev {
            Event::Mounts { mounts, .. } => {
                self.mounts_recorded = true;
                self.mounts = mounts.clone();
            }
            Event::Libraries { pid, added, .. } => {
                self.maps_recorded = true;
                self.libraries
                    .entry(*pid)
                    .or_default()
                    .extend(added.iter().cloned());
            }
            Event::OpenFiles { pid, files, .. } => {
                self.open_files
                    .entry(*pid)
                    .or_default()
                    .extend(files.iter().cloned());
            }
            _ => {}
        }
    }

    /// The mount holding `f`: same device, else the longest mount point
    /// that prefixes the path.
    pub fn mount_of(&self, f: &OpenFile) -> Option<&MountInfo> {
        let by_dev: Vec<&MountInfo> = self.mounts.iter().filter(|m| m.dev == f.dev).collect();
        if let Some(m) = longest_prefix(&by_dev, &f.path).or_else(|| by_dev.first().copied()) {
            return Some(m);
        }
        let all: Vec<&MountInfo> = self.mounts.iter().collect();
        longest_prefix(&all, &f.path)
    }

    /// CUDA runtimes mapped by the job's processes, sorted.
    pub fn cuda_runtimes(&self) -> Vec<CudaRuntime> {
        let mut out = Vec::new();
        for (pid, libs) in &self.libraries {
            for l in libs {
                if let Some((major, minor)) = cudart_version(l) {
                    out.push(CudaRuntime {
                        pid: pid.0,
                        path: l.clone(),
                        major,
                        minor,
                    });
                }
            }
        }
        out
    }

    /// Whether any process of the job mapped a CUDA library (every CUDA
    /// user maps the driver's `libcuda.so`); None when maps were not read.
    pub fn cuda_mapped(&self) -> Option<bool> {
        if !self.maps_recorded {
            return None;
        }
        Some(self.libraries.values().any(|libs| {
            libs.iter()
                .any(|l| CUDA_LIBS.iter().any(|c| file_name(l).starts_with(c)))
        }))
    }

    /// Whether any process of the job mapped the NVIDIA driver's CUDA
    /// library (`libcuda.so`), which every use of a GPU through CUDA loads
    /// (frameworks load it lazily, at their first CUDA call); None when no
    /// libraries were recorded.
    pub fn cuda_driver_mapped(&self) -> Option<bool> {
        if !self.maps_recorded {
            return None;
        }
        Some(
            self.libraries
                .values()
                .any(|libs| libs.iter().any(|l| file_name(l).starts_with("libcuda.so"))),
        )
    }

    /// Frameworks mapped, and whether the same process mapped any CUDA
    /// library.
    pub fn frameworks(&self) -> Vec<(Framework, bool)> {
        let mut out = Vec::new();
        for (pid, libs) in &self.libraries {
            let cuda = libs
                .iter()
                .any(|l| CUDA_LIBS.iter().any(|c| file_name(l).starts_with(c)));
            let mut seen = BTreeSet::new();
            for l in libs {
                let name = file_name(l);
                for (needle, fw) in FRAMEWORK_LIBS {
                    if name.starts_with(needle) && seen.insert(*fw) {
                        out.push((
                            Framework {
                                pid: pid.0,
                                name: fw,
                                path: l.clone(),
                            },
                            cuda,
                        ));
                    }
                }
            }
        }
        out
    }

    /// The job's open files grouped by filesystem, only for `pids` (e.g. the
    /// input processes), skipping code and the Python installation (see
    /// [`is_code_or_environment`]).
    pub fn files_by_mount(&self, pids: &BTreeSet<Pid>) -> Vec<FilesOnMount<'_>> {
        let mut by_dev: BTreeMap<String, FilesOnMount<'_>> = BTreeMap::new();
        // A file several processes held open (every DataLoader worker opens
        // the dataset) counts once.
        let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
        for (pid, files) in &self.open_files {
            if !pids.contains(pid) {
                continue;
            }
            for f in files {
                if is_code_or_environment(&f.path) {
                    continue;
                }
                let e = by_dev.entry(f.dev.clone()).or_insert_with(|| FilesOnMount {
                    mount: self.mount_of(f),
                    dev: f.dev.clone(),
                    files: 0,
                    bytes: 0,
                    example: f.path.clone(),
                    pids: BTreeSet::new(),
                });
                e.pids.insert(*pid);
                if seen.insert((f.dev.as_str(), f.path.as_str())) {
                    e.files += 1;
                    e.bytes += f.size;
                }
            }
        }
        by_dev.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cudart_versions() {
        assert_eq!(
            cudart_version("/usr/local/cuda/lib64/libcudart.so.12.4.127"),
            Some((12, Some(4)))
        );
        assert_eq!(
            cudart_version("/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"),
            Some((12, None))
        );
        assert_eq!(
            cudart_version("/x/libcudart-d0da41ae.so.11.0"),
            Some((11, Some(0)))
        );
        assert_eq!(cudart_version("/x/libcudart.so"), None);
        assert_eq!(cudart_version("/x/libcuda.so.1"), None);
    }

    #[test]
    fn frameworks_and_mounts() {
        let mut env = Environment::default();
        env.event(&Event::Mounts {
            t: crate::event::MonoNs(0),
            mounts: vec![
                MountInfo {
                    mount_point: "/".into(),
                    fs_type: "ext4".into(),
                    dev: "8:1".into(),
                    ..Default::default()
                },
                MountInfo {
                    mount_point: "/data".into(),
                    fs_type: "nfs4".into(),
                    dev: "0:50".into(),
                    ..Default::default()
                },
            ],
        });
        env.event(&Event::Libraries {
            t: crate::event::MonoNs(0),
            pid: Pid(10),
            added: vec!["/venv/torch/lib/libtorch_cpu.so".into()],
        });
        let fw = env.frameworks();
        assert_eq!(fw.len(), 1);
        assert_eq!(fw[0].0.name, "PyTorch");
        assert!(!fw[0].1, "no CUDA library mapped");
        let f = OpenFile {
            path: "/data/shard-0001.tar".into(),
            dev: "0:50".into(),
            size: 1 << 30,
        };
        assert_eq!(env.mount_of(&f).unwrap().fs_type, "nfs4");
        let f = OpenFile {
            path: "/home/u/x.bin".into(),
            dev: "9:9".into(),
            size: 0,
        };
        assert!(is_code_or_environment(
            "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/x.pth"
        ));
        assert!(is_code_or_environment(
            "/usr/lib/python3.11/encodings/x.bin"
        ));
        assert!(!is_code_or_environment("/data/imagenet/train/n01/x.JPEG"));
        assert_eq!(env.mount_of(&f).unwrap().mount_point, "/");
    }
}
