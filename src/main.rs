use std::process::ExitCode;

use clap::Parser;
use gpuprof::cli::{Cli, Command};

/// The system allocator with an emergency reserve under a memory limit:
/// gpuprof degrades rather than aborts (see `collect::memory`).
#[global_allocator]
static ALLOC: gpuprof::collect::memory::Guarded = gpuprof::collect::memory::Guarded;

fn main() -> ExitCode {
    gpuprof::collect::memory::arm();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Report(r)) => report(r),
        Some(Command::Record(args)) => record(args),
        Some(Command::Doctor(args)) => doctor(args),
        Some(Command::Compare(args)) => compare(args),
        Some(Command::Attach(args)) => args
            .into_config()
            .map_err(anyhow::Error::msg)
            .and_then(gpuprof::attach::attach),
        Some(Command::Explain(args)) => explain(args),
        Some(Command::Merge(args)) => merge(args),
        Some(Command::Dump(args)) => dump(args),
        None => record(cli.record),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("gpuprof: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn record(args: gpuprof::cli::RecordArgs) -> anyhow::Result<i32> {
    let cfg = args.into_config().map_err(anyhow::Error::msg)?;
    gpuprof::session::record(cfg)
}

fn report(args: gpuprof::cli::ReportArgs) -> anyhow::Result<i32> {
    let out = args.output.clone().unwrap_or_else(|| {
        // Given `DIR/recording`, write beside it in DIR.
        if args
            .dir
            .file_name()
            .is_some_and(|n| n == gpuprof::record::RECORDING_DIR)
        {
            args.dir
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_else(|| args.dir.clone())
        } else {
            args.dir.clone()
        }
    });
    let mut outputs = args.outputs.to_options().map_err(anyhow::Error::msg)?;
    outputs.flame = args.flame;
    outputs.step_range = args.step_range.clone().filter(|s| !s.trim().is_empty());
    // The recording first: a wrong DIR must not create an output folder.
    let events = gpuprof::record::events_path(&args.dir)?;
    // A folder that holds another run's recording holds that run's
    // outputs: rebuilding this recording there would replace them.
    if let Ok(theirs) = gpuprof::record::events_path(&out) {
        let same = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if same(&theirs) != same(&events) {
            anyhow::bail!(
                "{} holds another run's recording, whose outputs the report would replace: choose another folder with -o DIR",
                out.display()
            );
        }
    }
    let (dir, _) = gpuprof::outdir::OutDir::open(&out, true)?;
    let outcome = gpuprof::outputs::generate(
        &args.dir,
        &dir,
        &gpuprof::outputs::GenerateOptions {
            outputs,
            ..Default::default()
        },
    )?;
    if outcome.superseded {
        eprintln!(
            "gpuprof: the recording session ended while this report was being built: its final outputs in {} were kept, nothing was written",
            out.display()
        );
        return Ok(0);
    }
    if !args.quiet {
        eprint!("{}", outcome.terminal_summary);
    }
    if !outcome.missing.is_empty() {
        for (f, e) in &outcome.missing {
            eprintln!("gpuprof: error: {f} could not be written: {e}");
        }
        return Ok(1);
    }
    if !args.quiet {
        eprintln!("gpuprof: outputs written to {}", out.display());
    }
    Ok(0)
}

fn doctor(args: gpuprof::cli::DoctorArgs) -> anyhow::Result<i32> {
    let opts = gpuprof::doctor::DoctorOptions {
        data: args.data,
        python: args.python,
    };
    let checks = gpuprof::doctor::run(&opts)?;
    print!("{}", gpuprof::doctor::render(&checks));
    let problem = checks
        .iter()
        .any(|c| c.status == gpuprof::doctor::Status::Problem);
    Ok(if problem { 1 } else { 0 })
}

fn compare(args: gpuprof::cli::CompareArgs) -> anyhow::Result<i32> {
    let opts = args.into_options();
    let c = gpuprof::compare::run(&opts)?;
    if opts.markdown {
        print!("{}", c.markdown());
    } else {
        print!("{}", c.terminal());
    }
    Ok(0)
}

fn explain(args: gpuprof::cli::ExplainArgs) -> anyhow::Result<i32> {
    let text = gpuprof::explain::explain(args.id.as_deref()).map_err(anyhow::Error::msg)?;
    print!("{text}");
    Ok(0)
}

fn dump(args: gpuprof::cli::DumpArgs) -> anyhow::Result<i32> {
    let text = gpuprof::collect::perf::dump(
        gpuprof::event::Pid(args.pid),
        gpuprof::collect::perf::DEFAULT_STACK_SIZE,
    )
    .map_err(anyhow::Error::msg)?;
    print!("{text}");
    Ok(0)
}

fn merge(args: gpuprof::cli::MergeArgs) -> anyhow::Result<i32> {
    let quiet = args.quiet;
    let opts = args.into_options().map_err(anyhow::Error::msg)?;
    let out = gpuprof::merge::run(&opts)?;
    for s in &out.skipped {
        eprintln!("gpuprof: left out {}: {}", s.path.display(), s.reason);
    }
    if !quiet {
        eprint!("{}", out.terminal_summary);
        eprintln!(
            "gpuprof: merged {} recording{} into {}",
            out.merged,
            if out.merged == 1 { "" } else { "s" },
            opts.output.display()
        );
    }
    Ok(if out.skipped.is_empty() { 0 } else { 1 })
}
