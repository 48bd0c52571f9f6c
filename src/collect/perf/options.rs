//! The sampling settings (`--frequency`, `--stack-size`,
//! `--python-frames`, `--hang-after`, `--sampler`) and their checks.

use std::path::PathBuf;
use std::time::Duration;

use super::{DEFAULT_FREQUENCY, DEFAULT_STACK_SIZE, MAX_FREQUENCY};

#[derive(Clone, Debug)]
pub struct PerfOptions {
    /// Samples per second per thread (1..=1000).
    pub frequency: u64,
    /// Bytes of user stack copied per sample (8..=65528, a multiple of 8).
    pub stack_size: u32,
    /// Where Python processes' Python frames come from
    /// (`--python-frames`).
    pub python_frames: PythonFrames,
    /// `--hang-after`: write a hang report when every loop thread has been
    /// blocked this long (None: off).
    pub hang_after: Option<Duration>,
    /// Where hang reports go (the output folder), set when recording.
    pub hang_dir: Option<PathBuf>,
    /// Which native sampler (`--sampler`).
    pub sampler: SamplerChoice,
}

/// `--sampler`: who takes the native stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SamplerChoice {
    /// perf events where allowed, else the in-process timer sampler.
    #[default]
    Auto,
    /// perf events only: none where they are refused.
    Perf,
    /// The in-process timer sampler, even where perf is allowed.
    Timer,
}

/// `--python-frames`: how Python processes get Python frames in their
/// native stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PythonFrames {
    /// The frames of the same instant, from the in-process agent.
    #[default]
    SameInstant,
    /// No agent: py-spy alone, into a separate Python-only view.
    PySpy,
}

impl PerfOptions {
    /// Whether the in-process agent takes the Python frames of the same
    /// instant (`--python-frames same-instant`, the default).
    pub fn same_instant_python(&self) -> bool {
        self.python_frames == PythonFrames::SameInstant
    }
}

impl Default for PerfOptions {
    fn default() -> Self {
        PerfOptions {
            frequency: DEFAULT_FREQUENCY,
            stack_size: DEFAULT_STACK_SIZE,
            python_frames: PythonFrames::SameInstant,
            hang_after: None,
            hang_dir: None,
            sampler: SamplerChoice::Auto,
        }
    }
}

impl PerfOptions {
    /// Check the settings; the message says what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if self.frequency == 0 || self.frequency > MAX_FREQUENCY {
            return Err(format!(
                "--frequency {} is out of range: use 1 to {MAX_FREQUENCY} samples per second (default {DEFAULT_FREQUENCY})",
                self.frequency
            ));
        }
        if self.stack_size < 1024 || self.stack_size > 65528 || self.stack_size % 8 != 0 {
            return Err(format!(
                "--stack-size {} is out of range: use a multiple of 8 bytes from 1024 to 65528 (default {DEFAULT_STACK_SIZE})",
                self.stack_size
            ));
        }
        Ok(())
    }
}
