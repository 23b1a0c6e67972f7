//! `volcano-runner render FILE [--config C] [-o yaml|json] [--now T]`: the dry run operators diff.
//!
//! Reads a SubmitJob (JSON, proto3 JSON mapping), decodes and validates it as a runner does, renders it
//! with the configuration and prints every object in apply order: YAML documents separated by `---`, or
//! one JSON `List`. Either output can be fed to `kubectl apply --dry-run=server -f -`. A job a runner
//! would refuse (it does not decode, it breaks a rule of [`crate::validate`], or the pipeline cannot
//! build it) is refused the same way, naming the field.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::CliError;
use crate::config::Config;
use crate::messages::{self, v1::SubmitJob};
use crate::pipeline::{self, DesiredJob};
use crate::validate;

#[derive(Debug, clap::Args)]
/// Arguments of `render`.
pub struct Args {
    /// A SubmitJob as JSON.
    pub file: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// The instant to render at (RFC 3339), so repeated runs print identical output; default: now.
    #[arg(long)]
    pub now: Option<jiff::Timestamp>,
}

/// How the objects are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// YAML documents separated by `---`, as `kubectl apply -f` reads them.
    Yaml,
    /// One JSON `List` with every object as an item.
    Json,
}

/// Renders the file and prints the objects; a job the pipeline refuses prints why and exits 1.
pub async fn run(args: Args, config: Option<&Path>) -> Result<ExitCode, CliError> {
    let config = load_config(config)?;
    let bytes = std::fs::read(&args.file)
        .map_err(|e| CliError::Other(format!("{}: {e}", args.file.display())))?;
    let job: SubmitJob = messages::decode(messages::Format::Json, &bytes)
        .map_err(|e| CliError::Other(format!("{}: not a SubmitJob: {e}", args.file.display())))?;
    if let Err(e) = validate::submit(&job, &config) {
        eprintln!("{}: {e}", args.file.display());
        return Ok(ExitCode::FAILURE);
    }
    let now = args.now.unwrap_or_else(jiff::Timestamp::now);
    match pipeline::render(&job, &config, now) {
        Ok(desired) => {
            print!("{}", format(&desired, args.output)?);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{}: {e}", args.file.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The configuration as every command loads it (the file, then the `VOLCANO_RUNNER_*` variables, every
/// section checked): a dry run renders exactly what the runner would create.
pub fn load_config(path: Option<&Path>) -> Result<Config, CliError> {
    Ok(Config::load(path)?)
}

/// Every object of `desired` in apply order, printed as `format`.
pub fn format(desired: &DesiredJob, format: Format) -> Result<String, CliError> {
    let objects = desired.objects();
    let fail =
        |e: &dyn std::fmt::Display| CliError::Other(format!("cannot print the objects: {e}"));
    match format {
        Format::Yaml => {
            let mut out = String::new();
            for object in &objects {
                out.push_str("---\n");
                out.push_str(&serde_yaml_ng::to_string(object).map_err(|e| fail(&e))?);
            }
            Ok(out)
        }
        Format::Json => {
            let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": objects });
            let mut out = serde_json::to_string_pretty(&list).map_err(|e| fail(&e))?;
            out.push('\n');
            Ok(out)
        }
    }
}
