//! Where the main thread's time went, from its own stack samples: the
//! model (the framework's forward and backward passes, loss, optimizer,
//! autograd), the data path (the loader's iterator, a dataset's
//! `__getitem__`, transforms, collate, decode), the training loop's own
//! code, or code without Python frames. A busy main thread without input
//! workers is batch preparation only when the samples say so: the same
//! thread busy with the model is the training loop's own work (on a
//! machine without a GPU, the model computed on the CPU).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::analysis::fold::FrameClass;
use crate::analysis::stacks::{FrameInfo, Sample, Stacks};
use crate::analysis::Analysis;
use crate::event::{Pid, Tid};
use crate::units::pct;

use super::thresholds as th;
use super::timeline::{Cause, Timeline};

/// What a sample of the main thread was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    Model,
    Data,
    /// Python code of neither: the loop's own statements (metrics,
    /// logging, `.item()`, a hand-written parameter update).
    Loop,
    /// Importing a module (a library imported lazily on first use, such
    /// as the compiler stack that PyTorch's first optimizer imports):
    /// start-up work wherever it happens.
    Import,
    /// No Python frame in the sample (interpreter start-up, garbage
    /// collection, a thread that runs no Python).
    NoPython,
}

/// Shares of the main thread's samples, weighted by what each recorded
/// sample stands for. `samples` is the weight they add up to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MainAccount {
    pub samples: u64,
    pub model_share: f64,
    pub data_share: f64,
    /// The part of `data_share` spent talking to worker processes
    /// (starting them, receiving their batches through `multiprocessing`):
    /// work the same loop without workers does not have.
    pub worker_handover_share: f64,
    pub loop_share: f64,
    pub import_share: f64,
    pub no_python_share: f64,
}

impl MainAccount {
    /// Enough samples to tell the shares apart from noise: see
    /// [`th::ACCOUNT_MIN_SAMPLES`].
    pub fn conclusive(&self) -> bool {
        self.samples >= th::ACCOUNT_MIN_SAMPLES
    }

    /// "the model (…) 81%, the data path (…) 3%, the loop's own code 12%,
    /// no Python frames 4% of 2248 stack samples" (imports only when seen).
    pub fn text(&self) -> String {
        let imports = if self.import_share > 0.0 {
            format!(", importing modules {}", pct(self.import_share))
        } else {
            String::new()
        };
        // Said when it rounds to a percent at least.
        let handover = if self.worker_handover_share >= 0.005 {
            format!(
                " (of which starting and talking to worker processes {})",
                pct(self.worker_handover_share)
            )
        } else {
            String::new()
        };
        format!(
            "the model (framework forward, backward, loss, optimizer) {}, the data path (loader, dataset `__getitem__`, transforms, collate, decode) {}{handover}, the loop's own code {}{imports}, no Python frames {} of {} stack samples",
            pct(self.model_share),
            pct(self.data_share),
            pct(self.loop_share),
            pct(self.no_python_share),
            self.samples
        )
    }
}

/// Directories of the framework's model code (as they appear in a Python
/// frame's file path).
const MODEL_DIRS: &[&str] = &[
    "/torch/nn/",
    "/torch/autograd/",
    "/torch/optim/",
    "/torch/amp/",
    "/torch/_dynamo/",
    "/torch/_functorch/",
    "/torch/_inductor/",
    "/torch/_higher_order_ops/",
];

/// Directories of data loading and preprocessing libraries.
const DATA_DIRS: &[&str] = &[
    "/torch/utils/data/",
    "/torchvision/transforms/",
    "/torchvision/datasets/",
    "/torchvision/io/",
    "/torchaudio/",
    "/PIL/",
    "/cv2/",
    "/albumentations/",
    "/datasets/",
    "/webdataset/",
    "/imageio/",
    "/decord/",
    "/tokenizers/",
];

/// Words in a function's own name that say it prepares data.
const DATA_WORDS: &[&str] = &[
    "collate",
    "decode",
    "augment",
    "preprocess",
    "transform",
    "tokeniz",
];

/// A function named for producing batches or images (`get_batch`,
/// `make_batch`, `load_image`, `read_img`): a verb of making or reading,
/// then the thing.
fn makes_input(lower: &str) -> bool {
    const VERBS: &[&str] = &[
        "get", "make", "next", "load", "build", "prepare", "fetch", "sample", "gen", "generate",
        "read", "create",
    ];
    const NOUNS: &[&str] = &["batch", "image", "img"];
    let parts: Vec<&str> = lower.split('_').filter(|p| !p.is_empty()).collect();
    parts
        .windows(2)
        .any(|w| VERBS.contains(&w[0]) && NOUNS.iter().any(|n| w[1].starts_with(n)))
}

/// What one Python frame shows, when it says.
fn frame_activity(f: &FrameInfo) -> Option<Activity> {
    if f.class != FrameClass::Python {
        return None;
    }
    let file = f.file.replace('\\', "/");
    let file = if file.starts_with('/') {
        file
    } else {
        format!("/{file}")
    };
    if MODEL_DIRS.iter().any(|d| file.contains(d)) || file.ends_with("/torch/functional.py") {
        return Some(Activity::Model);
    }
    let func = f.name.rsplit('.').next().unwrap_or(&f.name);
    if func == "backward" && file.ends_with("/torch/_tensor.py") {
        return Some(Activity::Model);
    }
    if DATA_DIRS.iter().any(|d| file.contains(d)) {
        return Some(Activity::Data);
    }
    // A dataset's item access: the framework's own containers are model
    // code (above), tensors index in C.
    if func == "__getitem__" || func == "__getitems__" {
        return Some(Activity::Data);
    }
    let lower = func.to_ascii_lowercase();
    if DATA_WORDS.iter().any(|w| lower.contains(w)) || makes_input(&lower) {
        return Some(Activity::Data);
    }
    if func == "forward" || func == "backward" || lower.ends_with("_forward") {
        return Some(Activity::Model);
    }
    None
}

/// A data-path sample inside `multiprocessing` (the standard library's or
/// `torch.multiprocessing`'s): the loader starting its workers, or taking
/// a batch off their queue and rebuilding its tensors from the shared
/// memory they passed (`rebuild_storage_fd` and the file-descriptor
/// hand-over behind it). Only a loader with workers does this.
fn talks_to_workers<'a>(mut frames: impl Iterator<Item = &'a FrameInfo>) -> bool {
    frames.any(|f| {
        f.class == FrameClass::Python && f.file.replace('\\', "/").contains("multiprocessing/")
    })
}

/// What a sample shows: an import anywhere in it, else its outermost
/// frame that says (a transform that calls `torch.nn.functional` is data;
/// a model's `ModuleList.__getitem__` is the model).
pub fn activity<'a>(frames: impl Iterator<Item = &'a FrameInfo>) -> Activity {
    let py: Vec<&FrameInfo> = frames.filter(|f| f.class == FrameClass::Python).collect();
    let py = || py.iter().copied();
    if py().any(FrameInfo::imports) {
        return Activity::Import;
    }
    if let Some(a) = py().find_map(frame_activity) {
        return a;
    }
    if py().next().is_some() {
        Activity::Loop
    } else {
        Activity::NoPython
    }
}

/// The account of the samples of `threads` that `keep` selects. Native
/// samples carry the Python frames of their instant; a thread whose native
/// samples have none (py-spy mode) is counted from py-spy's stacks.
pub fn account(
    st: &Stacks,
    threads: &BTreeSet<(Pid, Tid)>,
    keep: impl Fn(&Sample) -> bool,
) -> MainAccount {
    let mut w = [0u64; 5];
    let mut handover = 0u64;
    let mut add = |s: &Sample, act: Activity| {
        if act == Activity::Data && talks_to_workers(st.stack_frames(s.stack)) {
            handover += s.weight as u64;
        }
        let i = match act {
            Activity::Model => 0,
            Activity::Data => 1,
            Activity::Loop => 2,
            Activity::Import => 3,
            Activity::NoPython => 4,
        };
        w[i] += s.weight as u64;
    };
    let with_python: BTreeSet<(Pid, Tid)> = st
        .python_only
        .iter()
        .filter(|s| threads.contains(&(s.pid, s.tid)))
        .map(|s| (s.pid, s.tid))
        .collect();
    for s in &st.samples {
        if !threads.contains(&(s.pid, s.tid)) || with_python.contains(&(s.pid, s.tid)) || !keep(s) {
            continue;
        }
        add(s, activity(st.stack_frames(s.stack)));
    }
    for s in &st.python_only {
        if !with_python.contains(&(s.pid, s.tid)) || !keep(s) {
            continue;
        }
        add(s, activity(st.stack_frames(s.stack)));
    }
    let total: u64 = w.iter().sum();
    let share = |x: u64| {
        if total == 0 {
            0.0
        } else {
            x as f64 / total as f64
        }
    };
    MainAccount {
        samples: total,
        model_share: share(w[0]),
        data_share: share(w[1]),
        worker_handover_share: share(handover),
        loop_share: share(w[2]),
        import_share: share(w[3]),
        no_python_share: share(w[4]),
    }
}

/// The main threads of a timeline.
pub fn main_threads(tl: &Timeline) -> BTreeSet<(Pid, Tid)> {
    tl.mains.iter().map(|t| (t.pid, t.tid)).collect()
}

/// The account of the main threads over the bins `in_bin` selects.
pub fn main_account(a: &Analysis, tl: &Timeline, in_bin: impl Fn(usize) -> bool) -> MainAccount {
    account(&a.stacks, &main_threads(tl), |s| {
        tl.cause_bin_of(s.t).is_some_and(&in_bin)
    })
}

/// The account of the main threads over the training loop: from its first
/// bin to the shutdown (what the job did between start-up and exit,
/// whatever the cause of each bin).
pub fn loop_account(a: &Analysis, tl: &Timeline) -> MainAccount {
    main_account(a, tl, |i| i >= tl.loop_from && i < tl.shutdown_from)
}

/// A busy main thread without workers was taken for batch preparation:
/// when its samples in those bins show the data path less than the model
/// or the loop's own code, those bins are the training loop's own work
/// instead.
pub fn ground(a: &Analysis, tl: &mut Timeline) {
    if !tl.workers.is_empty() {
        return;
    }
    let acc = main_account(a, tl, |i| tl.cause[i] == Some(Cause::MainPreprocessing));
    if acc.conclusive() && acc.data_share < acc.model_share.max(acc.loop_share) {
        for c in tl.cause.iter_mut() {
            if *c == Some(Cause::MainPreprocessing) {
                *c = Some(Cause::TrainingLoop);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(name: &str, file: &str) -> FrameInfo {
        FrameInfo {
            label: format!("{name} ({file})"),
            class: FrameClass::Python,
            name: name.into(),
            file: file.into(),
            eval: false,
            line: None,
        }
    }

    fn native(name: &str) -> FrameInfo {
        FrameInfo {
            label: name.into(),
            class: FrameClass::Native,
            name: name.into(),
            file: "/usr/lib/libtorch_cpu.so".into(),
            eval: false,
            line: None,
        }
    }

    const SITE: &str = "/venv/lib/python3.11/site-packages";

    #[test]
    fn outermost_frame_that_says_decides() {
        let train = py("train", "/home/u/train.py");
        let next = py(
            "_BaseDataLoaderIter.__next__",
            &format!("{SITE}/torch/utils/data/dataloader.py"),
        );
        let interp = py("interpolate", &format!("{SITE}/torch/nn/functional.py"));
        let call = py(
            "Module._call_impl",
            &format!("{SITE}/torch/nn/modules/module.py"),
        );
        let getitem = py(
            "ModuleList.__getitem__",
            &format!("{SITE}/torch/nn/modules/container.py"),
        );
        // A transform that resizes with the framework is the data path.
        let s = [train.clone(), next, interp, native("at::native::upsample")];
        assert_eq!(activity(s.iter()), Activity::Data);
        // The model's own containers are the model.
        let s = [train.clone(), call, getitem];
        assert_eq!(activity(s.iter()), Activity::Model);
        // Python code of neither, and no Python at all.
        let s = [train, native("at::native::add_")];
        assert_eq!(activity(s.iter()), Activity::Loop);
        let s = [native("_start"), native("Py_RunMain")];
        assert_eq!(activity(s.iter()), Activity::NoPython);
    }

    #[test]
    fn receiving_from_workers_is_the_data_path_said_apart() {
        let train = py("fit", "/home/u/train.py");
        let next = py(
            "_BaseDataLoaderIter.__next__",
            &format!("{SITE}/torch/utils/data/dataloader.py"),
        );
        let get = py("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py");
        let rebuild = py(
            "rebuild_storage_fd",
            &format!("{SITE}/torch/multiprocessing/reductions.py"),
        );
        let fetch = py(
            "_MapDatasetFetcher.fetch",
            &format!("{SITE}/torch/utils/data/_utils/fetch.py"),
        );
        let received = [train.clone(), next.clone(), get, native("load"), rebuild];
        let prepared = [
            train.clone(),
            next,
            fetch,
            py("Images.__getitem__", "/home/u/data.py"),
        ];
        assert_eq!(activity(received.iter()), Activity::Data);
        assert!(talks_to_workers(received.iter()));
        assert_eq!(activity(prepared.iter()), Activity::Data);
        assert!(!talks_to_workers(prepared.iter()));
        assert!(!talks_to_workers(
            [train, native("_PyEval_EvalFrameDefault")].iter()
        ));
    }

    #[test]
    fn a_lazy_import_is_not_the_model() {
        let script = py("<module>", "/home/u/train.py");
        let init = py("SGD.__init__", &format!("{SITE}/torch/optim/sgd.py"));
        let load = py("_find_and_load", "<frozen importlib._bootstrap>");
        let dynamo = py("<module>", &format!("{SITE}/torch/_dynamo/__init__.py"));
        let s = [script.clone(), init.clone(), load, dynamo];
        assert_eq!(activity(s.iter()), Activity::Import);
        // The script's own module body is not an import.
        assert_eq!(
            activity([script.clone(), init.clone()].iter()),
            Activity::Model
        );
        // Nor is it when a launcher runs it from its own (`runpy`, `exec`,
        // a notebook's cell under the kernel's `<module>`).
        let launcher = py("<module>", "/home/u/launch.py");
        let run_code = py("_run_code", "/usr/lib/python3.11/runpy.py");
        let s = [launcher, run_code, script, init];
        assert_eq!(activity(s.iter()), Activity::Model);
    }

    #[test]
    fn user_functions_by_their_names() {
        let train = py("train", "/home/u/train.py");
        let ds = py("MyImages.__getitem__", "/home/u/data.py");
        let aug = py("random_augment", "/home/u/aug.py");
        let fwd = py("Net.forward", "/home/u/model.py");
        let bwd = py("Tensor.backward", &format!("{SITE}/torch/_tensor.py"));
        assert_eq!(activity([train.clone(), ds].iter()), Activity::Data);
        assert_eq!(activity([train.clone(), aug].iter()), Activity::Data);
        assert_eq!(activity([train.clone(), fwd].iter()), Activity::Model);
        assert_eq!(activity([train.clone(), bwd].iter()), Activity::Model);
        for f in ["get_batch", "make_batch", "load_images", "read_img"] {
            let s = [train.clone(), py(f, "/home/u/train.py")];
            assert_eq!(activity(s.iter()), Activity::Data, "{f}");
        }
        for f in ["train_batch", "batch_norm", "log_images"] {
            let s = [train.clone(), py(f, "/home/u/train.py")];
            assert_eq!(activity(s.iter()), Activity::Loop, "{f}");
        }
    }
}
